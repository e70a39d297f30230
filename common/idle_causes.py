"""Why the GPU is idle: each idle instant of the window goes to one cause (the DataLoader, a host
region by name, a host sync, the window's opening, a late launch, other, work launched before
the recording), and the causes add up to the idle time. Also the host regions themselves
(record_function ranges that are host work) and initialization caught in the window."""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from common.intervals import Spans, concat, covered_length, merge, union_in
from common.syncs import gap_of
from common.trace_columns import TraceColumns, is_collective_kernel
from common.trace_steps import US_PER_MS, gpu_ops, launching_call, op_threads

# Definitions (sources in common/README.md, "Analyzing a trace"):
#   host regions record_function ranges that are host work: while one is open no GPU work is
#                enqueued, and for at least four fifths of its time no operator or collective
#                call runs (host_regions).
#   idle causes  each idle instant of the GPU in the window goes to the first that holds of:
#                DataLoader (a __next__ span is open), a host region (by name, the innermost),
#                host sync (a sync returns in its gap), launch (the gap's next GPU op was
#                enqueued after the gap began), other.

# --- Initialization in the window. ---------------------------------------------------------------
# A window recorded as people first record one (`with profile():` around one cold call, no
# schedule) holds the run's start-up, which no later step pays again; read as steady state it
# looks like an idle GPU waiting on the host. Start-up takes these forms in a trace (each a span;
# their union is the window's initialization):
#   setup_call      a runtime call that neither enqueues GPU work nor waits for the GPU (not a
#                   launch, copy, memset or sync) and lasts INIT_SETUP_CALL_MIN_MS or more while
#                   the GPU is idle: context creation (in whichever call comes first: the shared
#                   A100 AlexNet trace's cudaDeviceGetStreamPriorityRange took 29.9 s, then
#                   cudaFree 6.0 s, cudaMalloc 0.76 s, cudaStreamCreateWithFlags 0.73 s), handle
#                   and stream creation, the caching allocator's first cudaMalloc/cudaFree. Such a
#                   call takes microseconds in the steady state (at most 0.35 ms with the GPU idle
#                   in the 38 shared and reference traces, AlexNet aside). When such calls fall in
#                   every step of several, it is the allocator's churn each step, not start-up.
#   long_launch     a launch call of INIT_LAUNCH_MIN_MS or more with the GPU idle (below).
#   first_launch    the launch call of a kernel's first run in the trace, INIT_FIRST_LAUNCH_MIN_MS
#                   or more with the GPU idle: lazy loading loads a kernel's module on its first
#                   launch (the shared MI250 trace: 6.5 ms for the first launch of a kernel whose
#                   second launch takes 4.7 us). Steady-state first launches took at most 0.22 ms.
#   first_call      an operator's first call in the window whose own time (less the operators
#                   and runtime calls it holds on its thread) is INIT_FIRST_CALL_MIN_MS or more and
#                   INIT_FIRST_CALL_RATIO times the median of the same operator's later calls (or,
#                   called once, of the GPU time of the kernels it launched), unless a call in a
#                   later step comes within that factor of it: a cost every step pays is steady
#                   state (the DataLoader's aten::cat in the H100 dataloader_workers/bad trace,
#                   55 ms for each step's images, 0.07 ms for its labels). Only an operator that
#                   enqueues GPU work: cuDNN's and cuBLAS's set-up, heuristics and autotuning
#                   (torch.backends.cudnn.benchmark) run in an operator's first call (AlexNet's
#                   first aten::cudnn_convolution: 496 ms of its own, the later ones 0.15 ms at
#                   most); a CPU operator's long call is its data. No steady-state trace here has
#                   a first call that stands out by 1 ms.
#   compile         torch.compile's Dynamo and Inductor work: record_function ranges named
#                   "<what> (dynamo_timed)" (torch/_dynamo/utils.py, dynamo_timed, since
#                   torch 2.0). Not "Torch-Compiled Region", "CompiledFunction" or "TorchDynamo
#                   Cache Lookup": those run the compiled code, every call.
#   first_collective  the first collective (its call on the CPU, or its kernel on the GPU)
#                   stands out from the later ones as a first call does: the first waits for every
#                   rank to finish starting up, and creates the communicator.
# A window of one step without ProfilerStep#N (no schedule) adds no span; the evidence says so.
# Where the reader keeps runtime call names (TraceColumns.runtime_name_id and
# runtime_name_table, as for kernels), the evidence names each set-up call; else it says "a
# runtime call".
#
# A launch call takes microseconds, or blocks while the launch queue is full: CUPTI writes that
# wait as a "Command Buffer Full" overhead event, up to 45 ms in the committed H100 traces, most
# with the GPU busy, and 10 ms in padding_waste/bad's with no GPU work in the trace running: an
# idle GPU is not enough to tell start-up at that length. A launch call of hundreds of
# milliseconds to seconds with the GPU idle waits for nothing on the GPU: the driver creates the
# context or loads a library's modules (3,056 ms, the second launch of the shared A100 AlexNet
# trace, recorded without a warm-up). Shorter, only a kernel's first launch is start-up.
INIT_LAUNCH_MIN_MS = 100.0  # ms: a launch call at least this long...
INIT_LAUNCH_GPU_BUSY_MAX = 0.5  # ...with the GPU busy less than this share of it (every span
# kind that asks for an idle GPU asks this)
INIT_SETUP_CALL_MIN_MS = 10.0  # ms, one runtime call that neither enqueues nor waits
INIT_FIRST_LAUNCH_MIN_MS = 2.0  # ms, the launch call of a kernel's first run
INIT_FIRST_CALL_MIN_MS = 20.0  # ms of an operator's own time in its first call
INIT_FIRST_CALL_RATIO = 10.0  # first call ÷ median of the later calls (or its kernels' time)
# The window is initialization when start-up holds at least half of it: steady-state numbers
# then describe the minority. Where start-up ends early enough to leave half the window after
# it, the steady state is that part.
INIT_MOSTLY_MIN_PCT = 50.0  # % of the window in initialization spans
INIT_STEADY_MIN_PCT = 50.0  # % of the window after the last initialization span
COMPILE_MARKER = "(dynamo_timed)"
# Compiling ranges without the marker: the ones around a frame's whole compile and around its
# backward's (compiled at the first backward), and Dynamo's outermost (torch 2.14 writes them
# as operators, around the marked ones).
COMPILE_RANGE_NAMES = ("entire_frame_compile", "entire_backward_compile", "dynamo")
INIT_KINDS = ("setup_call", "long_launch", "first_launch", "first_call", "compile",
              "first_collective")
