"""Read a Kineto trace and say what limits the run: the numbers an engineer reads off a trace,
and a plain verdict per bottleneck, each pointing at the demo that fixes it.

    python -m common.analyze PATH [--json]

PATH is a .pt.trace.json(.gz) file or a run directory (its newest trace). Imports no torch:
parsing is msgspec (typed and streamed; orjson or json where it is missing), interval work is
numpy (sort, merge). The parts, in common/: trace_columns.py (reading a trace), intervals.py,
trace_steps.py (the steps and the basics every metric reads), metrics.py (the GPU numbers and
their definitions), idle_causes.py (why the GPU is idle), syncs.py (where each host sync comes
from), communication.py (torch.distributed), verdicts.py.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from common import sanity, trace
from common.communication import distributed_metrics
from common.frames import FrameTimes, frame_times, python_frames
from common.host_ops import (
    CPU_SHORT_OP_US,
    HOST_OP_CAUSE_PREFIX,
    cpu_run_metrics,
    operators,
    with_host_work_ops,
)
from common.idle_causes import (
    IDLE_CAUSES,
    compiling_operators,
    host_region_metrics,
    host_regions,
    initialization_regime,
    initialization_regime_warning,
)
from common.intervals import Spans, concat, merge, union_in
from common.compiled import compiled_metrics
from common.memory import GROWTH_FIT_MIN_STEPS, device_events, memory_metrics
from common.metrics import (
    SHORT_KERNEL_US,
    attention_metrics,
    copy_calls,
    gpu_metrics,
    optimizer_metrics,
)
from common.syncs import host_syncs
from common.trace_columns import DATALOADER_REGION, TraceColumns, read_trace
from common.trace_steps import (
    BREAKDOWN_ROLES,
    US_PER_MS,
    ends_the_loop,
    extend_steps,
    host_steps,
    runtime_step_index,
    step_breakdown_ms,
    time_by_name,
)
from common.verdicts import (
    HOST_OVERHEAD_OPERATORS_SHOWN,
    findings_for,
    host_starved,
    matrix_units,
)

CUDA_DEVICE_TYPE = 1  # "Device Type" of a [memory] event (c10::DeviceType): 0 CPU, 1 CUDA
# PyTorch on ROCm calls its GPU "cuda" (torch.device("cuda")), but its allocator's [memory] events
# may say HIP: the shared MI300X Qwen trace's 2,588 GPU events are Device Type 6.
HIP_DEVICE_TYPE = 6
GPU_DEVICE_TYPES = (CUDA_DEVICE_TYPE, HIP_DEVICE_TYPE)
# An AMD GPU: its runtime calls are HIP's (hipLaunchKernel, ...), or, in a trace without runtime
# calls, its deviceProperties name says so ("AMD Instinct MI250X", "AMD Radeon Graphics"; Kineto on
# ROCm writes warpSize 64 there, NVIDIA's is 32).
AMD_DEVICE_MARKERS = ("AMD", "Radeon", "Instinct")
# How the human output and the report name each idle cause (idle_causes.IDLE_CAUSES); a host region
# is named by its own name (idle_cause_label).
IDLE_CAUSE_LABELS = {"dataloader": "DataLoader", "host_sync": "host syncs",
                     "before_first_op": "before the first GPU op", "launch": "launches",
                     "other": "other", "unrecorded": "work launched before the recording"}
# The human output lists at most this many host regions (the largest by share of the window; the
# JSON has them all): the traces from elsewhere hold dozens of small "## ... ##" ranges.
HOST_REGIONS_SHOWN = 3
# Shares under this many % print as 0.0 at one decimal: lines that would say "0.0" leave them out.
SHOWN_PCT_MIN = 0.05
# The idle causes the human line always shows; the others (host regions, work launched before the
# recording) only where they hold some of the window.
SHOWN_CAUSES = tuple(cause for cause in IDLE_CAUSES if cause != "unrecorded")


def idle_cause_label(cause: str) -> str:
    """"host syncs" for a fixed cause, "region tokenize" for a host region's, "CPU op aten::randn"
    for a host operator's (host_ops.with_host_work_ops) as it is."""
    if cause.startswith(HOST_OP_CAUSE_PREFIX):
        return cause
    return IDLE_CAUSE_LABELS.get(cause, f"region {cause}")


def idle_causes(*splits: dict[str, float]) -> list[str]:
    """The causes of one or more idle splits (gpu.idle_by_cause_pct) in the order of
    precedence: the DataLoader, the host regions (largest first, across the splits), then the
    other fixed causes."""
    largest: dict[str, float] = {}
    for idle in splits:
        for cause, pct in idle.items():
            if cause not in IDLE_CAUSES:
                largest[cause] = max(largest.get(cause, 0.0), pct)
    regions = sorted(largest, key=lambda cause: -largest[cause])
    return [IDLE_CAUSES[0], *regions, *IDLE_CAUSES[1:]]


def device_kind(columns, gpu_run: bool, gpu_props: dict) -> str:
    """"rocm" (an AMD GPU), "cuda" (NVIDIA) or "cpu": no GPU work in the trace, and no runtime
    call that enqueues any (`gpu_run` False; gpu_unrecorded)."""
    if not gpu_run:
        return "cpu"
    name = str(gpu_props.get("name") or "") if isinstance(gpu_props, dict) else ""
    amd = columns.hip_runtime or any(marker in name for marker in AMD_DEVICE_MARKERS)
    return "rocm" if amd else "cuda"


