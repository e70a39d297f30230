"""The profiling harness every demo shares.

setup() parses the common flags, picks the device and its size preset and returns a Run.
train() runs a training loop through measure(), which does, in order:
  warm-up -> a timed phase without the profiler (wall clock, device synchronised) -> a short
  profiled phase that writes a TensorBoard trace -> summary.json and key_averages.txt.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from torch.profiler import (ProfilerActivity, profile, record_function, schedule,
                            tensorboard_trace_handler)

from common import presets, trace

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "traces"

# Profiler schedule: skip a step, let the profiler warm up on one, record three. Few recorded
# steps keep a trace small enough for a browser; throughput comes from the timed phase.
PROFILE_WAIT_STEPS = 1
PROFILE_WARMUP_STEPS = 1
PROFILE_ACTIVE_STEPS = 3
PROGRESS_EVERY_S = 5.0  # seconds between progress lines in a long phase
KEY_AVERAGES_ROWS = 25  # rows of the operator table in key_averages.txt
# Kineto's log levels run VERBOSE 0 .. ERROR 4, USDT 5. On a machine with no GPU the CUDA build of
# Kineto logs "gpuGetDeviceCount failed" as an ERROR at every profile: harmless, but alarming.
KINETO_LOG_LEVEL_CPU = "5"
SUMMARY_FILE = "summary.json"
KEY_AVERAGES_FILE = "key_averages.txt"


@dataclass
class Run:
    demo: str
    variant: str
    device: torch.device
    device_name: str
    preset_name: str  # "cuda", "cpu" or "smoke"
    preset: presets.Preset
    steps: int
    seed: int
    out_dir: Path  # <out>/<demo>/<variant>: the trace, summary.json, key_averages.txt
    config: dict = field(default_factory=dict)  # what differs between bad and fixed

    @property
    def batch_size(self) -> int:
        return self.preset.batch_size

    @property
    def sizes(self) -> dict[str, int]:
        return self.preset.sizes

    @property
    def total_steps(self) -> int:
        """Every step the run takes: warm-up, timed and profiled."""
        return (self.preset.warmup_steps + self.steps + PROFILE_WAIT_STEPS + PROFILE_WARMUP_STEPS
                + PROFILE_ACTIVE_STEPS)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text}")
    return value


def build_parser(demo: str, variant: str) -> argparse.ArgumentParser:
    doc = getattr(sys.modules.get("__main__"), "__doc__", None)
    parser = argparse.ArgumentParser(
        prog=f"demos/{demo}/{variant}.py", description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Writes <out>/{demo}/{variant}/: a TensorBoard trace (.pt.trace.json.gz), "
               f"{SUMMARY_FILE} and {KEY_AVERAGES_FILE}.")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="where to train; auto picks cuda when PyTorch sees a GPU (default: auto)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes and few steps: finishes in seconds, for tests")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="timed steps (default: the preset's)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output root (default: {DEFAULT_OUT.relative_to(REPO_ROOT)}/)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    return parser


def pick_device(requested: str, parser: argparse.ArgumentParser) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: PyTorch sees no CUDA GPU here "
                     "(torch.cuda.is_available() is False); use --device cpu or auto")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:  # platform.processor() is empty on most Linux systems; /proc/cpuinfo names the CPU
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({presets.usable_cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({presets.usable_cpu_count()} cores)"


def setup(demo: str, variant: str, argv: list[str] | None = None) -> Run:
    """Parse the flags every demo takes, seed everything and pick the device and its preset."""
    parser = build_parser(demo, variant)
    flags = parser.parse_args(argv)
    device = pick_device(flags.device, parser)
    name = presets.preset_name(device.type, flags.smoke)
    preset = presets.PRESETS[demo][name]
    torch.set_num_threads(presets.main_process_threads(device.type))
    if device.type == "cpu":
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_LOG_LEVEL_CPU)
    random.seed(flags.seed)
    np.random.seed(flags.seed)
    torch.manual_seed(flags.seed)
    return Run(demo=demo, variant=variant, device=device, device_name=device_name(device),
               preset_name=name, preset=preset, steps=flags.steps or preset.steps,
               seed=flags.seed, out_dir=Path(flags.out) / demo / variant)


def log(run: Run, message: str) -> None:
    print(f"[{run.demo}/{run.variant}] {message}", flush=True)


def device_sync(run: Run) -> None:
    """Wait for queued GPU work: a clock read before this measures only the CPU's enqueueing."""
    if run.is_cuda:
        torch.cuda.synchronize(run.device)


