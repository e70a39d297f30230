"""Speed and peak memory of the trace analyzer on a large real trace.

Builds a large trace from a real one (its events repeated, each copy shifted in time past the one
before, with fresh correlation, flow and External ids; the top-level keys kept where the seed has
them, before and after traceEvents), writes it gzip as a profiler would, then runs each contender
in a fresh process, the contenders in turn, --repeats rounds, and prints the median seconds and
peak RSS (the child's ru_maxrss, the whole process) of each:

  analyzer   python -m common.analyze BIG --json        (this project: msgspec + numpy)
  json       json.load + Python loops (kernel union)   (the naive way, for scale)
  hta        Holistic Trace Analysis: load + temporal breakdown, with --hta-python: a Python
             that has HolisticTraceAnalysis installed (keep it out of this project's .venv:
             python3 -m venv /tmp/hta_venv && /tmp/hta_venv/bin/pip install HolisticTraceAnalysis)

Examples:
  .venv/bin/python scripts/bench_analyze.py --hta-python /tmp/hta_venv/bin/python
  .venv/bin/python scripts/bench_analyze.py SEED.json.gz --target-mb 135 --repeats 2
  .venv/bin/python scripts/bench_analyze.py --synthetic-seed     (no real trace at hand)
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from common import trace  # noqa: E402

# The default seed: the largest of the shared real traces and the one most like the issue's
# (a V100 training run: 26 % cpu_op, 30 % ac2g flow events, [memory] instant events, and a key
# after traceEvents, "traceName", as current Kineto writes). 54 MB of JSON, 216k events.
SHARED_TRACES = ROOT.parent / "shared" / "traces"
DEFAULT_SEED = SHARED_TRACES / "v100_rank1_instant_events_5steps.json.gz"
DEFAULT_TARGET_MB = 135.0  # the benchmark size (a long GPU training trace), as JSON text
DEFAULT_REPEATS = 3  # rounds, each running every contender once; the median is quoted
COPY_GAP_US = 1000  # between one copy of the seed's events and the next
CHILD_TIMEOUT_S = 600
GZIP_LEVEL = 6  # what the large trace is written with; reading speed hardly depends on it

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
import gzip, json, sys
opener = gzip.open if sys.argv[1].endswith(".gz") else open
with opener(sys.argv[1], "rt") as f:
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

CONTENDER_LABELS = {
    "analyzer": "`python -m common.analyze --json`",
    "json": "`json.load` + Python loops (kernel union only)",
    "hta": "Holistic Trace Analysis: load + temporal breakdown",
}


def default_seed() -> Path | None:
    """DEFAULT_SEED where ../shared/traces has it, else the newest trace under traces/."""
    if DEFAULT_SEED.is_file():
        return DEFAULT_SEED
    for pattern in ("reference/h100/*/bad/*", "*/bad/*", "**/*"):
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


SHIFTED_ARGS = ("correlation", "External id")  # ids that must stay unique across copies


def step_number(name) -> int | None:
    """N of a "ProfilerStep#N" name, else None."""
    if isinstance(name, str) and name.startswith(trace.STEP_PREFIX):
        number = name[len(trace.STEP_PREFIX):]
        return int(number) if number.isdigit() else None
    return None


def shifted(events: list[dict], shift_us, id_offset: int, step_offset: int = 0) -> list[dict]:
    """The events moved later by shift_us, with flow, correlation and External ids made unique,
    and ProfilerStep#N numbered on by step_offset (a step number seen twice is an impossible
    event, which the analyzer leaves out)."""
    copies = []
    for event in events:
        copy = dict(event, ts=event["ts"] + shift_us)
        number = step_number(event.get("name"))
        if number is not None and step_offset:
            copy["name"] = f"{trace.STEP_PREFIX}{number + step_offset}"
        if isinstance(event.get("id"), int):
            copy["id"] = event["id"] + id_offset
        args = event.get("args")
        if isinstance(args, dict) and any(isinstance(args.get(k), int) for k in SHIFTED_ARGS):
            copy["args"] = dict(args, **{k: args[k] + id_offset for k in SHIFTED_ARGS
                                         if isinstance(args.get(k), int)})
        copies.append(copy)
    return copies


def is_timed(event: dict) -> bool:
    return isinstance(event.get("ts"), (int, float)) and event.get("ph") != "M"


def build_large_trace(seed: Path, target_mb: float, out: Path) -> dict:
    """Write seed's events repeated until the JSON text reaches target_mb (MiB): whole copies,
    then the part of one more copy that starts earliest in time. The seed's top-level keys keep
    their place before or after traceEvents; metadata events ("M") are written once; the copy
    period is a whole number of µs where the seed's times are integers, so they stay integers.
    gzip if `out` ends in .gz. Streams one copy at a time. Returns what was built."""
    data = trace.load_trace(seed)
    keys = list(data)
    position = keys.index("traceEvents")
    events = data["traceEvents"]
    before = {k: data[k] for k in keys[:position]}
    after = {k: data[k] for k in keys[position + 1:]}
    timed = [e for e in events if is_timed(e)]
    metadata = [e for e in events if not is_timed(e)]
    first = min(e["ts"] for e in timed)
    last = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    period = last - first + COPY_GAP_US
    if all(isinstance(e["ts"], int) for e in timed):
        period = math.ceil(period)
    id_step = 1 + max([e["id"] for e in timed if isinstance(e.get("id"), int)]
                      + [e["args"][k] for e in timed for k in SHIFTED_ARGS
                         if isinstance((e.get("args") or {}).get(k), int)] + [0])
    step_step = 1 + max([step_number(e.get("name")) or 0 for e in timed])
    target_bytes = target_mb * 1024 * 1024
    head = orjson.dumps(before)[:-1] + (b"," if before else b"") + b'"traceEvents":['
    tail = b"]" + (b"," + orjson.dumps(after)[1:] if after else b"}")
    opener = (lambda p: gzip.open(p, "wb", compresslevel=GZIP_LEVEL)) if out.suffix == ".gz" \
        else (lambda p: open(p, "wb"))
    written = copies = count = 0
    with opener(out) as handle:
        def write(chunk: bytes) -> None:
            nonlocal written
            handle.write(chunk)
            written += len(chunk)

        write(head)
        separator = b""
        if metadata:
            write(orjson.dumps(metadata)[1:-1])
            separator = b","
        while True:  # whole copies while they fit
            copy = shifted(timed, copies * period, copies * id_step, copies * step_step)
            chunk = separator + orjson.dumps(copy)[1:-1]
            if written + len(chunk) + len(tail) > target_bytes:
                break
            write(chunk)
            separator, copies, count = b",", copies + 1, count + len(timed)
        # The rest of the target: the events of one more copy that start earliest, in order.
        room, cutoff = target_bytes - written - len(tail), None
        for ts, size in sorted((e["ts"], len(orjson.dumps(e)) + 1) for e in copy):
            if room < size:
                cutoff = ts
                break
            room -= size
        part = [e for e in copy if cutoff is None or e["ts"] < cutoff]
        if part:
            write(separator + orjson.dumps(part)[1:-1])
            count += len(part)
        write(tail)
    return {"copies": copies, "partial_events": len(part), "events": count + len(metadata),
            "seed_events": len(events), "json_bytes": written,
            "scale": count / len(timed), "keys_after": list(after)}


def run_once(command: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True,
                          text=True, cwd=ROOT, timeout=CHILD_TIMEOUT_S)
    result = json.loads(done.stdout)
    if result["rc"] != 0:
        raise RuntimeError(f"{command[:3]} failed: {result['stderr']}")
    return result


def measure(contenders: dict[str, list[str]], repeats: int) -> dict[str, dict]:
    """Each contender once per round, in turn (so slow drifts of the machine hit all alike);
    the median seconds and median peak RSS over the rounds, and every run's seconds."""
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    for round_index in range(repeats):
        for name, command in contenders.items():
            result = run_once(command)
            runs[name].append(result)
            print(f"  round {round_index + 1}: {name:9} {result['seconds']:6.2f} s  "
                  f"{result['peak_mb']:5.0f} MiB", flush=True)
    return {name: {"seconds": statistics.median(r["seconds"] for r in found),
                   "peak_mb": statistics.median(r["peak_mb"] for r in found),
                   "all_seconds": [round(r["seconds"], 2) for r in found],
                   "all_peak_mb": [round(r["peak_mb"]) for r in found]}
            for name, found in runs.items()}