INIT_KIND_WORDS = {
    "setup_call": "runtime set-up calls with the GPU idle (context, streams, handles, memory)",
    "long_launch": "long launch calls with the GPU idle (context creation, library loading)",
    "first_launch": "kernels' first launches with the GPU idle (lazy module loading)",
    "first_call": "operators' first calls (cuDNN/cuBLAS set-up, heuristics, autotuning)",
    "compile": "torch.compile compiling (Dynamo/Inductor)",
    "first_collective": "the first collective (ranks starting up, the communicator created)"}
INIT_FIXES = {
    "first_call": "cuDNN and cuBLAS set up on each operator's first call, and "
                  "torch.backends.cudnn.benchmark autotunes each new shape there",
    "first_launch": "lazy loading loads each kernel's module on its first launch",
    "long_launch": "the CUDA context and libraries load on the first launches",
    "setup_call": "the CUDA context, streams and the caching allocator's memory are set up on "
                  "first use",
    "compile": "torch.compile compiles on the first calls: its Dynamo/Inductor time in the "
               "window is initialization, not host overhead",
    "first_collective": "the first collective waits for every rank to start up"}


def is_compile_work(name: str) -> bool:
    """A range of torch.compile compiling (tracing, AOTAutograd, Inductor), not running."""
    return COMPILE_MARKER in name or name in COMPILE_RANGE_NAMES


def compiling_operators(columns: TraceColumns) -> np.ndarray:
    """Per operator (cpu_ops): a compiling range (is_compile_work), or inside one on its thread.
    Compiling writes its steps as operators without the marker too (inductor_compile,
    Scheduler.codegen), and tracing runs ATen operators on fake tensors: of a compiled model's
    cold first call on a CPU, 45,558 of the 47,601 operators."""
    ops = columns.cpu_ops
    compiling = names_where(columns.cpu_op_names, is_compile_work)
    if not compiling.any():
        return compiling
    thread = op_threads(columns)
    inside = compiling.copy()
    for each in np.unique(thread[compiling]).tolist():
        ranges = compiling & (thread == each)
        reach = merge(Spans(ops.start[ranges], ops.end[ranges]))
        on = np.flatnonzero(thread == each)
        k = np.searchsorted(reach.start, ops.start[on], side="right") - 1
        inside[on] |= (k >= 0) & (ops.end[on] <= reach.end[np.maximum(k, 0)])
    return inside


def names_where(names: np.ndarray, test) -> np.ndarray:
    """test(name) for each of `names`, evaluated once per distinct name (a trace repeats a few
    thousand names over its events): all False, without a pass over the events, when none holds."""
    distinct = set(names.tolist())
    hits = {name for name in distinct if test(str(name))}
    if not hits:
        return np.zeros(len(names), bool)
    return np.fromiter((name in hits for name in names.tolist()), bool, len(names))