@dataclass
class Analysis:
    """The JSON result, and the per-step detail the report draws."""
    result: dict
    steps: Spans  # extended steps, µs
    window: tuple[float, float]  # µs
    host_window: tuple[float, float]  # µs, the ProfilerStep#N spans' (else the CPU extent)
    breakdown_ms: np.ndarray  # [step, role] in BREAKDOWN_ROLES order
    regions: dict[str, Spans] = field(default_factory=dict)
    kernel_busy: Spans = field(default_factory=Spans.empty)  # merged kernel intervals
    memory_ts: np.ndarray = field(default_factory=lambda: np.empty(0))  # µs, device's events
    memory_mb: np.ndarray = field(default_factory=lambda: np.empty(0))
    columns: TraceColumns | None = None  # what compare's what_changed reads (time_by_name)
    frames: FrameTimes | None = None  # Python frames' self time by label (None: no frames)


def gpu_unrecorded(columns, has_gpu: bool) -> int:
    """The runtime calls that enqueue GPU work (kernel launches, copies: cudaLaunchKernel,
    cudaMemcpyAsync, hipLaunchKernel, ...) in a trace without a single GPU event: the GPU ran and
    the profiler did not record it (no ProfilerActivity.CUDA, or CUPTI unavailable or taken by
    another profiler). 0 where the GPU was recorded, or nothing was enqueued."""
    return 0 if has_gpu else int(columns.runtime_enqueues.sum())


def gpu_unrecorded_warning(calls: int, device: str) -> str | None:
    if not calls:
        return None
    runtime = "HIP" if device == "rocm" else "CUDA"
    return (f"a GPU run whose GPU was not recorded: {calls} {runtime} runtime calls enqueue GPU "
            f"work (kernel launches, copies) and the trace holds no kernel, copy or memset; "
            f"record with torch.profiler.profile(activities=[ProfilerActivity.CPU, "
            f"ProfilerActivity.CUDA]), and check that CUPTI is available and not taken by "
            f"another profiler (Nsight Systems, DCGM's profiling); no GPU numbers or verdicts "
            f"from this trace")


def several_gpus_warning(by_device: dict[str, float] | None) -> str | None:
    """For a trace of one process driving several GPUs: its GPU numbers are of their union."""
    if not by_device:
        return None
    each = ", ".join(f"{pid}: {pct:.1f} %" for pid, pct in by_device.items())
    return (f"GPU work on {len(by_device)} devices in one trace: utilization, idle time and "
            f"every other GPU number here are of their union (a time when any of them is busy), "
            f"not of one GPU; each device's own utilization, by the pid its events are under: "
            f"{each}")


# --- The whole analysis. -------------------------------------------------------------------------

def recorded_nothing(columns, window: tuple[float, float], host_window: tuple[float, float],
                     regions, loop_end_alone: bool) -> bool:
    """Whether the steps hold nothing a rule reads: no PyTorch operator, no GPU work, no
    DataLoader span, collective call or host region; or the one step is the loop's end
    (`loop_end_alone`: trace_steps.ends_the_loop). The profiler writes such a trace when it stops
    mid-cycle (a loop that ends in a schedule's warm-up or active steps: at exit it records the
    cut cycle's step), beside the full trace before it; without a schedule, when the code ran on
    threads it does not record."""
    def meets(spans: Spans, lo: float, hi: float) -> bool:
        return bool(((spans.end > lo) & (spans.start < hi)).any())

    if loop_end_alone:
        return True  # its DataLoader span is the loop's end, no batch of the run's
    ours = operators(columns)  # not the harness's regions written as operators
    host = (Spans(columns.cpu_ops.start[ours], columns.cpu_ops.end[ours]), columns.dataloader,
            columns.collective_spans, columns.collective_ops, regions.segments)
    return not (any(meets(spans, *host_window) for spans in host)
                or any(meets(spans, *window)
                       for spans in (columns.kernels, columns.memcpy, columns.memset)))


# Where such a trace comes from, in both warnings that meet one.
CUT_CYCLE_TRACE = ("a profiler that stops mid-cycle (a loop that ends in its schedule's warm-up "
                   "or active steps) writes such a trace at exit, after any full one")
# A loop over a DataLoader ends in the call that finds it empty: a step of its own, holding only
# that call, where the profiler still records (trace_steps.ends_the_loop).
LOOP_END = ("a loop over a DataLoader ends in a call that finds it empty, which the profiler "
            "records as a step of its own when it stops after it")
LOOP_END_ALONE_WARNING = (
    f"the one step holds only the DataLoader's calls, the loop's end, so no rule has anything to "
    f"read: no verdicts ({LOOP_END}; {CUT_CYCLE_TRACE})")


# Where a trace's steps come from (result["steps_from"]; trace_steps.host_steps): ProfilerStep#N,
# else optimizer.step() calls, else the whole trace is one step.
STEPS_FROM_WORDS = {
    "profiler_step": "",
    "optimizer_step": " (no ProfilerStep#N: each ends where an optimizer.step() does)",
    "whole_trace": " (no ProfilerStep#N: the whole trace)"}


def loop_end_warning(columns, host: Spans, loop_end_alone: bool) -> str | None:
    """The warning for a trace whose last step is the loop's end: left out of the steps behind
    others (host_steps), or the trace's only step; None for any other trace."""
    if loop_end_alone:
        return LOOP_END_ALONE_WARNING
    if host.size >= columns.steps.size:  # none left out (no ProfilerStep#N: one, the trace)
        return None
    cut_ms = float(columns.steps.end[-1] - columns.steps.start[-1]) / US_PER_MS
    return (f"the last step ({cut_ms:.2f} ms) is left out of the steps: it holds only the "
            f"DataLoader's calls, the loop's end ({LOOP_END})")
RECORDED_NOTHING_WARNING = (
    f"the steps hold no PyTorch operator, GPU work, DataLoader span, collective call or host "
    f"region, so no rule has anything to read: no verdicts. {CUT_CYCLE_TRACE.capitalize()}; or "
    f"the steps ran no PyTorch code")
