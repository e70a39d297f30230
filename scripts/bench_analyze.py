"""Speed and peak memory of the trace analyzer on a large trace.

Builds a large trace from a small real one (its events repeated, each copy shifted in time past
the one before, with fresh correlation and flow ids), writes it as plain JSON, then runs each
contender in a fresh process and prints seconds, MB/s and peak RSS (the child's ru_maxrss):

  analyzer   python -m common.analyze BIG --json        (this project: orjson + numpy)
  json       json.load + Python loops (kernel union)   (the naive way, for scale)
  hta        Holistic Trace Analysis: load + temporal breakdown, with --hta-python: a Python
             that has HolisticTraceAnalysis installed (keep it out of this project's .venv, e.g.
             python3 -m venv /tmp/hta && /tmp/hta/bin/pip install HolisticTraceAnalysis)

Examples:
  .venv/bin/python scripts/bench_analyze.py                      newest trace under traces/
  .venv/bin/python scripts/bench_analyze.py --synthetic-seed --hta-python /tmp/hta/bin/python
  .venv/bin/python scripts/bench_analyze.py SEED.pt.trace.json.gz --target-mb 135
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from common import trace  # noqa: E402

DEFAULT_TARGET_MB = 135.0  # the benchmark size (a long GPU training trace)
DEFAULT_REPEATS = 3  # runs per contender; the fastest is quoted (the others met more noise)
COPY_GAP_US = 1000.0  # between one copy of the seed's events and the next
CHILD_TIMEOUT_S = 600

# Each contender runs under this wrapper, alone, so that RUSAGE_CHILDREN's ru_maxrss (KiB on
# Linux) is the peak resident memory of that one process.
MEASURE = """
import json, resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
seconds = time.perf_counter() - started
peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": done.returncode, "seconds": seconds, "peak_mb": peak_kib / 1024,
                  "stderr": done.stderr[-2000:]}))
"""

# The naive way: json.load and a Python loop over the events (kernel union by sort and sweep).
JSON_BASELINE = """
import json, sys
with open(sys.argv[1]) as f:
    events = json.load(f)["traceEvents"]
spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
               if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel")
busy, start, end = 0.0, None, None
for s, e in spans:
    if end is None or s > end:
        busy += 0.0 if end is None else end - start
        start, end = s, e
    else:
        end = max(end, e)