def module_version(python: str, module: str) -> str:
    code = (f"import importlib.metadata as m\ntry: print(m.version({module!r}))\n"
            f"except m.PackageNotFoundError: print('absent')")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def conditions(flags: argparse.Namespace) -> str:
    versions = ", ".join(f"{m} {module_version(sys.executable, m)}"
                         for m in ("msgspec", "isal", "orjson", "numpy"))
    if flags.hta_python:
        hta = str(flags.hta_python)
        versions += (f"; HolisticTraceAnalysis {module_version(hta, 'HolisticTraceAnalysis')}"
                     f" (pandas {module_version(hta, 'pandas')})")
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{cpu_name()}, {os.cpu_count()} cores, {memory_gib:.0f} GiB; Python "
            f"{platform.python_version()}; {versions}; load average before: {load}; "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")


def main(argv: list[str] | None = None) -> int:
    parser = trace.OneLineArgumentParser(prog="scripts/bench_analyze.py", description=__doc__,
                                         formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seed", nargs="?", type=Path, help="a real trace (default: "
                        f"{DEFAULT_SEED.relative_to(ROOT.parent)} beside this repository, else "
                        "the newest trace under traces/)")
    parser.add_argument("--synthetic-seed", action="store_true",
                        help="use a GPU-shaped seed made by tests/kineto_builder.py instead (for "
                             "machines without a GPU trace; HTA needs GPU events)")
    parser.add_argument("--target-mb", type=float, default=DEFAULT_TARGET_MB,
                        help=f"size of the large trace's JSON text in MiB, before gzip "
                             f"(default: {DEFAULT_TARGET_MB:.0f})")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help=f"rounds of runs, the median quoted (default: {DEFAULT_REPEATS})")
    parser.add_argument("--plain", action="store_true", help="write the large trace as plain "
                        "JSON, not gzip")
    parser.add_argument("--hta-python", type=Path,
                        help="a python with HolisticTraceAnalysis installed: also time HTA")
    parser.add_argument("--no-json-baseline", action="store_true",
                        help="skip the json.load + Python loops baseline")
    parser.add_argument("--keep", type=Path, help="also keep the large trace at this path")
    flags = parser.parse_args(argv)
    if flags.target_mb <= 0 or flags.repeats < 1:
        parser.error("--target-mb and --repeats must be positive")
    with tempfile.TemporaryDirectory(prefix="bench_analyze_") as folder:
        suffix = ".pt.trace.json" if flags.plain else ".pt.trace.json.gz"
        big = Path(folder) / "big" / f"bench{suffix}"  # alone in its folder: HTA reads them all
        big.parent.mkdir()
        seed = (synthetic_gpu_seed(Path(folder) / "seed.pt.trace.json") if flags.synthetic_seed
                else flags.seed or default_seed())
        if seed is None:
            parser.error(f"no seed: {DEFAULT_SEED} is missing and there is no trace under "
                         "traces/: pass SEED or use --synthetic-seed")
        try:
            trace.load_trace(seed)
        except trace.TraceError as error:
            parser.error(str(error))
        run(flags, seed, big)
    return 0