# Without ProfilerStep#N no schedule cut the trace short: the code ran elsewhere. The profiler's
# operator callbacks are thread-local, so a model served from a thread pool's threads records no
# operator (a ThreadPoolExecutor of 2 ran ResNet-18 4 times under profile(): 7 events, none an
# operator; with profile_all_threads, its operators on both threads).
RECORDED_NOTHING_UNSCHEDULED_WARNING = (
    "the trace holds no PyTorch operator, GPU work, DataLoader span, collective call or host "
    "region, so no rule has anything to read: no verdicts. The profiler records operators only on "
    "the thread that started it: code run on other threads (a thread pool's, a server's) records "
    "none unless profile(experimental_config=torch._C._profiler._ExperimentalConfig("
    "profile_all_threads=True)); or the block ran no PyTorch code")


def analyze(path: Path) -> Analysis:
    """Analyse the trace at `path`: a file, or a run directory's newest trace, or, where that one
    recorded nothing in its steps (recorded_nothing), the newest that did, with a warning
    naming both. Raises trace.TraceError for unreadable input."""
    newest = trace.newest_trace(path)
    analysis = analyze_file(newest)
    if not Path(path).is_dir():
        return analysis
    files = trace.trace_files(path)
    if analysis.result["recorded_nothing"]:
        analysis = newest_that_recorded(files[:-1], newest) or analysis
    # A folder may hold several traces of one run: a schedule's repeat cycles, reruns into it.
    analysis.result["traces_in_folder"] = len(files)
    return analysis


def newest_that_recorded(older: list[Path], newest: Path) -> Analysis | None:
    """The newest of the `older` traces whose steps hold something a rule reads, with a warning
    that names it and the folder's `newest`; None if none does."""
    for path in reversed(older):
        try:
            candidate = analyze_file(path)
        except trace.TraceError:
            continue  # a broken older trace (a killed run's) is no candidate
        if not candidate.result["recorded_nothing"]:
            candidate.result["warnings"].insert(0, (
                f"read {path.name}, not the folder's newest trace, {newest.name}, whose steps "
                f"hold nothing a rule reads: {CUT_CYCLE_TRACE}"))
            return candidate
    return None


def without_calls_from(columns: TraceColumns, start: float) -> TraceColumns:
    """`columns` less the DataLoader calls that start at `start` or later (the loop's end's: on
    a GPU the window can run on past its start, to the last step's kernels)."""
    before = columns.dataloader.start < start
    kept = Spans(columns.dataloader.start[before], columns.dataloader.end[before])
    return replace(columns, dataloader=kept, regions={**columns.regions, DATALOADER_REGION: kept})