busy += 0.0 if end is None else end - start
print(busy)
"""

# Holistic Trace Analysis: load the trace folder and compute its temporal breakdown.
HTA_SNIPPET = """
import sys
from hta.trace_analysis import TraceAnalysis
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
print(analyzer.get_temporal_breakdown(visualize=False))
"""


def default_seed() -> Path | None:
    """The newest trace under traces/ (a GPU reference trace first, where there is one)."""
    for pattern in ("reference/*/*/bad/*", "*/bad/*", "**/*"):
        found = [p for p in (ROOT / "traces").glob(pattern)
                 if p.is_file() and p.name.endswith(trace.TRACE_SUFFIXES)]
        if found:
            return max(found, key=lambda p: p.stat().st_mtime)
    return None


# The synthetic seed: a ResNet-like step of SEED_KERNELS_PER_STEP kernels, each launched from an
# operator nested in another (aten::conv2d > aten::cudnn_convolution), with the args Kineto writes
# (shapes, occupancy, grid) and a [memory] event per launch, so events are as dense as in a real
# GPU trace (about 400 bytes each).
SEED_STEPS = 3
SEED_FIRST_CORRELATION = 1_000_000  # CUPTI's ids are large numbers; HTA assumes they are
SEED_KERNELS_PER_STEP = 600
SEED_KERNEL_NAMES = ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize"
                     "128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_kernel",
                     "void at::native::vectorized_elementwise_kernel<4, at::native::"
                     "CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, "
                     "at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
                     "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>",
                     "ampere_sgemm_128x64_tn")


def synthetic_gpu_seed(path: Path) -> Path:
    """A GPU-shaped seed trace, for machines without a GPU trace (HTA needs GPU events)."""
    from tests.kineto_builder import KinetoTrace, simulate_training

    built = KinetoTrace()
    built.gpu()
    built.next_correlation = SEED_FIRST_CORRELATION
    simulate_training(built, steps=SEED_STEPS, kernels_per_step=SEED_KERNELS_PER_STEP,
                      kernel_us=40.0, launch_gap_us=30.0, dataloader_us=2000.0,
                      peak_memory_bytes=8 << 30)
    extra = []
    for index, event in enumerate(built.events):
        names = SEED_KERNEL_NAMES
        if event.get("cat") == "kernel":
            event["name"] = names[index % len(names)]
            event["args"].update({"queued": 0, "context": 1, "registers per thread": 72,
                                  "shared memory": 49152, "blocks per SM": 1.35,
                                  "warps per SM": 10.8, "grid": [108, 2, 1], "block": [256, 1, 1],
                                  "est. achieved occupancy %": 17, "External id": index})
        elif event.get("cat") == "cuda_runtime":
            event["args"].update({"External id": index, "cbid": 211})
            for depth, op in enumerate(("aten::conv2d", "aten::cudnn_convolution")):
                extra.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": event["pid"],
                              "tid": event["tid"], "ts": event["ts"] - 4 + 2 * depth,
                              "dur": event["dur"] + 8 - 4 * depth,
                              "args": {"External id": index, "Record function id": 0,
                                       "Sequence number": index, "Fwd thread id": 0,
                                       "Ev Idx": index, "Input Dims": [[64, 64, 56, 56],
                                                                       [64, 64, 3, 3], []],
                                       "Input type": ["float", "float", ""],
                                       "Input Strides": [[200704, 3136, 56, 1],
                                                         [576, 9, 3, 1], []],
                                       "Concrete Inputs": ["", "", ""]}})
            built.memory(event["ts"] + 1, (4 << 30) + index * 4096, 1)
    built.events.extend(extra)
    return built.write(path)


def shifted(events: list[dict], shift_us: float, id_offset: int) -> list[dict]:
    """The events moved later by shift_us, with correlation and flow ids made unique."""
    copies = []
    for event in events:
        if "ts" not in event or event.get("ph") == "M":
            continue
        copy = dict(event, ts=event["ts"] + shift_us)
        if "id" in event and isinstance(event["id"], int):
            copy["id"] = event["id"] + id_offset
        args = event.get("args")
        if isinstance(args, dict) and isinstance(args.get("correlation"), int):
            copy["args"] = dict(args, correlation=args["correlation"] + id_offset)
        copies.append(copy)
    return copies


def build_large_trace(seed: Path, target_mb: float, out: Path) -> tuple[int, int]:
    """Write seed's events repeated until the file reaches target_mb. Returns (copies, events).
    Streams one copy at a time, so building needs the memory of the seed, not of the result."""
    data = trace.load_trace(seed)
    events = data.pop("traceEvents")
    timed = [e for e in events if "ts" in e and e.get("ph") != "M"]
    metadata = [e for e in events if "ts" not in e or e.get("ph") == "M"]
    first = min(float(e["ts"]) for e in timed)
    last = max(float(e["ts"]) + float(e.get("dur", 0) or 0) for e in timed)
    period_us = last - first + COPY_GAP_US
    id_step = 1 + max([int(e["id"]) for e in timed if isinstance(e.get("id"), int)]
                      + [int(e["args"]["correlation"]) for e in timed
                         if isinstance((e.get("args") or {}).get("correlation"), int)] + [0])
    target_bytes = target_mb * 1024 * 1024
    written, copies, count = 0, 0, 0
    with open(out, "wb") as handle:
        head = orjson.dumps(data)[:-1] + b',"traceEvents":['  # the seed's other keys first
        handle.write(head)
        chunk = orjson.dumps(metadata)[1:-1]
        handle.write(chunk)
        written = len(head) + len(chunk)
        separator = b"," if metadata else b""
        while written < target_bytes:
            chunk = orjson.dumps(shifted(timed, copies * period_us, copies * id_step))[1:-1]
            handle.write(separator + chunk)
            written += len(chunk) + len(separator)
            separator = b","
            copies += 1
            count += len(timed)
        handle.write(b"]}")
    return copies, count + len(metadata)


def measure(command: list[str], repeats: int) -> dict:
    """Fastest of `repeats` runs and the highest peak RSS, each run in a fresh wrapper."""
    runs = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True,
                              text=True, cwd=ROOT, timeout=CHILD_TIMEOUT_S)
        result = json.loads(done.stdout)
        if result["rc"] != 0:
            raise RuntimeError(f"{command[:3]} failed: {result['stderr']}")
        runs.append(result)
    return {"seconds": min(r["seconds"] for r in runs), "peak_mb": max(r["peak_mb"] for r in runs),
            "all_seconds": [round(r["seconds"], 2) for r in runs]}



def main(argv: list[str] | None = None) -> int:
    parser = trace.OneLineArgumentParser(prog="scripts/bench_analyze.py", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seed", nargs="?", type=Path, help="a small real trace (default: the "
                        "newest under traces/, a GPU reference trace first)")
    parser.add_argument("--synthetic-seed", action="store_true",
                        help="use a GPU-shaped seed made by tests/kineto_builder.py instead (for "
                             "machines without a GPU trace; HTA needs GPU events)")
    parser.add_argument("--target-mb", type=float, default=DEFAULT_TARGET_MB,
                        help=f"size of the large trace in MiB (default: {DEFAULT_TARGET_MB:.0f})")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help=f"runs per contender, fastest quoted (default: {DEFAULT_REPEATS})")
    parser.add_argument("--hta-python", type=Path,
                        help="a python with HolisticTraceAnalysis installed: also time HTA")
    parser.add_argument("--no-json-baseline", action="store_true",
                        help="skip the json.load + Python loops baseline")
    parser.add_argument("--keep", type=Path, help="also keep the large trace at this path")
    flags = parser.parse_args(argv)
    if flags.target_mb <= 0 or flags.repeats < 1:
        parser.error("--target-mb and --repeats must be positive")
    with tempfile.TemporaryDirectory(prefix="bench_analyze_") as folder:
        big = Path(folder) / "big" / "bench.pt.trace.json"  # alone in its folder: HTA reads one
        big.parent.mkdir()
        seed = (synthetic_gpu_seed(Path(folder) / "seed.pt.trace.json") if flags.synthetic_seed
                else flags.seed or default_seed())
        if seed is None:
            parser.error("no trace under traces/: pass SEED, use --synthetic-seed, or run a demo "
                         "first (.venv/bin/python demos/dataloader_workers/bad.py)")
        try:
            trace.load_trace(seed)
        except trace.TraceError as error:
            parser.error(str(error))
        run(flags, seed, big)
    return 0


def run(flags: argparse.Namespace, seed: Path, big: Path) -> None:
    started = time.perf_counter()
    copies, count = build_large_trace(seed, flags.target_mb, big)
    size_mb = big.stat().st_size / (1024 * 1024)
    print(f"seed {seed}\nlarge trace: {size_mb:.0f} MiB, {count:,} events ({copies} copies of "
          f"the seed), built in {time.perf_counter() - started:.0f} s")
    contenders = {"analyzer": [sys.executable, "-m", "common.analyze", str(big), "--json"]}
    if not flags.no_json_baseline:
        contenders["json"] = [sys.executable, "-c", JSON_BASELINE, str(big)]
    if flags.hta_python:
        contenders["hta"] = [str(flags.hta_python), "-c", HTA_SNIPPET, str(big.parent)]
    results = {}
    for name, command in contenders.items():
        results[name] = r = measure(command, flags.repeats)
        print(f"{name:9} {r['seconds']:6.2f} s  {size_mb / r['seconds']:6.1f} MiB/s  peak RSS "
              f"{r['peak_mb']:5.0f} MiB   (runs: {', '.join(map(str, r['all_seconds']))} s)",
              flush=True)
    analyzer = results["analyzer"]
    for name in ("json", "hta"):
        if name in results:
            print(f"analyzer vs {name}: {results[name]['seconds'] / analyzer['seconds']:.1f}x "
                  f"faster, {analyzer['peak_mb'] / results[name]['peak_mb']:.2f}x the peak memory")
    if flags.keep:
        shutil.copyfile(big, flags.keep)

if __name__ == "__main__":
    sys.exit(main())