def forever(loader: Iterable) -> Iterator:
    """Batches without end: a new epoch starts when the loader runs out."""
    while True:
        yield from loader


def describe_loader(loader: torch.utils.data.DataLoader) -> dict:
    return {"num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers,
            "prefetch_factor": loader.prefetch_factor}


def train(run: Run, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          loader: torch.utils.data.DataLoader, *, non_blocking: bool = False,
          loss_fn: Callable = torch.nn.functional.cross_entropy) -> dict:
    """Train on batches from `loader`, measure and profile it. Returns the summary."""
    batches = forever(loader)
    model.train()

    def step() -> None:
        with record_function("data"):
            inputs, targets = next(batches)
            inputs = inputs.to(run.device, non_blocking=non_blocking)
            targets = targets.to(run.device, non_blocking=non_blocking)
        with record_function("forward"):
            loss = loss_fn(model(inputs), targets)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    run.config.update(describe_loader(loader), non_blocking=non_blocking)
    return measure(run, step)


def run_steps(run: Run, step: Callable[[], None], count: int, phase: str) -> None:
    last_print = time.perf_counter()
    for done in range(1, count + 1):
        step()
        if time.perf_counter() - last_print >= PROGRESS_EVERY_S:
            log(run, f"{phase}: step {done}/{count}")
            last_print = time.perf_counter()


def timed_steps(run: Run, step: Callable[[], None]) -> tuple[float, np.ndarray]:
    """Run run.steps steps unprofiled. Returns (wall seconds, per-step milliseconds)."""
    device_sync(run)
    if run.is_cuda:  # CUDA events time each step on the GPU's clock without a sync per step
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(run.steps + 1)]
        marks[0].record()
    started = time.perf_counter()
    ends = []
    last_print = started
    for done in range(1, run.steps + 1):
        step()
        if run.is_cuda:
            marks[done].record()
        ends.append(time.perf_counter())
        if ends[-1] - last_print >= PROGRESS_EVERY_S:
            log(run, f"timed: step {done}/{run.steps}")
            last_print = ends[-1]
    device_sync(run)
    wall_s = time.perf_counter() - started
    if run.is_cuda:
        step_ms = np.array([a.elapsed_time(b) for a, b in zip(marks, marks[1:])])
    else:
        step_ms = np.diff(np.array([started] + ends)) * 1000.0
    return wall_s, step_ms