def analyze_file(trace_path: Path) -> Analysis:
    """Analyse the trace file at `trace_path`. Raises trace.TraceError for unreadable input."""
    columns = read_trace(trace_path)

    host = host_steps(columns)
    loop_end_alone = columns.steps.size == 1 and ends_the_loop(columns)
    loop_end = loop_end_warning(columns, host, loop_end_alone)
    if host.size < columns.steps.size:  # the loop's end left out, and its DataLoader call too
        columns = without_calls_from(columns, float(columns.steps.start[-1]))
    runtime_step = runtime_step_index(columns, host)
    steps = extend_steps(columns, host, runtime_step)
    window = (float(steps.start[0]), float(steps.end[-1]))
    # What the CPU did in the steps (layer shapes, the optimizer region, softmaxes, collective
    # calls) lies in the host steps: when the GPU is the bottleneck the CPU runs steps ahead of it,
    # and the extended steps, which follow the GPU, can start after the last host step has ended.
    host_window = (float(host.start[0]), float(host.end[-1]))
    span = window[1] - window[0]
    n_steps = steps.size
    step_ms = (steps.end - steps.start) / US_PER_MS
    has_gpu = bool(columns.kernels.size or columns.memcpy.size or columns.memset.size)
    # A GPU run whose GPU the profiler did not record: its memory events and device are the GPU's.
    unrecorded_calls = gpu_unrecorded(columns, has_gpu)
    gpu_run = has_gpu or bool(unrecorded_calls)

    device_types = GPU_DEVICE_TYPES if gpu_run else (trace.CPU_DEVICE_TYPE,)
    # The device's memory events by time (of several GPUs, the one whose peak is highest): the
    # curve, the peak and the memory section all read these.
    memory_events = device_events(columns, device_types)
    if memory_events is None:
        memory_events = np.empty(0, dtype=np.int64)
    memory_ts = columns.memory_ts[memory_events]
    memory_mb = columns.memory_bytes[memory_events] / trace.BYTES_PER_MB
    gpu_props = columns.device_properties[0] if gpu_run and columns.device_properties else {}
    total_memory = gpu_props.get("totalGlobalMem") if isinstance(gpu_props, dict) else None
    layer_batches = columns.batch_rows[(columns.batch_ts >= host_window[0])
                                       & (columns.batch_ts < host_window[1])]

    # The host syncs and host-device copies in the steps: read by the GPU numbers and by the
    # Python frames that issued them.
    syncs = host_syncs(columns, host, runtime_step)
    copied = copy_calls(columns, runtime_step)
    regions = host_regions(columns)  # record_function ranges that are host work
    metrics = {
        "trace": str(trace_path),
        "device": device_kind(columns, gpu_run, gpu_props),
        "gpu_name": gpu_props.get("name") if isinstance(gpu_props, dict) else None,
        "steps": int(n_steps),
        "step_ms": {"mean": float(step_ms.mean()), "p50": float(np.percentile(step_ms, 50)),
                    "p95": float(np.percentile(step_ms, 95))},
        "dataloader_pct": (100.0 * union_in(columns.dataloader, *window) / span
                           if span > 0 else 0.0),
        # Whether the DataLoader's batches come from worker processes, as its spans name its
        # iterator: all of them (a loader in the training process beside one with workers may
        # be the wait); None where no DataLoader span says.
        "dataloader_workers": (columns.dataloader_iterators
                               == {trace.MULTIPROCESS_LOADER_ITERATOR}
                               if columns.dataloader_iterators else None),
        # The idle split names the host regions and, where no region holds, the host's operators
        # that enqueue no GPU work (host_ops.with_host_work_ops).
        "gpu": (gpu_metrics(columns, window, n_steps, runtime_step, host, syncs=syncs,
                            copied=copied,
                            regions=with_host_work_ops(regions, columns, host_window))
                if has_gpu else None),
        "peak_memory_mb": float(memory_mb.max()) if memory_mb.size else None,
        # Beyond the list: the GPU's memory (for the activation-memory verdict), the
        # window and the plugin-style breakdown of an average step.
        "device_memory_mb": float(total_memory) / trace.BYTES_PER_MB if total_memory else None,
        # Memory over the recorded steps: at each step's end, its growth, what earlier steps
        # kept, the peak and what it is made of (common/memory.py; null without [memory] events).
        "memory": memory_metrics(columns, memory_events, host),
        # torch.compile's regions in the recorded steps by frame and compile id, graph breaks,
        # eager operators inside regions, compiling in the steps (common/compiled.py; null
        # without a compiled region or compiling in the steps).
        "compiled": compiled_metrics(columns, host),
        "window_ms": span / US_PER_MS,
        # The median batch dimension of the forward conv/linear calls in the host steps (shapes;
        # null without shapes): tells a small batch from many small ops (input_batch_of).
        "input_batch": float(np.median(layer_batches)) if layer_batches.size else None,
        "steps_named": bool(columns.steps.size),
        # Where the steps come from: ProfilerStep#N, optimizer.step() calls (a trace without a
        # schedule, trace_steps.optimizer_steps) or the whole trace, one step.
        "steps_from": ("profiler_step" if columns.steps.size
                       else "optimizer_step" if host.size > 1 else "whole_trace"),
        # The optimizer region (null without one) and attention's shapes and operators.
        "optimizer": optimizer_metrics(columns, window, n_steps, host_window=host_window),
        "attention": attention_metrics(columns, host_window, n_steps),
        # torch.distributed: null for a trace of one process.
        "distributed": distributed_metrics(columns, window, n_steps, host_window=host_window),
    }
    # The host regions (user's record_function ranges that are host work): their share of the
    # window and, on a GPU, of its idle time; on a CPU-only trace too.
    metrics["host_regions"] = host_region_metrics(
        regions, window, n_steps,
        metrics["gpu"]["idle_by_cause_pct"] if metrics["gpu"] else None)
    # A CPU run (no GPU, recorded or not): its operators, and the time outside them that no
    # other cause (the DataLoader, a host region, a collective call) names.
    metrics["cpu"] = None
    if metrics["device"] == "cpu":
        held = concat(columns.dataloader, regions.segments, columns.collective_spans,
                      columns.collective_ops)
        metrics["cpu"] = cpu_run_metrics(columns, host_window, n_steps, held)
    # A backward pass in the trace: training (else inference: no training-only advice).
    metrics["training"] = columns.has_backward
    # What the host does while the GPU waits for it: its operators by self time, for the
    # host_overhead verdict's evidence (read only where that rule can fire: a self-time pass).
    metrics["host_operators"] = None
    if has_gpu and host_starved(metrics):
        by_time = time_by_name(columns, window, n_steps, host_window=host_window,
                               compiling=compiling_operators(columns)).operators
        metrics["host_operators"] = [
            (name, ms) for name, (ms, _) in sorted(by_time.items(), key=lambda item: -item[1][0])
        ][:HOST_OVERHEAD_OPERATORS_SHOWN]
    # Python frames (with_stack): the hot ones, and the user's lines that issued each sync and
    # host-device copy in the steps (null without Python frames in the trace).
    frames = None
    metrics["python"] = None
    if ((columns.python.start >= host_window[0]) & (columns.python.start < host_window[1])).any():
        frames = frame_times(columns, host_window, n_steps)
        in_steps = syncs.step >= 0
        copy_call, _ = copied
        metrics["python"] = python_frames(
            columns, frames, host_window, n_steps,
            syncs=(Spans(syncs.start[in_steps], syncs.end[in_steps]), syncs.thread[in_steps]),
            copies=(Spans(columns.runtime.start[copy_call], columns.runtime.end[copy_call]),
                    columns.runtime_thread[copy_call]))
    roles = [columns.kernels, columns.memcpy, columns.memset, columns.runtime, columns.dataloader,
             columns.cpu_ops]
    breakdown = step_breakdown_ms(steps, roles)
    metrics["step_breakdown_ms"] = dict(zip(BREAKDOWN_ROLES, map(float, breakdown.mean(axis=0))))
    # A window that holds the run's start-up (context creation, module loading, first calls,
    # compiling) is no steady state: the verdicts that read idle time give way to it.
    # Not on a GPU run without its GPU: the signals compare with the GPU's work, which it lacks.
    metrics["initialization"] = (initialization_regime(columns, host, steps)
                                 if has_gpu or not gpu_run else None)
    # Steps with no operator and no GPU work in them: every share would be of nothing.
    metrics["recorded_nothing"] = recorded_nothing(columns, window, host_window, regions,
                                                   loop_end_alone)
    metrics["findings"] = [] if metrics["recorded_nothing"] else findings_for(metrics)
    # Events the profiler wrote that cannot be true, left out of every number above, by kind.
    metrics["impossible_events"] = columns.impossible
    # A GPU run the profiler recorded without its GPU: said, and read as no GPU (no GPU rules).
    metrics["gpu_unrecorded_calls"] = unrecorded_calls
    metrics["warnings"] = [line for line in (
        loop_end,
        ((RECORDED_NOTHING_WARNING if columns.steps.size else RECORDED_NOTHING_UNSCHEDULED_WARNING)
         if metrics["recorded_nothing"] and not loop_end_alone else None),
        sanity.warning_line(columns.impossible),
        initialization_regime_warning(metrics["initialization"]),
        gpu_unrecorded_warning(metrics["gpu_unrecorded_calls"], metrics["device"]),
        several_gpus_warning(metrics["gpu"] and metrics["gpu"]["utilization_pct_by_device"]))
        if line]
    return Analysis(result=metrics, steps=steps, window=window, host_window=host_window,
                    breakdown_ms=breakdown,
                    regions=columns.regions, kernel_busy=merge(columns.kernels),
                    memory_ts=memory_ts, memory_mb=memory_mb, columns=columns, frames=frames)