def run(flags: argparse.Namespace, seed: Path, big: Path) -> None:
    started = time.perf_counter()
    built = build_large_trace(seed, flags.target_mb, big)
    json_mb = built["json_bytes"] / 2**20
    print(f"seed {seed} ({built['seed_events']:,} events)\n"
          f"large trace: {json_mb:.0f} MiB of JSON ({big.stat().st_size / 2**20:.0f} MiB "
          f"{'gzip' if big.suffix == '.gz' else 'plain'}), {built['events']:,} events: the "
          f"seed's timed events x {built['scale']:.2f} ({built['copies']} copies and the "
          f"earliest {built['partial_events']:,} events of one more); keys after traceEvents: "
          f"{', '.join(built['keys_after']) or 'none'}; built in "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    contenders = {"analyzer": [sys.executable, "-m", "common.analyze", str(big), "--json"]}
    if not flags.no_json_baseline:
        contenders["json"] = [sys.executable, "-c", JSON_BASELINE, str(big)]
    if flags.hta_python:
        contenders["hta"] = [str(flags.hta_python), "-c", HTA_SNIPPET, str(big.parent)]
    results = measure(contenders, flags.repeats)
    print(f"\nmedian of {flags.repeats} interleaved runs, whole process:\n\n"
          "| reader | seconds | MiB/s | peak RSS |\n|---|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {CONTENDER_LABELS[name]} | {r['seconds']:.2f} | {json_mb / r['seconds']:.0f} "
              f"| {r['peak_mb']:.0f} MiB |")
    print()
    analyzer = results["analyzer"]
    for name in ("json", "hta"):
        if name in results:
            print(f"analyzer vs {name}: {results[name]['seconds'] / analyzer['seconds']:.1f}x "
                  f"faster, {analyzer['peak_mb'] / results[name]['peak_mb']:.2f}x the peak memory")
    print(f"analyzer peak RSS / JSON text: {analyzer['peak_mb'] / json_mb:.2f}")
    print("runs (s): " + "; ".join(f"{name} {r['all_seconds']}" for name, r in results.items()))
    print(f"conditions: {conditions(flags)}")
    if flags.keep:
        shutil.copyfile(big, flags.keep)


if __name__ == "__main__":
    sys.exit(main())