def clear_run_dir(out_dir: Path) -> None:
    """Remove what an earlier run left: TensorBoard reads a run directory once, and a stale trace
    beside a new one would be shown as a second worker."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in out_dir.iterdir():
        if path.is_file() and (path.name.endswith(trace.TRACE_SUFFIXES)
                               or path.name in (SUMMARY_FILE, KEY_AVERAGES_FILE)):
            path.unlink()


def profiled_steps(run: Run, step: Callable[[], None]) -> Path:
    """Run a few steps under torch.profiler; write the gzip trace and the operator table."""
    clear_run_dir(run.out_dir)
    sort_key = "self_cuda_time_total" if run.is_cuda else "self_cpu_time_total"
    write_trace = tensorboard_trace_handler(str(run.out_dir), worker_name=f"{run.demo}_{run.variant}",
                                            use_gzip=True)

    def on_trace_ready(prof: profile) -> None:
        write_trace(prof)
        table = prof.key_averages().table(sort_by=sort_key, row_limit=KEY_AVERAGES_ROWS)
        (run.out_dir / KEY_AVERAGES_FILE).write_text(table + "\n")

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.is_cuda else [])
    total = PROFILE_WAIT_STEPS + PROFILE_WARMUP_STEPS + PROFILE_ACTIVE_STEPS
    with profile(activities=activities,
                 schedule=schedule(wait=PROFILE_WAIT_STEPS, warmup=PROFILE_WARMUP_STEPS,
                                   active=PROFILE_ACTIVE_STEPS, repeat=1),
                 on_trace_ready=on_trace_ready, record_shapes=True, profile_memory=True) as prof:
        for _ in range(total):
            step()
            prof.step()
    written = trace.trace_files(run.out_dir)
    if len(written) != 1:
        raise RuntimeError(f"expected one trace in {run.out_dir}, found {len(written)}")
    return written[0]


def measure(run: Run, step: Callable[[], None]) -> dict:
    """Warm up, time, profile, summarise. `step` runs one training (or inference) step."""
    log(run, f"{run.device.type} ({run.device_name}), torch {torch.__version__}, "
             f"preset {run.preset_name}, batch {run.batch_size}")
    log(run, f"warm-up: {run.preset.warmup_steps} steps")
    run_steps(run, step, run.preset.warmup_steps, "warm-up")
    if run.is_cuda:
        torch.cuda.reset_peak_memory_stats(run.device)
    log(run, f"timed: {run.steps} steps without the profiler")
    wall_s, step_ms = timed_steps(run, step)
    log(run, f"profiling: {PROFILE_WAIT_STEPS + PROFILE_WARMUP_STEPS + PROFILE_ACTIVE_STEPS} steps "
             f"({PROFILE_ACTIVE_STEPS} recorded)")
    trace_path = profiled_steps(run, step)
    if run.is_cuda:
        peak_mb = torch.cuda.max_memory_allocated(run.device) / trace.BYTES_PER_MB
        peak_source = "torch.cuda.max_memory_allocated over the timed and profiled steps"
    else:
        peak_mb = trace.peak_allocated_mb(trace.load_trace(trace_path)["traceEvents"],
                                          trace.CPU_DEVICE_TYPE)
        peak_source = ("profiler [memory] events: CPU tensor memory allocated during the "
                       "recorded steps (what existed before the profiler started is not counted)")
    summary = {
        "demo": run.demo, "variant": run.variant, "device": run.device.type,
        "device_name": run.device_name, "torch_version": torch.__version__,
        "preset": run.preset_name, "batch_size": run.batch_size, "steps": run.steps,
        "warmup_steps": run.preset.warmup_steps, "seed": run.seed,
        "main_process_threads": torch.get_num_threads(),
        "samples_per_s": run.steps * run.batch_size / wall_s,
        "step_ms_mean": float(step_ms.mean()),
        "step_ms_p50": float(np.percentile(step_ms, 50)),
        "step_ms_p95": float(np.percentile(step_ms, 95)),
        "timed_wall_s": wall_s,
        "peak_memory_mb": peak_mb, "peak_memory_source": peak_source,
        "config": run.config, "sizes": run.sizes, "trace_file": trace_path.name,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    (run.out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(run, summary, trace_path)
    return summary


def print_summary(run: Run, summary: dict, trace_path: Path) -> None:
    peak = summary["peak_memory_mb"]
    log(run, f"{summary['samples_per_s']:.1f} samples/s | step p50 {summary['step_ms_p50']:.1f} ms, "
             f"p95 {summary['step_ms_p95']:.1f} ms | peak memory "
             f"{'n/a' if peak is None else f'{peak:.0f} MB'}")
    log(run, f"config: {json.dumps(summary['config'])}")
    log(run, f"trace: {trace_path}")