def analyze_trace(path: Path) -> dict:
    """The --json object for the trace at `path` (a file or a run directory)."""
    return analyze(path).result


# --- Several ranks of one job (a run directory of torchrun's traces). ---------------------------

def analyze_ranks(run_dir: Path) -> dict | None:
    """For a run directory holding the traces of several ranks of one torch.distributed job (each
    with its rank in distributedInfo, all different, one world size and backend): {"ranks":
    every rank's analyze_trace result, rank order; "cross_rank": step time and time in
    collectives per rank, the slowest rank and the one that waits least in collectives (a
    straggler is the rank the others wait for: it waits least)}. None for any other directory."""
    files = trace.trace_files(run_dir)
    if len(files) < 2:
        return None
    try:
        results = [analyze_trace(path) for path in files]
    except trace.TraceError:
        return None  # a broken trace (a killed run's) among them: the newest alone is read
    ranks = [(r["distributed"] or {}).get("rank") for r in results]
    if None in ranks or len(set(ranks)) != len(ranks):
        return None
    # One job: every trace says the same world size and backend (a reused folder may hold
    # ranks of two jobs, rank 3 of 8 beside rank 1 of 2: no cross-rank view of them).
    if len({(r["distributed"]["world_size"], r["distributed"]["backend"])
            for r in results}) != 1:
        return None
    results = [r for _, r in sorted(zip(ranks, results), key=lambda pair: pair[0])]
    step_ms = {r["distributed"]["rank"]: r["step_ms"]["mean"] for r in results}
    waiting = {r["distributed"]["rank"]: r["distributed"]["collective_ms_per_step"]
               for r in results}
    return {"ranks": results, "cross_rank": {
        "world_size": results[0]["distributed"]["world_size"], "ranks_read": len(results),
        "step_ms_by_rank": step_ms, "collective_ms_per_step_by_rank": waiting,
        "slowest_rank": max(step_ms, key=step_ms.get),
        "least_waiting_rank": min(waiting, key=waiting.get),
        "wait_spread_ms_per_step": max(waiting.values()) - min(waiting.values())}}


def verdict_ids(result: dict) -> str:
    """"fp32_matmul, host_sync": the ids of the verdicts an analysis holds, or "none"."""
    return ", ".join(found["id"] for found in result["findings"]) or "none"


def format_ranks(view: dict) -> str:
    cross = view["cross_rank"]
    rows = [("rank", "step ms", "collectives/step", "in collectives ms/step", "verdicts")]
    for result in view["ranks"]:
        dist = result["distributed"]
        rows.append((str(dist["rank"]), f"{result['step_ms']['mean']:.1f}",
                     f"{dist['collectives_per_step']:.1f}",
                     f"{dist['collective_ms_per_step']:.1f}",
                     verdict_ids(result)))
    lines = [f"ranks        {cross['ranks_read']} of {cross['world_size']} "
             f"({view['ranks'][0]['distributed']['backend']}), one trace each"]
    lines += text_table(rows, right=(1, 2, 3))
    lines.append(f"slowest      rank {cross['slowest_rank']} "
                 f"({cross['step_ms_by_rank'][cross['slowest_rank']]:.1f} ms/step); rank "
                 f"{cross['least_waiting_rank']} waits least in collectives "
                 f"({cross['collective_ms_per_step_by_rank'][cross['least_waiting_rank']]:.1f} "
                 f"ms/step, {cross['wait_spread_ms_per_step']:.1f} ms less than the most): a "
                 f"straggler is the rank the others wait for")
    for result in view["ranks"]:
        for found in result["findings"]:
            lines.append(f"[{found['severity']}] rank {result['distributed']['rank']}: "
                         f"{found['id']}: {found['evidence']}")
    return "\n".join(lines)