def gpu_idle_during(columns: TraceColumns, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each [start, end]: the GPU (kernels, copies, memsets) busy less than
    INIT_LAUNCH_GPU_BUSY_MAX of it; never, in a trace without GPU work (a GPU the profiler did
    not record: whether it was idle is unknown). Merges the GPU's work: call it for a few
    candidates."""
    busy = merge(concat(columns.kernels, columns.memcpy, columns.memset))
    if not busy.size:
        return np.zeros(np.shape(start), bool)
    return covered_length(busy, start, end) < INIT_LAUNCH_GPU_BUSY_MAX * (end - start)


def step_of(steps: Spans, at: np.ndarray) -> np.ndarray:
    """The step each instant falls in, the last one started by then (0 before the first)."""
    return np.maximum(np.searchsorted(steps.start, at, side="right") - 1, 0)


def stands_out(first_us: float, later_us: np.ndarray, later_step: np.ndarray) -> bool:
    """A first call that is initialization: INIT_FIRST_CALL_MIN_MS or more, and
    INIT_FIRST_CALL_RATIO times the median of the later calls (`later_us`, none: no test), and no
    call of a later step (`later_step`: which later calls are in one) within that factor of it."""
    if first_us < INIT_FIRST_CALL_MIN_MS * US_PER_MS:
        return False
    if later_us.size and first_us < INIT_FIRST_CALL_RATIO * float(np.median(later_us)):
        return False
    return not (INIT_FIRST_CALL_RATIO * later_us[later_step] >= first_us).any()


def init_span(kind: str, name: str, start: float, end: float) -> dict:
    return {"kind": kind, "name": name, "start_us": float(start), "end_us": float(end),
            "ms": float(end - start) / US_PER_MS}


def runtime_name(columns: TraceColumns, index: int) -> str:
    """A runtime call's name (trace_columns.runtime_name_table)."""
    return str(columns.runtime_name_table[int(columns.runtime_name_id[index])])


def setup_calls(columns: TraceColumns, host: Spans) -> list[dict]:
    """Runtime calls that neither enqueue GPU work nor wait for it, INIT_SETUP_CALL_MIN_MS or
    more with the GPU idle, in the host steps; none when they fall in every step of several."""
    runtime = columns.runtime
    neither = ~(columns.runtime_is_launch | columns.runtime_is_sync | columns.runtime_enqueues)
    long = neither & (runtime.end - runtime.start >= INIT_SETUP_CALL_MIN_MS * US_PER_MS) & (
        runtime.start >= host.start[0]) & (runtime.start < host.end[-1])
    index = np.flatnonzero(long)
    if not index.size:
        return []
    index = index[gpu_idle_during(columns, runtime.start[index], runtime.end[index])]
    if host.size > 1 and np.unique(step_of(host, runtime.start[index])).size == host.size:
        return []  # every step pays it: the steady state's
    return [init_span("setup_call", runtime_name(columns, i), runtime.start[i], runtime.end[i])
            for i in index.tolist()]


def slow_launches(columns: TraceColumns, host: Spans) -> list[dict]:
    """Launch calls in the host steps with the GPU idle: INIT_LAUNCH_MIN_MS or more (long_launch),
    or INIT_FIRST_LAUNCH_MIN_MS or more for a kernel's first run in the trace (first_launch)."""
    runtime = columns.runtime
    duration = runtime.end - runtime.start
    calls = columns.runtime_is_launch & (runtime.start >= host.start[0]) & (
        runtime.start < host.end[-1])
    index = np.flatnonzero(calls & (duration >= INIT_FIRST_LAUNCH_MIN_MS * US_PER_MS))
    if not index.size:
        return []
    index = index[gpu_idle_during(columns, runtime.start[index], runtime.end[index])]
    long = duration[index] >= INIT_LAUNCH_MIN_MS * US_PER_MS
    # Each kernel name's first run in the trace, and the correlation id of its launch.
    names = columns.kernel_name_id
    earliest = np.full(len(columns.kernel_name_table), np.inf)
    np.minimum.at(earliest, names, columns.kernels.start)
    opening = columns.kernels.start == earliest[names]
    first = np.isin(columns.runtime_correlation[index], columns.kernel_correlation[opening])
    median_us = float(np.median(duration[calls]))
    found = []
    for i, is_long, is_first in zip(index.tolist(), long.tolist(), first.tolist()):
        if is_long or is_first:
            kernel = np.flatnonzero(columns.kernel_correlation == columns.runtime_correlation[i])
            found.append({**init_span(
                "long_launch" if is_long else "first_launch",
                columns.kernel_name_table[columns.kernel_name_id[kernel[0]]] if kernel.size
                else "a launch call", runtime.start[i], runtime.end[i]),
                "median_launch_us": median_us})
    return found


def own_time(columns: TraceColumns, i: int) -> tuple[float, np.ndarray]:
    """Operator i's own time (µs): its span less the operators and runtime calls it holds on its
    thread (an operator with the very same span is the same call, one level of a chain:
    aten::linear > aten::addmm in a trace of whole µs); and the indices of those runtime calls."""
    ops, runtime = columns.cpu_ops, columns.runtime
    start, end, thread = ops.start[i], ops.end[i], columns.cpu_op_thread[i]
    held = np.flatnonzero((ops.start >= start) & (ops.end <= end))  # then the few on its thread
    held = held[(columns.cpu_op_thread[held] == thread)
                & ((ops.start[held] > start) | (ops.end[held] < end))]
    calls = np.flatnonzero((runtime.start >= start) & (runtime.end <= end))
    calls = calls[columns.runtime_thread[calls] == thread]
    inner = merge(concat(Spans(ops.start[held], ops.end[held]),
                         Spans(runtime.start[calls], runtime.end[calls])))
    return float(end - start - covered_length(inner, [start], [end])[0]), calls


def held_runtime_us(columns: TraceColumns, index: np.ndarray) -> np.ndarray:
    """For each of these calls of one operator (sorted by start; calls of one name on one thread
    do not overlap), the time of the runtime calls on its thread inside it (they do not overlap
    either)."""
    ops, runtime = columns.cpu_ops, columns.runtime
    held = np.zeros(index.size)
    thread = columns.cpu_op_thread[index]
    for tid in np.unique(thread).tolist():
        mine = np.flatnonzero(thread == tid)
        start, end = ops.start[index[mine]], ops.end[index[mine]]
        calls = np.flatnonzero(columns.runtime_thread == tid)
        k = np.searchsorted(start, runtime.start[calls], side="right") - 1  # the op started last
        inside = (k >= 0) & (runtime.end[calls] <= end[np.maximum(k, 0)])
        held[mine] = np.bincount(k[inside], weights=(runtime.end - runtime.start)[calls[inside]],
                                 minlength=mine.size)
    return held


def first_calls(columns: TraceColumns, host: Spans) -> list[dict]:
    """Operators' first calls that stand out (stands_out; a single call against the GPU time of
    the kernels it launched) and enqueue GPU work. Only operators INIT_FIRST_CALL_MIN_MS long are
    looked at, one name at a time (a few in a steady-state trace), the cheap tests first: a
    comparison of names runs over the calls long enough to matter before it runs over all."""
    ops, runtime = columns.cpu_ops, columns.runtime
    if not ops.size or not runtime.size:
        return []
    low, high = host.start[0], host.end[-1]
    in_window = (ops.start >= low) & (ops.start < high)
    if columns.cpu_op_is_region.size:  # the harness's regions written as operators (2021)
        in_window &= ~columns.cpu_op_is_region
    duration = ops.end - ops.start
    long = np.flatnonzero(in_window & (duration >= INIT_FIRST_CALL_MIN_MS * US_PER_MS))
    names = columns.cpu_op_names
    found, seen = [], set()
    for i in long[np.argsort(ops.start[long], kind="stable")].tolist():
        name = names[i]
        if name in seen:
            continue
        seen.add(name)
        own, inside = own_time(columns, i)
        if own < INIT_FIRST_CALL_MIN_MS * US_PER_MS or not columns.runtime_enqueues[inside].any():
            continue
        # The other calls long enough to come within the factor of it (own time is at most a
        # span), and their own time at most: less the runtime calls they hold (not the
        # operators: an upper bound is enough to tell a first call that stands out).
        rivals = np.flatnonzero(in_window & (INIT_FIRST_CALL_RATIO * duration >= own))
        rivals = rivals[(names[rivals] == name) & (rivals != i)]
        rivals = rivals[np.argsort(ops.start[rivals], kind="stable")]
        rival_us = duration[rivals] - held_runtime_us(columns, rivals)
        step = step_of(host, ops.start[np.r_[i, rivals]])
        if (ops.start[rivals] < ops.start[i]).any() or (
                INIT_FIRST_CALL_RATIO * rival_us[step[1:] > step[0]] >= own).any():
            continue  # not its first call, or a later step pays as much: steady state
        if (names[in_window & (ops.start < ops.start[i])] == name).any():
            continue  # a shorter call of it came first
        later = np.flatnonzero(in_window & (ops.start >= ops.start[i]) & (names == name))
        later = later[later != i]
        later = later[np.argsort(ops.start[later], kind="stable")]
        if later.size:
            compared = float(np.median(duration[later] - held_runtime_us(columns, later)))
            if own < INIT_FIRST_CALL_RATIO * compared:
                continue
        else:  # called once: against the GPU time of what it launched
            gpu, correlation = gpu_ops(columns)
            launched = np.isin(correlation, columns.runtime_correlation[inside])
            compared = float((gpu.end - gpu.start)[launched].sum())
            if own < INIT_FIRST_CALL_RATIO * compared:
                continue
        if not any(span["start_us"] == ops.start[i] and span["end_us"] == ops.end[i]
                   for span in found):  # the same call, one level of a chain
            found.append({**init_span("first_call", str(name), ops.start[i], ops.end[i]),
                          "own_ms": own / US_PER_MS, "later_median_ms": (
                              compared / US_PER_MS if later.size else None),
                          "kernel_ms": None if later.size else compared / US_PER_MS})
    return found


def compile_spans(columns: TraceColumns, host: Spans) -> list[dict]:
    """torch.compile's compiling ranges (is_compile_work: record_function ranges, which torch
    2.14 writes as operators, older releases as annotations) that reach into the host steps,
    outermost only (they nest)."""
    names = np.concatenate([columns.annotation_names, columns.cpu_op_names])
    spans = concat(columns.annotations, columns.cpu_ops)
    marked = names_where(names, is_compile_work)
    marked &= (spans.end > host.start[0]) & (spans.start < host.end[-1])
    index = np.flatnonzero(marked)
    if not index.size:
        return []
    index = index[np.lexsort((-spans.end[index], spans.start[index]))]  # outer ones first
    found, reach = [], -np.inf
    for i in index.tolist():
        if spans.end[i] > reach:  # not inside the last outermost range
            found.append(init_span("compile", str(names[i]), spans.start[i], spans.end[i]))
            reach = spans.end[i]
    return found


def first_collectives(columns: TraceColumns, host: Spans, steps: Spans) -> list[dict]:
    """The first collective call on the CPU (in the host steps) and the first collective kernel
    (in the window), where it stands out from the later ones (stands_out; one alone does not)."""
    found = []
    calls = columns.collective_spans  # sorted by start
    keep = (calls.start >= host.start[0]) & (calls.start < host.end[-1])
    groups = [("a collective call", Spans(calls.start[keep], calls.end[keep]), host)]
    kernel_names = columns.kernel_name_table
    collective_ids = [k for k, name in enumerate(kernel_names) if is_collective_kernel(name)]
    if collective_ids:
        kernels = columns.kernels
        mine = np.isin(columns.kernel_name_id, collective_ids) & (
            kernels.start >= steps.start[0]) & (kernels.start < steps.end[-1])
        index = np.flatnonzero(mine)
        index = index[np.argsort(kernels.start[index], kind="stable")]
        if index.size:
            groups.append((kernel_names[columns.kernel_name_id[index[0]]],
                           Spans(kernels.start[index], kernels.end[index]), steps))
    for name, spans, steps_of_group in groups:
        if spans.size < 2:
            continue
        duration = spans.end - spans.start
        step = step_of(steps_of_group, spans.start)
        if stands_out(float(duration[0]), duration[1:], step[1:] > step[0]):
            found.append({**init_span("first_collective", name, spans.start[0], spans.end[0]),
                          "later_median_ms": float(np.median(duration[1:])) / US_PER_MS})
    return found


def initialization_regime(columns: TraceColumns, host: Spans, steps: Spans) -> dict | None:
    """The initialization in the window (the kinds above), None without any: `spans` (kind, name,
    start_us, end_us, ms; by start), `ms_by_kind` (each kind's union in the window), `pct` (the
    union of all ÷ the window, %), `ends_at_us` (the end of the last span; None when none ends
    inside the window), `steady_pct` (the share of the window after it, %), `first_steady_step`
    (the first host step that starts at or after it, 0-based; None with one step), `mostly`
    (pct >= INIT_MOSTLY_MIN_PCT), `steady_window_us` ([ends_at_us, window end] where steady_pct
    >= INIT_STEADY_MIN_PCT and not mostly, else None), `one_step_capture` (one host step: the
    whole trace, or one ProfilerStep#N), `evidence` (lines) and `fix`. `host`: the host steps
    (trace_steps.host_steps); `steps`: the same extended to their GPU work (the window)."""
    low, high = float(steps.start[0]), float(steps.end[-1])
    span = high - low
    if span <= 0:
        return None
    found = [item for item in (setup_calls(columns, host) + slow_launches(columns, host)
                               + first_calls(columns, host) + compile_spans(columns, host)
                               + first_collectives(columns, host, steps))
             if item["end_us"] > low and item["start_us"] < high]
    # Start-up comes first: the spans in the run of steps, from the first, that each hold one. A
    # span after a step that holds none is the steady state's own (a kernel only a later step
    # launches, a collective that waits on a slow rank), not start-up.
    cut = None
    for k in range(host.size):
        begins = host.start[k] if k else -np.inf
        if not any(begins <= item["start_us"] < host.end[k] for item in found):
            break
        cut = float(host.end[k])
    found = [item for item in found if cut is not None and item["start_us"] < cut]
    if not found:
        return None
    found.sort(key=lambda item: (item["start_us"], -item["end_us"]))
    start = np.array([item["start_us"] for item in found])
    end = np.array([item["end_us"] for item in found])
    kind = np.array([item["kind"] for item in found])
    ms_by_kind = {name: union_in(Spans(start[kind == name], end[kind == name]), low, high)
                  / US_PER_MS for name in INIT_KINDS if (kind == name).any()}
    init_ms = union_in(Spans(start, end), low, high) / US_PER_MS
    pct = 100.0 * init_ms * US_PER_MS / span
    last = float(end.max())
    ends_at = last if last < high else None
    steady_pct = 100.0 * (high - ends_at) / span if ends_at is not None else 0.0
    mostly = pct >= INIT_MOSTLY_MIN_PCT
    first_steady = None
    if ends_at is not None and host.size > 1:
        later = np.flatnonzero(host.start >= ends_at)
        first_steady = int(later[0]) if later.size else None
    one_step = host.size == 1
    result = {
        "spans": found, "ms_by_kind": ms_by_kind, "ms": init_ms, "pct": pct,
        "ends_at_us": ends_at, "steady_pct": steady_pct, "first_steady_step": first_steady,
        "mostly": mostly,
        "steady_window_us": ([ends_at, high] if not mostly and steady_pct >= INIT_STEADY_MIN_PCT
                             else None),
        "one_step_capture": one_step}
    result["evidence"] = initialization_evidence(result, columns, low)
    result["fix"] = initialization_fix(ms_by_kind)
    return result


def span_detail(span: dict) -> str:
    """What one span's evidence adds to its length, by kind."""
    if span["kind"] in ("long_launch", "first_launch"):
        return f"; launch calls take {span['median_launch_us']:.1f} us at the median"
    if span["kind"] == "first_call":
        versus = (f"its later calls at most {span['later_median_ms']:.2f} ms at the median"
                  if span["later_median_ms"] is not None
                  else f"the kernels it launched {span['kernel_ms']:.2f} ms")
        return f", {span['own_ms']:,.1f} ms of it its own; {versus}"
    if span["kind"] == "first_collective":
        return f"; the later ones {span['later_median_ms']:.2f} ms at the median"
    return ""


def initialization_evidence(found: dict, columns: TraceColumns, low: float) -> list[str]:
    """One line per kind found (its time in the window, how many spans, the longest with what
    sets it apart), then where the steady state begins and, for a one-step window, how it was
    recorded. Kinds overlap (a first call holds the set-up calls it makes): their times need not
    add up to the union."""
    lines = []
    for name, ms in found["ms_by_kind"].items():
        mine = [item for item in found["spans"] if item["kind"] == name]
        longest = max(mine, key=lambda item: item["ms"])
        lines.append(f"{INIT_KIND_WORDS[name]}: {ms:,.1f} ms in {len(mine)} "
                     f"span{'s' * (len(mine) > 1)}, the longest {longest['name'][:80]} "
                     f"({longest['ms']:,.1f} ms at {(longest['start_us'] - low) / US_PER_MS:,.1f}"
                     f" ms into the window{span_detail(longest)})")
    if found["ends_at_us"] is None:
        lines.append("no steady state follows it in the window")
    else:
        lines.append(f"the last ends {(found['ends_at_us'] - low) / US_PER_MS:,.1f} ms into the "
                     f"window; {found['steady_pct']:.1f} % of the window follows it")
    if found["one_step_capture"]:
        lines.append("one step recorded" if columns.steps.size else
                     "no ProfilerStep#N: one call recorded under `with profile():`, no schedule")
    return lines


def initialization_fix(ms_by_kind: dict[str, float]) -> str:
    """Profile after warm-up, and why, by the kinds found."""
    why = "; ".join(INIT_FIXES[name] for name in ms_by_kind)
    return (f"profile the steady state: torch.profiler.profile(schedule=torch.profiler.schedule("
            f"wait=1, warmup=1, active=3)) with prof.step() after each iteration, or run a few "
            f"iterations before `with profile():` ({why})")


def initialization_regime_warning(found: dict | None) -> str | None:
    """One line for analyze's warnings: the window's share of initialization, its kinds and
    where the steady state begins."""
    if not found:
        return None
    kinds = ", ".join(f"{INIT_KIND_WORDS[name].split(' (')[0]} {ms:,.1f} ms"
                      for name, ms in found["ms_by_kind"].items())
    after = ("no steady state follows in the window" if found["ends_at_us"] is None else
             f"{found['steady_pct']:.1f} % of the window follows it")
    return (f"the window holds initialization, not steady state: {found['pct']:.1f} % of it "
            f"({found['ms']:,.1f} ms: {kinds}); {after}")


# The fixed causes of the GPU's idle time (defined below, "Why the GPU is idle"); a host region's
# name is a cause of its own, between dataloader and host_sync.
IDLE_CAUSES = ("dataloader", "host_sync", "before_first_op", "launch", "other", "unrecorded")


# --- Host regions: record_function ranges that are host work. -----------------------------------
# A user's record_function("tokenize") around pure-Python work says, by name, what the host does
# while the GPU waits; the DataLoader's __next__ spans are the one such region PyTorch names
# itself (and keep their own cause). A candidate (trace_columns: a user_annotation range, or the
# harness's data/forward/backward in any category; not ProfilerStep#N, the DataLoader's spans or
# the optimizer region, which have metrics and verdicts of their own, nor collectives) is host
# work, decided span by span, when both hold:
#   (a) no runtime call that enqueues GPU work (a launch, graph launch, copy or memset) starts
#       while it is open, on any thread: the GPU gets nothing while it runs. Any thread, not
#       only its own: the harness's "backward" region on the main thread holds no operator and
#       no launch at all in the H100 reference traces, because autograd runs the backward pass
#       on a thread of its own, which launches every kernel while the main thread waits;
#   (b) for at least HOST_REGION_OUTSIDE_OPS_MIN of its time no PyTorch operator (cpu_op, on any
#       thread, the harness's regions written as operators aside) and no collective call is
#       open: its time goes to Python or native code outside torch (a tokenizer, decoding, a
#       metrics client), not to eager operators, which the step breakdown's CPU Exec and the
#       operator tables already name, nor to waiting for other ranks. A "forward" region of a
#       CPU run, all aten ops, is no host region; a pure-Python tokenizer's is.
# Each instant goes to the innermost open qualifying region (the latest started: ranges on one
# thread nest), so nested regions split their time and never count it twice.
# "Almost all": a region that mixes the model's operators with Python is the model's, which the
# operator tables and Python frames explain (on the CPU runs: host_roundtrip/bad's forward, whose
# loss loops in Python, 55 % outside operators; tokenizer_bound/bad's tokenize 100 %).
HOST_REGION_OUTSIDE_OPS_MIN = 0.8  # share of a span's time with no operator or collective open
# The fixed causes' names, and compare's "busy": a region named like one of them (a user's
# record_function("launch")) gets REGION_CLASH_SUFFIX in gpu.idle_by_cause_pct.
REGION_CLASH_SUFFIX = " (region)"


@dataclass
class HostRegions:
    """The instants each host region holds: disjoint segments (sorted by start; less the
    DataLoader's time, which keeps its own cause), the index of each one's region name, and per
    name the share of its qualifying spans' time with no operator open (%)."""
    segments: Spans
    label: np.ndarray
    names: list[str]
    outside_ops_pct: dict[str, float]


def intersect(a: Spans, b: Spans) -> tuple[Spans, np.ndarray]:
    """The pieces where two sets of sorted, disjoint intervals overlap, and for each the index of
    its interval in `a`."""
    first = np.searchsorted(b.end, a.start, side="right")  # the first of b ending after a starts
    past = np.searchsorted(b.start, a.end, side="left")  # b's that start before a ends
    count = np.maximum(past - first, 0)
    index_a = np.repeat(np.arange(a.size), count)
    index_b = (np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
               + np.repeat(first, count))
    start = np.maximum(a.start[index_a], b.start[index_b])
    end = np.minimum(a.end[index_a], b.end[index_b])
    keep = end > start
    return Spans(start[keep], end[keep]), index_a[keep]


def without(spans: Spans, removed: Spans) -> tuple[Spans, np.ndarray]:
    """Sorted, disjoint `spans` less the merged `removed` intervals, and each piece's index in
    `spans`."""
    gaps = Spans(np.r_[-np.inf, removed.end], np.r_[removed.start, np.inf])
    return intersect(spans, gaps)


def innermost(spans: Spans, label: np.ndarray) -> tuple[Spans, np.ndarray]:
    """Each instant some span covers goes to the innermost open then: the latest started (ties:
    the first to end). Returns disjoint segments, sorted, and each one's label. One sweep over
    the spans' ends, a heap of the open ones (a few per step)."""
    bounds = np.unique(np.r_[spans.start, spans.end]).tolist()
    order = np.lexsort((spans.end, spans.start)).tolist()
    starts, ends, labels = spans.start.tolist(), spans.end.tolist(), label.tolist()
    open_spans: list[tuple[float, float, int]] = []  # (-start, end, index): innermost on top
    pieces: list[tuple[float, float, int]] = []
    next_span = 0
    for low, high in zip(bounds, bounds[1:]):
        while next_span < len(order) and starts[order[next_span]] <= low:
            i = order[next_span]
            heapq.heappush(open_spans, (-starts[i], ends[i], i))
            next_span += 1
        while open_spans and open_spans[0][1] <= low:  # ended: an inner span ends first
            heapq.heappop(open_spans)
        if open_spans:
            owner = labels[open_spans[0][2]]
            if pieces and pieces[-1][1] == low and pieces[-1][2] == owner:
                pieces[-1] = (pieces[-1][0], high, owner)
            else:
                pieces.append((low, high, owner))
    return (Spans(np.array([p[0] for p in pieces], dtype=np.float64),
                  np.array([p[1] for p in pieces], dtype=np.float64)),
            np.array([p[2] for p in pieces], dtype=np.int64))


def enqueues_nothing(columns: TraceColumns, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each [start, end): no runtime call that enqueues GPU work (a launch, graph launch,
    copy or memset) starts in it, on any thread. Host regions and host operators are host work
    by this test."""
    enqueue_starts = np.sort(columns.runtime.start[columns.runtime_enqueues])
    return (np.searchsorted(enqueue_starts, end, side="left")
            == np.searchsorted(enqueue_starts, start, side="left"))


def host_regions(columns: TraceColumns) -> HostRegions:
    """The host regions of the whole trace (definition above): which candidates qualify, and the
    instants each name holds, innermost first, less the DataLoader's."""
    candidates = columns.annotations
    duration = candidates.end - candidates.start
    # torch.compile's own ranges ("... (dynamo_timed)": tracing, Inductor's codegen) are compiling,
    # which initialization_regime counts: no host region of the user's.
    compiling = names_where(columns.annotation_names, is_compile_work)
    quiet = enqueues_nothing(columns, candidates.start, candidates.end) & (duration > 0) & (
        ~compiling)
    outside = np.zeros(candidates.size)
    if quiet.any():  # the operators that overlap a quiet candidate (a few), merged
        reach = merge(Spans(candidates.start[quiet], candidates.end[quiet]))
        ops = columns.cpu_ops
        operator = (~columns.cpu_op_is_region if columns.cpu_op_is_region.size
                    else np.ones(ops.size, bool))
        k = np.minimum(np.searchsorted(reach.end, ops.start, side="right"), reach.size - 1)
        overlaps = operator & (ops.start < reach.end[k]) & (ops.end > reach.start[k])
        # A collective's wait for the other ranks (gloo's all-reduce under DDP's backward, say)
        # is communication, not host work: it counts as busy like an operator.
        busy = merge(concat(Spans(ops.start[overlaps], ops.end[overlaps]),
                            columns.collective_spans))
        outside[quiet] = duration[quiet] - covered_length(
            busy, candidates.start[quiet], candidates.end[quiet])
    qualifies = quiet & (outside >= HOST_REGION_OUTSIDE_OPS_MIN * duration)
    names, label = np.unique(columns.annotation_names[qualifies].astype(str),
                             return_inverse=True)
    spans = Spans(candidates.start[qualifies], candidates.end[qualifies])
    segments, owner = innermost(spans, label.ravel())
    segments, piece_of = without(segments, merge(columns.dataloader))
    time = np.bincount(label.ravel(), weights=duration[qualifies], minlength=names.size)
    time_outside = np.bincount(label.ravel(), weights=outside[qualifies], minlength=names.size)
    return HostRegions(segments, owner[piece_of], [str(name) for name in names],
                       {str(name): 100.0 * float(o) / float(t) if t > 0 else 0.0
                        for name, o, t in zip(names, time_outside, time)})


def region_cause(name: str) -> str:
    """The key of a host region's idle cause: its name, unless a fixed cause (or compare's
    "busy") has it."""
    return name + REGION_CLASH_SUFFIX if name in (*IDLE_CAUSES, "busy") else name


def host_region_metrics(regions: HostRegions, window: tuple[float, float], n_steps: int,
                        idle_pct: dict[str, float] | None) -> dict[str, dict]:
    """Per host region holding some of the window, largest first: `pct`, its share of the window
    (the instants it holds, DataLoader time aside), `ms_per_step`, `outside_ops_pct` (of its
    qualifying spans' time, with no operator open) and, on a GPU trace, `gpu_idle_pct`: the
    GPU's idle time it is the cause of, ÷ window (gpu.idle_by_cause_pct)."""
    low, high = window
    span = high - low
    held, index = intersect(regions.segments, Spans(np.array([low]), np.array([high])))
    held_us = np.bincount(regions.label[index], weights=held.end - held.start,
                          minlength=len(regions.names))
    table = {}
    for i in np.argsort(-held_us, kind="stable").tolist():
        if held_us[i] <= 0 or span <= 0:
            continue
        name = regions.names[i]
        table[name] = {
            "pct": 100.0 * float(held_us[i]) / span,
            "ms_per_step": float(held_us[i]) / US_PER_MS / n_steps,
            "outside_ops_pct": regions.outside_ops_pct[name],
            "gpu_idle_pct": None if idle_pct is None else idle_pct.get(region_cause(name), 0.0)}
    return table


# --- Why the GPU is idle. ----------------------------------------------------------------------

# Holistic Trace Analysis splits idle time into host wait (the CPU does not enqueue kernels fast
# enough), kernel wait (short gaps between kernels enqueued in time) and other; AMD's TraceLens
# splits GPU time into computation, exposed communication, exposed memcpy and idle, and names
# launch overhead, syncs and pipeline bubbles as idle's causes. Ours, per idle instant, the first
# that holds (the fixed ones in IDLE_CAUSES, defined before the host regions above):
#   dataloader       a DataLoader __next__ span is open: the host is fetching the next batch.
#   <region name>    a host region is open (host_regions; the innermost names it): the host does
#                    work that enqueues nothing. Before host_sync: in a gap a sync ended, a
#                    region that then runs is still why the GPU gets nothing.
#   host_sync        the rest of a gap a host sync returns in: the GPU drained its queue for the
#                    host (the gaps gpu.sync_idle_pct counts).
#   before_first_op  the rest of the gap that opens the window, before the GPU's first op in it:
#                    on a trace without ProfilerStep the window opens at the first CPU op, and
#                    the GPU has nothing to do until the host has started (a graph replay's
#                    set-up, say); no launch of the steady state is late there.
#   launch           the part of a gap from its start until the moment the op that ends it was
#                    enqueued (of several ops that start together, the first enqueued): the GPU
#                    ran dry before the host enqueued more (Python, dispatch, launch calls: HTA's
#                    host wait). An op is enqueued when its launch call returns, or earlier: when
#                    the first op of the same launch (same correlation id: a CUDA graph's
#                    kernels) starts, or when it starts itself.
#   other            the rest: the part of a gap after its op was enqueued (HTA's kernel wait,
#                    waits on other streams or events, dependencies inside a CUDA graph), a GPU
#                    op with no launch call in the trace, and the idle tail after the last op.
#   unrecorded       (before all the others, listed last) a stream held a kernel launched
#                    before the recording began (its correlation id below the trace's first
#                    API call's), so the GPU ran, or waited on, work the trace does not hold
#                    (unrecorded_work): not idle as far as the trace can tell.


def enqueue_times(columns: TraceColumns) -> tuple[Spans, np.ndarray]:
    """Every GPU op (kernel, copy, memset) sorted by start, and when it was enqueued at the
    latest (NaN: no runtime call in the trace with its correlation): the end of the runtime call
    that launched it, or the start of the first op that call launched, or its own start."""
    gpu, correlation = gpu_ops(columns)
    order = np.argsort(gpu.start, kind="stable")
    gpu, correlation = Spans(gpu.start[order], gpu.end[order]), correlation[order]
    call = launching_call(columns, correlation)
    launched = np.full(gpu.size, np.nan)
    launched[call >= 0] = columns.runtime.end[call[call >= 0]]
    # Sorted by start, the first op of each correlation id is the first it launched to start.
    _, first, group = np.unique(correlation, return_index=True, return_inverse=True)
    return gpu, np.minimum(launched, gpu.start[first][group])  # NaN stays NaN


def unrecorded_work(columns: TraceColumns, window: tuple[float, float]) -> Spans:
    """The stretches of the window in which a stream held a kernel launched before the recording
    began (merged; GPU work inside them still counts as busy, so only their idle part matters).
    CUPTI records a kernel only if it was launched while the profiler's activities were on (from
    the schedule's warm-up step), and the trace keeps only the active steps' API calls. Their
    correlation ids count up, one per call, so a kernel whose id is below the trace's first call
    and has no launch call in the trace was queued before the active steps. A stream runs in
    order: from the window's start (or its previous kernel's end) until such a kernel starts,
    that stream ran work launched before the warm-up, which no trace holds, or waited on such
    work (an event of another stream, taken before the recording). A GPU-bound loop more than a
    step ahead of the host shows this at the window's start: the H100 reference's
    dataloader_workers/fixed waits on the previous step's backward, launched in the warm-up step."""
    low, high = window
    calls = columns.runtime_correlation[columns.runtime_correlation > 0]
    if not calls.size:  # no API call in the trace (a GPU-only trace): nothing to tell apart
        return Spans.empty()
    correlation = columns.kernel_correlation
    before = (correlation > 0) & (correlation < calls.min())
    before &= launching_call(columns, correlation) < 0
    starts, ends = [], []
    for stream in np.unique(columns.kernel_stream[before]):
        mine = np.flatnonzero(columns.kernel_stream == stream)
        mine = mine[np.argsort(columns.kernels.start[mine], kind="stable")]
        end = columns.kernels.end[mine]
        previous_end = np.r_[low, np.maximum.accumulate(end)[:-1]]
        queued = before[mine]
        starts.append(np.maximum(previous_end[queued], low))
        ends.append(np.minimum(columns.kernels.start[mine][queued], high))
    if not starts:
        return Spans.empty()
    start, end = np.concatenate(starts), np.concatenate(ends)
    keep = end > start
    return merge(Spans(start[keep], end[keep]))


def idle_by_cause_pct(columns: TraceColumns, busy: Spans, window: tuple[float, float],
                      sync_ends: np.ndarray, regions: HostRegions | None = None,
                      unrecorded: Spans | None = None) -> dict[str, float]:
    """The GPU's idle time in the window split by cause (IDLE_CAUSES, and each host region that
    holds some of the window, by region_cause), each ÷ window, in %: they add up to 100 -
    union(kernels, copies, memsets in the window) ÷ window. `busy`: merged GPU work;
    `sync_ends`: when each host sync in the steps returned; `regions`: host_regions';
    `unrecorded`: unrecorded_work's stretches, whose idle part goes to "unrecorded" first."""
    low, high = window
    span = high - low
    result = dict.fromkeys(IDLE_CAUSES, 0.0)
    if span <= 0:
        return result
    unrecorded_us = 0.0
    if unrecorded is not None and unrecorded.size:
        # The GPU ran work the trace does not hold, or waited on it: no cause below applies.
        busy_us = union_in(busy, low, high)
        busy = merge(concat(busy, unrecorded))
        unrecorded_us = union_in(busy, low, high) - busy_us
    # Gap k: from busy interval k-1's end (or `low`) to busy interval k's start (or `high`).
    gap_start, gap_end = np.r_[low, busy.end], np.r_[busy.start, high]
    start, end = np.maximum(gap_start, low), np.minimum(gap_end, high)
    length = (end - start).clip(min=0)
    end = np.maximum(end, start)
    loader = merge(columns.dataloader)
    dataloader = covered_length(loader, start, end)
    # The host regions' segments lie outside the DataLoader's spans: what they cover of each gap
    # comes after it. Each region's idle time: its segments' overlap with the gaps.
    held = loader
    region_us: dict[str, float] = {}
    if regions is not None and regions.segments.size:
        in_window, index = intersect(regions.segments, Spans(np.array([low]), np.array([high])))
        gaps = length > 0
        idle = covered_length(Spans(start[gaps], end[gaps]), in_window.start, in_window.end)
        per_name = np.bincount(regions.label[index], weights=idle,
                               minlength=len(regions.names))
        region_us = {region_cause(name): float(us) for name, us, present in zip(
            regions.names, per_name, np.bincount(regions.label[index],
                                                 minlength=len(regions.names)))
            if present}
        held = merge(concat(loader, in_window))
    hosted = covered_length(held, start, end)  # DataLoader and host regions
    rest = length - hosted

    synced = np.zeros(length.size, bool)
    k = gap_of(sync_ends[(sync_ends >= low) & (sync_ends <= high)], busy)
    synced[k[k >= 0]] = True
    # The gap the window opens in, if the GPU is idle then: the first that reaches into it.
    opening = np.zeros(length.size, bool)
    reaching = np.flatnonzero(gap_end > low)
    if reaching.size and gap_start[reaching[0]] <= low:
        opening[reaching[0]] = True
    until = start.copy()  # each gap's launch part runs from its start to `until`
    if busy.size:
        gpu, enqueued = enqueue_times(columns)
        # The ops that open busy interval k start at its start (on several streams at once, at
        # times): the first of them to be enqueued decides.
        first = np.searchsorted(gpu.start, busy.start, side="left")
        after = np.searchsorted(gpu.start, busy.start, side="right")  # first > its start
        known = np.r_[np.where(np.isnan(enqueued), np.inf, enqueued), np.inf]  # inf: unknown
        # min over each [first, after) range: reduceat over the ranges and the runs between them
        earliest = np.minimum.reduceat(known, np.column_stack([first, after]).ravel())[::2]
        until[:-1] = np.where(np.isfinite(earliest),  # unknown: no launch part
                              np.clip(earliest, start[:-1], end[:-1]), start[:-1])
    launch = (until - start) - covered_length(held, start, until)
    plain = ~synced & ~opening
    result["dataloader"] = float(dataloader.sum())
    result["host_sync"] = float(rest[synced].sum())
    result["before_first_op"] = float(rest[~synced & opening].sum())
    result["launch"] = float(launch[plain].sum())
    result["other"] = float((rest - launch)[plain].sum())
    result["unrecorded"] = unrecorded_us
    # In the order of precedence: the DataLoader, the host regions, then the rest.
    ordered = {"dataloader": result.pop("dataloader"), **region_us, **result}
    return {cause: 100.0 * us / span for cause, us in ordered.items()}