def memory_over_time(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ms since the first step's start, MB allocated) of the trace's [memory] events for its
    device (the GPU if the trace has GPU work, else the CPU)."""
    analysis = analyze(path)
    return (analysis.memory_ts - analysis.window[0]) / US_PER_MS, analysis.memory_mb


# --- The command line. ---------------------------------------------------------------------------

def fmt(value, spec: str = ".1f", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def copies_line(way: dict) -> str:
    """"2.0/step (154.1 MB, 19.81 ms, 7.8 GB/s, all pageable)": one direction's copies per step,
    the GB/s they ran at and their host memory (metrics.copy_metrics), shares of their time."""
    text = f"{way['count']:.1f}/step ({fmt(way['mb'], '.1f', ' MB')}, {way['ms']:.2f} ms"
    if not way["count"]:
        return text + ")"
    rate = way["gb_per_s"]
    text += (", GB/s n/a (no bytes)" if rate is None
             else f", {rate:.1f} GB/s" if rate >= 0.1 else f", {rate:.2g} GB/s")
    pinned, pageable = way["pinned_pct"], way["pageable_pct"]
    if pinned is None:
        return text + ", host memory not named)"
    if pinned == 100.0 or pageable == 100.0:
        return text + f", all {'pinned' if pinned == 100.0 else 'pageable'})"
    return text + f", pinned {pinned:.1f} %, pageable {pageable:.1f} % of the time)"


def peak_memory_line(peak_mb: float | None, device_mb: float | None) -> str:
    """The peak of the trace's [memory] events, against the device's memory where the trace
    gives it; a trace recorded without profile_memory has no such events, and says so."""
    if peak_mb is None:
        return ("peak memory  not in the trace (no [memory] events: profile_memory=True records "
                "them)" + (f"; the device has {device_mb:.0f} MB" if device_mb else ""))
    return f"peak memory  {peak_mb:.0f} MB" + (f" of {device_mb:.0f} MB" if device_mb else "")


# Where the DataLoader's batches are made, as its spans say (metrics' dataloader_workers).
LOADER_WORDS = {True: " (batches from worker processes)",
                False: " (batches made in the training process)", None: ""}


def format_human(result: dict) -> str:
    step = result["step_ms"]
    in_folder = result.get("traces_in_folder", 1)  # read from a folder: how many it holds
    lines = [f"trace        {result['trace']}"
             + (f" (its folder holds {in_folder} traces: pass a file to read another)"
                if in_folder > 1 else ""),
             f"device       {result['device']}"
             + (f" ({result['gpu_name']})" if result["gpu_name"] else "")
             + ("" if result["gpu"] else " - the GPU's activity was not recorded (below)"
                if result.get("gpu_unrecorded_calls") else " - no GPU activity in the trace"),
             f"steps        {result['steps']}"
             + STEPS_FROM_WORDS[result["steps_from"]]
             + f", step time mean {step['mean']:.1f} ms, p50 {step['p50']:.1f} ms, "
               f"p95 {step['p95']:.1f} ms",
             f"DataLoader   {result['dataloader_pct']:.1f} % of the steps"
             + LOADER_WORDS[result.get("dataloader_workers")],
             peak_memory_line(result["peak_memory_mb"], result["device_memory_mb"])]
    lines += memory_lines(result["memory"])
    lines += compiled_lines(result["compiled"])
    if result["input_batch"] is not None:
        # A linear layer's rows are samples x positions: a transformer's 16 sequences of 64
        # tokens read 1024, what its GEMMs see, which the words must say.
        lines.append(f"batch        {result['input_batch']:.0f} (median of the forward "
                     f"conv/linear inputs from record_shapes: a convolution's samples, a linear "
                     f"layer's rows, samples x positions)")
    dist = result["distributed"]
    if dist:
        lines.append(f"distributed  {dist['backend'] or 'unknown backend'} rank "
                     f"{fmt(dist['rank'], 'd')} of {fmt(dist['world_size'], 'd')}: "
                     f"{dist['collectives_per_step']:.1f} collectives/step, "
                     f"{dist['collective_ms_per_step']:.1f} ms/step in them "
                     f"({dist['comm_pct']:.1f} % of the steps"
                     + (f", {result['cpu']['exposed_comm_pct']:.1f} % with no other operator "
                        f"running" if (result["cpu"] or {}).get("exposed_comm_pct") is not None
                        else "") + ")")
    gpu = result["gpu"]
    if gpu:
        unrecorded = gpu["idle_by_cause_pct"]["unrecorded"]
        lines += [f"GPU          utilization {gpu['utilization_pct']:.1f} % of the steps (compute "
                  f"kernels {gpu['compute_pct']:.1f} %, collectives with no compute beside them "
                  f"{gpu['exposed_comm_pct']:.1f} %, copies and memsets alone "
                  f"{gpu['copy_only_pct']:.1f} %), H2D copies {gpu['h2d_pct']:.1f} %"
                  + (f"; {gpu['recorded_utilization_pct']:.1f} % of the time the trace accounts "
                     f"for (for {unrecorded:.1f} % of the steps the GPU ran work launched before "
                     f"the recording)" if unrecorded >= SHOWN_PCT_MIN else ""),
                  f"kernels      {gpu['kernels_per_step']:.0f}/step, median "
                  f"{fmt(gpu['median_kernel_us'], '.1f', ' us')}, {gpu['short_kernel_pct']:.0f} % "
                  f"< {SHORT_KERNEL_US:.0f} us, {matrix_units(result)} "
                  f"{gpu['tensor_core_pct']:.0f} % of "
                  f"kernel time and {fmt(gpu['tensor_core_gemm_pct'], '.0f', ' %')} of GEMM time "
                  f"(GEMMs {gpu['gemm_pct']:.0f} % of kernel time)",
                  f"host         {gpu['launches_per_step']:.0f} launches/step"
                  + (f", {gpu['graph_launches_per_step']:.0f} of them CUDA graph launches "
                     f"replaying {gpu['graph_kernels_per_step']:.0f} kernels/step"
                     if gpu["graph_launches_per_step"] else "")
                  + f" ({gpu['launch_ms_per_step']:.2f} ms vs {gpu['kernel_ms_per_step']:.2f} ms "
                    f"of kernels), {gpu['syncs_per_step']:.1f} syncs/step"
                  + (" ({value_read:.1f} value reads, {h2d_copy:.1f} in host-to-device copies, "
                     "{other:.1f} other)".format(**gpu["syncs_by_cause_per_step"])
                     if gpu["syncs_per_step"] else "")
                  # The gaps the syncs end in (host_sync's and host_roundtrip's quantity): the
                  # idle split's "host syncs" is the part of them no host region holds.
                  + (", the GPU idles {:.1f} % of the steps in the gaps they end in ({value_read:.1f} "
                     "after value reads, {h2d_copy:.1f} after copies, {other:.1f} after other)"
                     .format(gpu["sync_idle_pct"], **gpu["sync_idle_pct_by_cause"])
                     if gpu["syncs_per_step"] else "")]
        copies = gpu["copies_per_step"]
        lines.append("copies       " + ", ".join(
            f"{label} {copies_line(copies[way])}" for way, label in (("h2d", "host->device"),
                                                                     ("d2h", "device->host")))
            + f"; round trips {gpu['round_trips_per_step']:.1f}/step, data-dependent syncs "
              f"{gpu['data_dependent_syncs_per_step']:.1f}/step")
        idle = gpu["idle_by_cause_pct"]
        # One idle figure: the steps' (the window's), which the causes split. HTA's, over the
        # first to the last GPU op of the whole trace, is another span: labelled as such.
        # Host regions and work launched before the recording under SHOWN_PCT_MIN read 0.0:
        # left out of the line (the JSON has them).
        lines.append(f"GPU idle     {gpu['idle_pct']:.1f} % of the steps: "
                     + ", ".join(f"{idle_cause_label(cause)} {idle[cause]:.1f}"
                                 for cause in idle_causes(idle)
                                 if cause in SHOWN_CAUSES or idle[cause] >= SHOWN_PCT_MIN)
                     + f" (HTA's idle, from the first to the last GPU op of the trace: "
                       f"{gpu['hta_idle_pct']:.1f} %)")
    cpu = result.get("cpu")
    if cpu:
        lines.append(f"operators    {cpu['ops_per_step']:.0f}/step, median "
                     f"{fmt(cpu['median_op_self_us'], '.1f', ' us')} of self time; under "
                     f"{CPU_SHORT_OP_US:.0f} us: {cpu['short_op_pct']:.1f} % of the steps, gaps "
                     f"under it between them {cpu['short_gap_pct']:.1f} % (calls: "
                     f"{cpu['call_pct']:.1f} %); outside every operator: "
                     f"{cpu['outside_ops_pct']:.1f} % ({cpu['long_gap_pct']:.1f} in gaps of "
                     f"{CPU_SHORT_OP_US:.0f} us or more)"
                     + ("; most self time: " + ", ".join(f"{name} {ms:.2f} ms/step"
                                                         for name, ms in cpu["top_ops_ms_per_step"])
                        if cpu["top_ops_ms_per_step"] else ""))
    lines += host_region_lines(result["host_regions"])
    lines += python_lines(result["python"])
    parts = ", ".join(f"{role} {ms:.1f}" for role, ms in result["step_breakdown_ms"].items()
                      if ms >= 0.05)
    lines.append(f"breakdown    ms per step: {parts}")
    lines += [f"warning      {line}" for line in result["warnings"]]
    if not result["findings"]:
        lines.append("verdicts     none: no bottleneck rule fired"
                     + ("" if gpu else " (GPU rules need the GPU's activity in the trace)"))
    for found in result["findings"]:
        lines.append(f"[{found['severity']}] {found['id']}: {found['evidence']}")
        lines.append(f"    fix: {found['fix']}"
                     + (f" - see demos/{found['demo']}/" if found["demo"] else ""))
    return "\n".join(lines)


def frame_words(frame: str, entry: dict) -> str:
    """"frame 1: 0.5/step under compile ids 2, 3, 6, 7"; frame "?" is the regions whose name
    holds no ids (compiled.py: a name holds both or neither)."""
    calls = f"{entry['calls_per_step']:.1f}/step"
    if frame == "?":
        return f"regions without a frame or compile id in their name: {calls}"
    ids = entry["compile_ids"]
    return (f"frame {frame}: {calls} under compile id{'s' * (len(ids) > 1)} "
            f"{', '.join(map(str, ids))}")


def compiled_lines(compiled: dict | None) -> list[str]:
    """torch.compile in the recorded steps (common/compiled.py): regions by frame and compile id,
    graph breaks with the eager operators inside regions, compiling inside the steps."""
    if not compiled:
        return []
    frames = "; ".join(frame_words(frame, entry) for frame, entry in compiled["frames"].items())
    eager = ", ".join(f"{op['name']} {op['ms_per_step']:.2f} ms" for op in
                      compiled["eager_operators"])
    compiling = (f"{compiled['compiling_ms']:,.1f} ms in step"
                 f"{'s' * (len(compiled['compiling_steps']) > 1)} "
                 + ", ".join(str(k + 1) for k in compiled["compiling_steps"])
                 if compiled["compiling_ms"] > 0 else "none")
    return [f"compiled     {compiled['regions_per_step']:.1f} regions/step"
            + (f" ({frames})" if frames else "")
            + f", {compiled['graph_ms_per_step']:.2f} ms/step in compiled graphs; graph breaks "
              f"{compiled['graph_breaks_per_step']:.1f}/step"
            + (f" (eager inside regions {compiled['eager_in_regions_ms_per_step']:.2f} ms/step: "
               f"{eager})" if eager else "")
            + f"; compiling in the steps: {compiling}"]


PEAK_PART_WORDS = {"before_steps": "before the steps", "kept": "kept from earlier steps",
                   "forward": "its step's forward"}  # the others print as their key


def memory_lines(memory: dict | None) -> list[str]:
    """Memory over the recorded steps (common/memory.py): allocated at the first and last step's
    end, the growth fit, what earlier steps kept and by whom; the steps' peak and its parts."""
    if not memory:
        return []
    ends = memory["allocated_mb_at_step_end"]
    growth = (f"{memory['growth_mb_per_step']:+,.2f} MB/step (R^2 {memory['growth_fit_r2']:.2f})"
              if memory["growth_mb_per_step"] is not None else
              f"no growth fit (it needs {GROWTH_FIT_MIN_STEPS} recorded steps)")
    kept = ""
    if memory["kept_mb_per_step"] is not None:
        kept = f"; kept {memory['kept_mb_per_step']:,.2f} MB/step" + "".join(
            f"{', by' if k == 0 else ','} {op['operator']} {op['mb_per_step']:,.2f}"
            for k, op in enumerate(memory["kept_by_operator"]))
    parts = ", ".join(f"{PEAK_PART_WORDS.get(part, part)} {mb:,.1f}"
                      for part, mb in memory["peak_breakdown_mb"].items() if mb is not None)
    reserved = (f"; reserved {memory['steps_peak_reserved_mb']:,.1f} MB at its peak, "
                f"{memory['reserved_unallocated_mb']:,.1f} MB of it unallocated"
                if memory["steps_peak_reserved_mb"] is not None else "")
    phases = ("the harness's regions" if memory["peak_phases_from"] == "regions"
              else "autograd's and torch.optim's operators; forward is in other")
    allocating = ", ".join(f"{op['operator']} {op['mb_per_step']:,.2f} MB/step "
                           f"({op['allocations_per_step']:,.1f} allocations)"
                           for op in memory["allocating_operators"])
    return [f"memory       allocated at step ends {ends[0]:,.1f} -> {ends[-1]:,.1f} MB "
            f"({memory['steps_read']} step{'' if memory['steps_read'] == 1 else 's'}), "
            f"{growth}{kept}",
            f"memory peak  {memory['steps_peak_allocated_mb']:,.1f} MB allocated in the steps "
            f"(step {memory['steps_peak_step'] + 1}): {parts} (phases by {phases}){reserved}",
            *([f"memory ops   allocating most: {allocating}"] if allocating else [])]


def host_region_lines(regions: dict) -> list[str]:
    """The largest host regions (HOST_REGIONS_SHOWN): share of the steps, ms per step and, on a
    GPU trace, the GPU idle time they cause."""
    if not regions:
        return []
    shown = list(regions.items())[:HOST_REGIONS_SHOWN]
    more = len(regions) - len(shown)
    return ["host regions " + ", ".join(
                f"{name} {region['pct']:.1f} % of the steps ({region['ms_per_step']:.2f} ms/step"
                + (f", GPU idle {region['gpu_idle_pct']:.1f} %"
                   if region["gpu_idle_pct"] is not None else "") + ")"
                for name, region in shown)
            + (f"; {more} more in --json" if more else "")
            + " (record_function ranges that enqueue no GPU work, almost all outside operators)"]


def python_lines(python: dict | None) -> list[str]:
    """The hot Python frames (a trace recorded with stacks), the user's marked, and the user's
    lines that issued syncs and copies."""
    if not python:
        return []
    lines = [f"python       hot frames by self time (ms/step, % of the step; * your code: "
             f"{python['user_ms_per_step']:.2f} ms/step in all)"]
    lines += [f"  {'*' if frame['user'] else ' '} {frame['self_ms_per_step']:8.3f} "
              f"{frame['pct']:5.1f} %  {frame['frame']}" for frame in python["hot_frames"]]
    for key, what in (("syncs_by_user_frame_per_step", "syncs"),
                      ("copies_by_user_frame_per_step", "host-device copies")):
        if python[key]:
            lines.append(f"  {what} issued by your lines: " + ", ".join(
                f"{line} {per_step:.1f}/step" for line, per_step in python[key].items()))
    return lines


def text_table(rows: list[tuple[str, ...]], right: tuple[int, ...]) -> list[str]:
    """Rows of cells as aligned lines, indented two spaces; the columns in `right` right-aligned
    (numbers), the others left. Shared by the three command lines' tables."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                             for i, cell in enumerate(row)).rstrip() for row in rows]


def print_output(text: str) -> int:
    """Print text and flush; the exit code: 0, or 1 when the reader closed the pipe early
    (`| head -1`). The recipe of Python's docs (signal module, "Note on SIGPIPE"): flush inside
    the try, then point stdout at devnull so the flush at exit raises no second BrokenPipeError
    ("Exception ignored ... BrokenPipeError" on stderr); 1 is the code Python exits with on
    EPIPE. Shared by the three command lines (analyze, compare, report)."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = trace.OneLineArgumentParser(
        prog="python -m common.analyze",
        description="Metrics and bottleneck verdicts for one Kineto (torch.profiler) trace.",
        epilog="Definitions and thresholds: common/README.md, section 'Analyzing a trace'. "
               "Exit code 2 for input that is not a readable trace.")
    parser.add_argument("path", metavar="PATH", type=Path,
                        help="a .pt.trace.json(.gz) file, or a run directory: its newest trace, "
                             "or, when it holds one trace per rank of a torch.distributed job, "
                             "every rank's and a cross-rank view")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    flags = parser.parse_args(argv)
    try:
        ranks = analyze_ranks(flags.path) if flags.path.is_dir() else None
        if ranks is not None:
            return print_output(json.dumps(ranks, indent=2) if flags.json
                                else format_ranks(ranks))
        result = analyze_trace(flags.path)
    except trace.TraceError as error:
        print(f"analyze: {error}", file=sys.stderr)
        return 2
    return print_output(json.dumps(result, indent=2) if flags.json else format_human(result))


if __name__ == "__main__":
    sys.exit(main())
