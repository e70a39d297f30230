"""The numbers read off a trace's columns: the steps (extended to the GPU work they launched),
each step's time breakdown, and the GPU metrics the verdicts read."""
from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass

import numpy as np

from common.intervals import Spans, clip, concat, covered_length, merge, total, union_in
from common.kernel_names import is_gemm, uses_tensor_cores, uses_tf32
from common.trace import BYTES_PER_MB
from common.syncs import HostSyncs, gap_of, host_syncs, step_index, sync_metrics
from common.trace_columns import (
    OPTIMIZER_REGION,
    ROLE_REGION,
    TraceColumns,
    is_collective_kernel,
    name_role,
)

# Definitions (sources in common/README.md, "Analyzing a trace"):
#   steps        ProfilerStep#N spans (none: the whole trace is one step), each extended to the end
#                of the GPU work launched inside it (runtime call -> kernel by correlation id), the
#                TensorBoard plugin's rule. The window runs from the first step's start to the last
#                step's end; the host window over the ProfilerStep#N spans themselves (or the CPU
#                extent), where the CPU ran its part of them: CPU-side facts are read there.
#   utilization  union of kernels in the window / window (plugin "GPU Utilization").
#   idle         1 - union(kernels, memcpy, memset) / (last GPU end - first GPU start), whole
#                trace (Holistic Trace Analysis temporal breakdown), on float timestamps.
#   dataloader   union of enumerate(DataLoader)#...__next__ spans in the window / window.
#   syncs        host syncs in the steps, each the cause of the operator that issued it, and the
#                GPU idle in the gaps they return in (common/syncs.py).
#   host regions record_function ranges that are host work: while one is open no GPU work is
#                enqueued, and for at least four fifths of its time no operator or collective
#                call runs (host_regions).
#   idle causes  each idle instant of the GPU in the window goes to the first that holds of:
#                DataLoader (a __next__ span is open), a host region (by name, the innermost),
#                host sync (a sync returns in its gap), launch (the gap's next GPU op was
#                enqueued after the gap began), other.
#   breakdown    each instant of a step goes to the first active of kernel > memcpy > memset >
#                runtime > DataLoader > CPU Exec (operator spans only) > other (plugin Overview).

US_PER_MS = 1000.0
SHORT_KERNEL_US = 10.0  # "short" kernel, µs: the issue's and peers' launch-overhead cut

BREAKDOWN_ROLES = ("kernel", "memcpy", "memset", "runtime", "dataloader", "cpu_exec", "other")
# The TensorBoard plugin's Overview breakdown assigns each instant of a step to the first of these
# roles active then (Kernel > Memcpy > Memset > Runtime > DataLoader > CPU Exec > Other).

# --- Steps and their extension to the GPU work they launched. ----------------------------------

def host_steps(columns: TraceColumns) -> Spans:
    """ProfilerStep#N spans; with none, the whole trace (its CPU side) is one step."""
    if columns.steps.size:
        return columns.steps
    low, high = columns.cpu_extent or columns.all_extent
    return Spans(np.array([low]), np.array([high]))


def runtime_step_index(columns: TraceColumns, steps: Spans) -> np.ndarray:
    """For each runtime call, the host step that wholly contains it (-1: none)."""
    return step_index(steps, columns.runtime)


def gpu_ops(columns: TraceColumns) -> tuple[Spans, np.ndarray]:
    """Every GPU op (kernels, then copies, then memsets) and its correlation id."""
    return (concat(columns.kernels, columns.memcpy, columns.memset),
            np.concatenate([columns.kernel_correlation, columns.memcpy_correlation,
                            columns.memset_correlation]))


def launching_call(columns: TraceColumns, correlation: np.ndarray) -> np.ndarray:
    """For each correlation id (of a GPU op), the index of the runtime call that carries it and so
    launched the op; -1 where none does."""
    known = np.flatnonzero(columns.runtime_correlation >= 0)
    order = known[np.argsort(columns.runtime_correlation[known], kind="stable")]
    by_correlation = columns.runtime_correlation[order]
    if not by_correlation.size:
        return np.full(correlation.size, -1)
    position = np.clip(np.searchsorted(by_correlation, correlation), 0, by_correlation.size - 1)
    found = (by_correlation[position] == correlation) & (correlation >= 0)
    return np.where(found, order[position], -1)


def extend_steps(columns: TraceColumns, steps: Spans, runtime_step: np.ndarray) -> Spans:
    """The TensorBoard plugin's rule (torch_tb_profiler StepParser._update_steps_duration): a step
    ends when the GPU work launched by the runtime calls inside it ends (linked by correlation
    id), and starts no earlier than the previous step's end. Unlike the plugin, trailing steps
    whose GPU work looks incompletely captured are kept."""
    gpu, gpu_correlation = gpu_ops(columns)
    if not gpu.size or not (runtime_step >= 0).any():
        return steps
    call = launching_call(columns, gpu_correlation)
    matched = call >= 0
    matched[matched] = runtime_step[call[matched]] >= 0  # launched inside a step
    if not matched.any():
        return steps
    gpu_step = runtime_step[call[matched]]
    device_first = np.full(steps.size, np.inf)
    device_last = np.full(steps.size, -np.inf)
    np.minimum.at(device_first, gpu_step, gpu.start[matched])
    np.maximum.at(device_last, gpu_step, gpu.end[matched])

    previous_end = float(steps.start[0])
    if np.isfinite(device_first[0]):  # GPU work from before the steps that ends before step 0's
        unmatched_end = gpu.end[~matched]
        earlier = unmatched_end[unmatched_end < device_first[0]]
        if earlier.size:
            previous_end = max(previous_end, float(earlier.max()))
    start, end = steps.start.copy(), steps.end.copy()
    for i in range(steps.size):
        start[i] = max(previous_end, steps.start[i])
        end[i] = max(steps.end[i], device_last[i], start[i])
        previous_end = end[i]
    return Spans(start, end)


# --- The step breakdown (the plugin's Overview). ------------------------------------------------

def step_breakdown_ms(steps: Spans, role_spans: list[Spans]) -> np.ndarray:
    """[step, role] milliseconds: each instant of a step goes to the first active role (the
    BREAKDOWN_ROLES priority), the rest to "other". Role r's share of a step is what the union of
    roles 0..r covers of it less what the union of roles 0..r-1 covers (steps are disjoint)."""
    low, high = float(steps.start.min()), float(steps.end.max())
    table = np.zeros((steps.size, len(role_spans) + 1))
    union, covered_before = Spans.empty(), np.zeros(steps.size)
    for index, spans in enumerate(role_spans):
        union = merge(concat(union, clip(spans, low, high)))
        covered = covered_length(union, steps.start, steps.end)
        table[:, index] = covered - covered_before
        covered_before = covered
    table[:, -1] = (steps.end - steps.start) - covered_before
    return table / US_PER_MS


# --- Time per operator and per kernel name (compare's "what changed"). ------------------------

@dataclass
class TimeByName:
    """Time (ms per step) and calls per step of each name, for what started inside the steps:
    CPU operators (in the host window) by self time (less the operators they hold on their
    thread, as the profiler's "Self CPU" column: a chain aten::linear > aten::addmm does not
    count twice) and GPU kernels (in the window)."""
    operators: dict[str, tuple[float, float]]
    kernels: dict[str, tuple[float, float]]


def per_name(codes: np.ndarray, names: list, duration_us: np.ndarray,
             n_steps: int) -> dict[str, tuple[float, float]]:
    """name -> (ms per step, calls per step), from each event's code into `names`."""
    total_us = np.bincount(codes, weights=duration_us, minlength=len(names))
    calls = np.bincount(codes, minlength=len(names))
    table: dict[str, tuple[float, float]] = {}
    for i in np.flatnonzero(calls).tolist():  # two codes of one name (never seen) add up
        ms, count = table.get(str(names[i]), (0.0, 0.0))
        table[str(names[i])] = (ms + float(total_us[i]) / US_PER_MS / n_steps,
                                count + float(calls[i]) / n_steps)
    return table


def self_time_us(ops: Spans, thread: np.ndarray) -> np.ndarray:
    """Each op's duration less its direct children's: the ops it holds on its thread (ops on one
    thread nest). One sweep per thread with a stack of the open ops."""
    duration = ops.end - ops.start
    children = np.zeros(ops.size)
    ends, threads = ops.end.tolist(), thread.tolist()
    stack: list[int] = []
    current = None
    for i in np.lexsort((-ops.end, ops.start, thread)).tolist():  # parents before children
        if threads[i] != current:
            stack, current = [], threads[i]
        while stack and ends[stack[-1]] < ends[i]:  # ended before i, or overlaps it: no parent
            stack.pop()
        if stack:
            children[stack[-1]] += duration[i]
        stack.append(i)
    return (duration - children).clip(min=0)


def kernels_of_steps(columns: TraceColumns, window: tuple[float, float],
                     host_window: tuple[float, float]) -> np.ndarray:
    """Which kernels the recorded steps ran: those launched in the host window (runtime call ->
    kernel by correlation; a CUDA graph's kernels share their cudaGraphLaunch's), and those with
    no launch in the trace (NCCL kernels from an untraced thread) that start in the window, on a
    stream, once that stream's first kernel launched in the steps has begun. When the window
    opens, a GPU-bound run's GPU is still working through the queue of the step before the
    recording, whose launches the profiler's warm-up did not keep: counted by the window alone,
    the H100 dataloader_workers/fixed trace ran every kernel 4 times a step for 3 steps' worth,
    and identical kernels read as changed. Without runtime calls in the trace (an MI210 trace
    without CPU events), the window's kernels."""
    kernels = columns.kernels
    low, high = window
    in_window = (kernels.start >= low) & (kernels.start < high)
    runtime = columns.runtime
    if not runtime.size:
        return in_window
    call = launching_call(columns, columns.kernel_correlation)
    launched = (runtime.start >= host_window[0]) & (runtime.start < host_window[1])
    ours = (call >= 0) & launched[np.maximum(call, 0)]
    unmatched = in_window & (call < 0)
    if not unmatched.any():
        return ours
    # Per stream, the start of its first kernel launched in the steps (-inf: none, so a stream
    # the steps launched nothing on counts from the window's start).
    streams, stream_of = np.unique(columns.kernel_stream, return_inverse=True)
    first_start = np.full(streams.size, np.inf)
    np.minimum.at(first_start, stream_of[ours], kernels.start[ours])
    first_start[np.isinf(first_start)] = -np.inf
    begun = kernels.start >= first_start[stream_of]
    return ours | (unmatched & begun)


def time_by_name(columns: TraceColumns, window: tuple[float, float], n_steps: int, *,
                 host_window: tuple[float, float]) -> TimeByName:
    """Operators' self time in the host window, per name and step; kernels' time per name and
    step, of the kernels the recorded steps ran (kernels_of_steps)."""
    low, high = host_window
    ops = columns.cpu_ops
    self_us = self_time_us(ops, columns.cpu_op_thread)
    in_window = (ops.start >= low) & (ops.start < high)
    # Names are interned strings (trace_columns.read_cpu_group): grouping by identity is grouping
    # by name, without sorting Python strings.
    op_names = columns.cpu_op_names[in_window]
    _, first, codes = np.unique(np.fromiter(map(id, op_names), np.int64, op_names.size),
                                return_index=True, return_inverse=True)
    operators = per_name(codes.ravel(), list(op_names[first]), self_us[in_window], n_steps)
    in_window = kernels_of_steps(columns, window, host_window)
    kernels = columns.kernels
    return TimeByName(operators, per_name(columns.kernel_name_id[in_window],
                                          columns.kernel_name_table,
                                          (kernels.end - kernels.start)[in_window], n_steps))


# --- Copies between host and device, and round trips. ----------------------------------------

def copy_calls(columns: TraceColumns, runtime_step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The runtime calls in the host steps that issued a host-to-device or device-to-host copy
    (by correlation), by start, and their copies (indices into columns.memcpy). A collective's
    own staging copies are left out: gloo all-reduces CUDA tensors through host memory, a copy
    down and up per bucket inside its spans (the H100 ddp_no_sync traces: every one of their 216
    such copies lies in a collective span or c10d operator), which is the backend's, not a round
    trip the user wrote. Limit: a user's copy made while a collective span is open (on any
    thread) is left out with them."""
    call = launching_call(columns, columns.memcpy_correlation)  # per copy
    copies = np.flatnonzero(call >= 0)
    copies = copies[runtime_step[call[copies]] >= 0]
    calls = call[copies]
    host_device = columns.memcpy_h2d[copies] | columns.memcpy_d2h[copies]
    collectives = merge(concat(columns.collective_spans, columns.collective_ops))
    at = columns.runtime.start[calls]
    inside = covered_length(collectives, at, np.nextafter(at, np.inf)) > 0
    keep = host_device & ~inside
    calls, copies = calls[keep], copies[keep]
    by_start = np.argsort(columns.runtime.start[calls], kind="stable")
    return calls[by_start], copies[by_start]


# A copy up answers a copy down when their sizes are within this factor of each other: the same
# values, perhaps in another dtype (.tolist() of float32 comes back as float64 from
# torch.tensor(list): 2x; int64 indices as int32: 2x). The next batch's input copy is MBs against
# a scalar read's 4 bytes. Copies of unknown size (a trace without "bytes") never pair: without
# sizes a round trip cannot be told from two unrelated copies.
ROUND_TRIP_SIZE_RATIO_MAX = 4.0


def sizes(columns: TraceColumns, copies: np.ndarray) -> np.ndarray:
    return (columns.memcpy_bytes[copies] if columns.memcpy_bytes.size
            else np.full(copies.size, np.nan))


def same_data(down: float, up: float) -> bool:
    return (down > 0 and up > 0
            and max(down, up) / min(down, up) <= ROUND_TRIP_SIZE_RATIO_MAX)  # NaN: False


def copy_metrics(columns: TraceColumns, copied: tuple[np.ndarray, np.ndarray],
                 runtime_step: np.ndarray, n_steps: int) -> dict:
    """Per step, the copies each way (count, MB where the trace writes their bytes, ms on the
    GPU) and the round trips: a device-to-host copy answered, later in the same step, by a
    host-to-device one of about its size (ROUND_TRIP_SIZE_RATIO_MAX; data taken to the host and
    sent back: .cpu() -> numpy -> .to(device), .tolist() -> torch.tensor(list, device=...)),
    each copy down paired once."""
    calls, copies = copied  # copy_calls'
    duration_ms = (columns.memcpy.end - columns.memcpy.start)[copies] / US_PER_MS
    size_of = sizes(columns, copies)
    megabytes = size_of / BYTES_PER_MB
    per_direction = {}
    for direction, mask in (("h2d", columns.memcpy_h2d[copies]),
                            ("d2h", columns.memcpy_d2h[copies])):
        known = mask & ~np.isnan(megabytes)
        per_direction[direction] = {
            "count": float(mask.sum()) / n_steps,
            "mb": float(megabytes[known].sum()) / n_steps if known.any() or not mask.any()
            else None,
            "ms": float(duration_ms[mask].sum()) / n_steps}
    round_trips = 0
    step_of = runtime_step[calls]
    for step in np.unique(step_of):
        mine = step_of == step
        waiting: list[float] = []  # bytes of this step's copies down not yet answered
        for d2h, size in zip(columns.memcpy_d2h[copies[mine]].tolist(), size_of[mine].tolist()):
            if d2h:
                waiting.append(size)
                continue
            match = next((i for i, down in enumerate(waiting) if same_data(down, size)), None)
            if match is not None:
                del waiting[match]
                round_trips += 1
    return {"copies_per_step": per_direction, "round_trips_per_step": round_trips / n_steps}


# --- The optimizer and attention, from operator names and shapes. -----------------------------

# Operators that update many tensors at once: torch.optim's foreach (aten::_foreach_mul_, ...) and
# fused (aten::_fused_adamw_, aten::_fused_sgd_) implementations.
MULTI_TENSOR_MARKERS = ("_foreach_", "_fused_")
# scaled_dot_product_attention and the kernels it dispatches to (aten::_scaled_dot_product_flash_
# attention, ..._efficient_attention, ..._cudnn_attention, ..._flash_attention_for_cpu).
SDPA_MARKER = "scaled_dot_product"


def ops_named(columns: TraceColumns, keep, mask: np.ndarray) -> np.ndarray:
    """Which of the operators under `mask` have a name for which keep(name) holds (decided once
    per distinct name)."""
    names = columns.cpu_op_names[mask]
    verdict = {name: keep(name) for name in set(names.tolist())}
    return np.fromiter((verdict[name] for name in names), bool, names.size)


def optimizer_metrics(columns: TraceColumns, window: tuple[float, float], n_steps: int, *,
                      host_window: tuple[float, float]) -> dict | None:
    """The optimizer region (our "optimizer" spans and torch.optim's own Optimizer.step#...
    ones) in the host window, and the operators that start inside it; None without. Its time per
    step is the longer of two: the CPU's time in it outside runtime calls (where a GPU-bound step
    waits for a full launch queue, or a sync) and, on a GPU, the region's copies on the GPU
    timeline (columns.gpu_optimizer, in the window): the CPU's side when launching is what costs,
    the GPU's when the update's kernels are. Its share: of the window, as every share here."""
    region = clip(merge(columns.regions[OPTIMIZER_REGION]), *host_window)
    if not region.size:
        return None
    ops = columns.cpu_ops
    index = np.searchsorted(region.start, ops.start, side="right") - 1
    inside = index >= 0
    inside[inside] = ops.start[inside] < region.end[index[inside]]
    # Not the region's own spans, where a trace writes them as operators (the 2021 vocabulary).
    inside[inside] = ~ops_named(columns, lambda n: name_role(n) == ROLE_REGION, inside)
    multi_tensor = ops_named(columns, lambda n: any(m in n for m in MULTI_TENSOR_MARKERS), inside)
    in_runtime = covered_length(merge(columns.runtime), region.start, region.end).sum()
    cpu_us = total(region) - float(in_runtime)
    gpu_us = union_in(columns.gpu_optimizer, *window)
    low, high = window
    return {"ms_per_step": max(cpu_us, gpu_us) / US_PER_MS / n_steps,
            "pct": 100.0 * max(cpu_us, gpu_us) / (high - low) if high > low else 0.0,
            "cpu_ms_per_step": cpu_us / US_PER_MS / n_steps,
            "gpu_ms_per_step": gpu_us / US_PER_MS / n_steps if columns.gpu_optimizer.size else None,
            "ops_per_step": float(inside.sum()) / n_steps,
            "multi_tensor_ops_per_step": float(multi_tensor.sum()) / n_steps}


def attention_metrics(columns: TraceColumns, host_window: tuple[float, float],
                      n_steps: int) -> dict:
    """The largest square softmax in the host window (s of a [..., s, s] input; null without
    shapes or square softmaxes) and the scaled-dot-product-attention operators per step."""
    low, high = host_window
    ops = columns.cpu_ops
    in_window = (ops.start >= low) & (ops.start < high)
    sdpa = ops_named(columns, lambda n: SDPA_MARKER in n, in_window)
    sides = columns.softmax_side[(columns.softmax_ts >= low) & (columns.softmax_ts < high)]
    return {"square_softmax_max": float(sides.max()) if sides.size else None,
            "sdpa_ops_per_step": float(sdpa.sum()) / n_steps}


# --- torch.distributed. -----------------------------------------------------------------------

def collective_kernels(columns: TraceColumns) -> np.ndarray:
    """For each kernel, whether it is a collective's (is_collective_kernel, once per name)."""
    comm = np.array([is_collective_kernel(name) for name in columns.kernel_name_table], bool)
    return comm[columns.kernel_name_id] if comm.size else np.zeros(0, bool)


def distributed_metrics(columns: TraceColumns, window: tuple[float, float], n_steps: int, *,
                        host_window: tuple[float, float]) -> dict | None:
    """For a rank's trace (distributedInfo, or collectives in it): its backend, rank and world
    size; collectives per step (the "<backend>:<collective>" spans starting in the host window,
    or the c10d::* operators where a trace has no such spans); their time per step and share of
    the window: the union of collective kernels (is_collective_kernel) where the GPU ran them (in
    the window, which follows the GPU), else of the collective spans (in the host window, where
    the CPU ran them).
    None for a trace of one process."""
    info = columns.distributed_info or {}
    calls = columns.collective_spans if columns.collective_spans.size else columns.collective_ops
    if not calls.size and (info.get("world_size") or 1) <= 1:  # {"rank": 0} alone: one process
        return None
    host_low, host_high = host_window
    kernels = columns.kernels
    comm = collective_kernels(columns)
    if comm.any():
        collective_us = union_in(Spans(kernels.start[comm], kernels.end[comm]), *window)
    else:
        collective_us = union_in(calls, host_low, host_high)
    low, high = window
    in_window = (calls.start >= host_low) & (calls.start < host_high)
    forwards, synced = synced_micro_batches(columns, host_window)
    return {"backend": info.get("backend"), "rank": info.get("rank"),
            "world_size": info.get("world_size"),
            "collectives_per_step": float(in_window.sum()) / n_steps,
            "collective_ms_per_step": collective_us / US_PER_MS / n_steps,
            "comm_pct": 100.0 * collective_us / (high - low) if high > low else 0.0,
            "ddp_forwards_per_step": float(forwards) / n_steps,
            "synced_forwards_per_step": float(synced) / n_steps}


def outermost(spans: Spans, thread: np.ndarray) -> np.ndarray:
    """Which spans no other span on their thread holds (spans sorted by start)."""
    keep = np.ones(spans.size, bool)
    reach: dict[int, float] = {}  # each thread's latest end so far
    for i, (start, end, tid) in enumerate(zip(spans.start.tolist(), spans.end.tolist(),
                                              thread.tolist())):
        if start < reach.get(tid, -np.inf):
            keep[i] = False
        reach[tid] = max(reach.get(tid, -np.inf), end)
    return keep


def synced_micro_batches(columns: TraceColumns, host_window: tuple[float, float]
                         ) -> tuple[int, int]:
    """Gradient accumulation, in the host window: the micro-batches (outermost DDP forwards per
    thread: a DDP module nested in another runs inside its forward) and how many of them are
    followed, before the next (or the window's end), by the gradient buckets' collectives. The
    buckets' layout is the largest multiset of sizes that follows a micro-batch (most elements,
    then most collectives: sizes unknown count -1 each); a micro-batch is synced when what
    follows it holds that layout. Without no_sync every micro-batch all-reduces every bucket;
    with it only the last of a step does, and a loss all-reduced after each one (a scalar) is no
    bucket layout."""
    low, high = host_window
    spans = columns.ddp_forwards
    inside = (spans.start >= low) & (spans.start < high)
    keep = outermost(Spans(spans.start[inside], spans.end[inside]),
                     columns.ddp_forward_thread[inside])
    forwards = spans.start[inside][keep]
    if not forwards.size:
        return 0, 0
    starts, sizes = columns.gradient_collective_start, columns.gradient_collective_size
    order = np.argsort(starts, kind="stable")
    starts, sizes = starts[order], sizes[order]
    first = np.searchsorted(starts, forwards, side="left")
    last = np.searchsorted(starts, np.r_[forwards[1:], high], side="left")
    layouts = [Counter(np.nan_to_num(sizes[a:b], nan=-1.0).tolist())
               for a, b in zip(first.tolist(), last.tolist()) if b > a]
    if not layouts:
        return int(forwards.size), 0
    buckets = max(layouts, key=lambda layout: (sum(size * n for size, n in layout.items()
                                                   if size > 0), layout.total()))
    return int(forwards.size), sum(not buckets - layout for layout in layouts)


# --- Initialization in the window. ---------------------------------------------------------------
# A launch call takes microseconds, or blocks while a busy GPU drains a full launch queue (45 ms
# at most in the committed H100 traces, the GPU busy throughout). A long launch call while the
# GPU is idle waits for nothing on the GPU: the driver loads the kernel's module on first use
# (lazy loading) or creates the context. One module takes milliseconds (10 ms in the H100
# padding_waste/bad trace, whose random batch shapes pick new GEMM kernels as it runs: part of
# that workload's steady state); creating the context and loading a library's modules take
# hundreds of milliseconds to seconds: start-up, not steady state (3,056 ms, the second launch
# of the shared A100 AlexNet trace, recorded without a warm-up).
INIT_LAUNCH_MIN_MS = 100.0  # ms: a launch call at least this long...
INIT_LAUNCH_GPU_BUSY_MAX = 0.5  # ...with the GPU busy less than this share of it


def initialization(columns: TraceColumns, host_window: tuple[float, float]) -> dict | None:
    """{"launch_index": k (1-based, in the host window), "launch_ms", "median_launch_us"} of the
    longest launch call of INIT_LAUNCH_MIN_MS or more during which the GPU was busy (kernels,
    copies, memsets) less than INIT_LAUNCH_GPU_BUSY_MAX of the time; None without one."""
    low, high = host_window
    calls = columns.runtime_is_launch & (columns.runtime.start >= low) & (
        columns.runtime.start < high)
    start, end = columns.runtime.start[calls], columns.runtime.end[calls]
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    duration = end - start
    idle_wait = duration >= INIT_LAUNCH_MIN_MS * US_PER_MS
    if idle_wait.any():  # the GPU's busy time is merged only for such a call (seldom)
        busy = merge(concat(columns.kernels, columns.memcpy, columns.memset))
        idle_wait &= covered_length(busy, start, end) < INIT_LAUNCH_GPU_BUSY_MAX * duration
    if not idle_wait.any():
        return None
    k = int(np.argmax(np.where(idle_wait, duration, -1.0)))
    return {"launch_index": k + 1, "launch_ms": float(duration[k]) / US_PER_MS,
            "median_launch_us": float(np.median(duration))}


def initialization_warning(found: dict | None) -> str | None:
    if not found:
        return None
    return (f"the window holds initialization, not steady state: launch call "
            f"{found['launch_index']} took {found['launch_ms']:.0f} ms (median "
            f"{found['median_launch_us']:.1f} us), lazy module loading or context creation; "
            f"record later steps (torch.profiler.schedule with wait/warmup) for steady-state "
            f"numbers")


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


def host_regions(columns: TraceColumns) -> HostRegions:
    """The host regions of the whole trace (definition above): which candidates qualify, and the
    instants each name holds, innermost first, less the DataLoader's."""
    candidates = columns.annotations
    duration = candidates.end - candidates.start
    enqueue_starts = np.sort(columns.runtime.start[columns.runtime_enqueues])
    quiet = (np.searchsorted(enqueue_starts, candidates.end, side="left")
             == np.searchsorted(enqueue_starts, candidates.start, side="left")) & (duration > 0)
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
    dataloader_workers/fixed, 47.5 ms with no kernel while the previous step's backward ran."""
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


# --- GPU metrics. -------------------------------------------------------------------------------

def graph_replays(columns: TraceColumns, in_steps: np.ndarray, in_window: np.ndarray,
                  n_steps: int) -> dict:
    """CUDA graph replays: the graph launches in the steps (cudaGraphLaunch, cuGraphLaunch,
    hipGraphLaunch), per step, and their time; and the kernels in the window whose launching
    call (by correlation id: a graph's kernels share its launch's) is one, per step."""
    graph = columns.runtime_is_graph_launch & in_steps
    kernels = 0
    if columns.runtime_is_graph_launch.any():  # a trace without graphs pays nothing
        call = launching_call(columns, columns.kernel_correlation[in_window])
        kernels = int((columns.runtime_is_graph_launch[call[call >= 0]]).sum())
    return {"graph_launches_per_step": float(graph.sum()) / n_steps,
            "graph_kernels_per_step": kernels / n_steps,
            "graph_launch_ms_per_step": float((columns.runtime.end - columns.runtime.start)[
                graph].sum()) / US_PER_MS / n_steps}


def gpu_metrics(columns: TraceColumns, window: tuple[float, float], n_steps: int,
                runtime_step: np.ndarray, steps: Spans | None = None,
                syncs: HostSyncs | None = None,
                copied: tuple[np.ndarray, np.ndarray] | None = None,
                regions: HostRegions | None = None) -> dict:
    """`steps`: the host steps (ProfilerStep#N, or the whole trace), for the syncs recorded only as
    cuda_sync events; without them those count where they lie in the window. `syncs` (host_syncs)
    and `copied` (copy_calls), where the caller has them already; `regions` (host_regions): the
    host regions, causes of idle time by name."""
    low, high = window
    span = high - low
    kernels = columns.kernels
    in_window = (kernels.start >= low) & (kernels.start < high)
    duration = (kernels.end - kernels.start)[in_window]
    name_id = columns.kernel_name_id[in_window]
    kernel_time = float(duration.sum())
    table = columns.kernel_name_table  # decided once per distinct kernel name
    tensor_core = np.array([uses_tensor_cores(n) for n in table], dtype=bool)[name_id]
    tf32 = np.array([uses_tf32(n) for n in table], dtype=bool)[name_id]
    gemm = np.array([is_gemm(n.lower()) for n in table], dtype=bool)[name_id]
    gemm_time = float(duration[gemm].sum())

    in_steps = runtime_step >= 0
    launch_time = float((columns.runtime.end - columns.runtime.start)[
        in_steps & columns.runtime_is_launch].sum())
    busy = merge(concat(columns.kernels, columns.memcpy, columns.memset))
    first_gpu, last_gpu = float(busy.start[0]), float(busy.end[-1])
    gpu_span = last_gpu - first_gpu
    h2d = Spans(columns.memcpy.start[columns.memcpy_h2d], columns.memcpy.end[columns.memcpy_h2d])
    if syncs is None:
        syncs = host_syncs(columns, steps if steps is not None else Spans(np.array([low]),
                                                                          np.array([high])),
                           runtime_step)
    if copied is None:
        copied = copy_calls(columns, runtime_step)

    def share(part: float, whole: float) -> float:
        return 100.0 * part / whole if whole > 0 else 0.0

    kernel_busy = union_in(kernels, low, high)
    # Communication: kernels that are not collectives are compute; collective time with no
    # compute kernel beside it is exposed (TraceLens's "exposed communication"): the union of all
    # kernels less that of the compute kernels.
    compute = ~collective_kernels(columns)
    compute_busy = (kernel_busy if compute.all() else
                    union_in(Spans(kernels.start[compute], kernels.end[compute]), low, high))
    # Copy time with no kernel running beside it: what the step waits for. A copy on a side
    # stream under the compute stream's kernels (dataloader_workers/fixed on a GPU) costs nothing.
    h2d_exposed = union_in(concat(kernels, h2d), low, high) - kernel_busy
    idle = idle_by_cause_pct(columns, busy, window, syncs.end[syncs.step >= 0], regions,
                             unrecorded_work(columns, window))
    return {
        "utilization_pct": share(kernel_busy, span),
        # The same, of the time the trace accounts for: without the idle stretches in which the
        # GPU ran or waited on work launched before the recording (idle cause "unrecorded").
        "recorded_utilization_pct": share(kernel_busy, span * (1 - idle["unrecorded"] / 100.0)),
        "compute_pct": share(compute_busy, span),
        "exposed_comm_pct": share(kernel_busy - compute_busy, span),
        "idle_pct": 100.0 - share(total(busy), gpu_span) if gpu_span > 0 else 0.0,
        "kernels_per_step": duration.size / n_steps,
        "median_kernel_us": float(np.median(duration)) if duration.size else None,
        "short_kernel_pct": share(float((duration < SHORT_KERNEL_US).sum()), duration.size),
        "launches_per_step": float((in_steps & columns.runtime_is_launch).sum()) / n_steps,
        # Of them, CUDA graph launches, their time, and the kernels they replayed: one graph
        # launch enqueues hundreds of kernels, which the launch-bound rule must not read as
        # hundreds of launches (verdicts.launch_to_kernel_ratio).
        **graph_replays(columns, in_steps, in_window, n_steps),
        "h2d_pct": share(union_in(h2d, low, high), span),
        "h2d_exposed_pct": share(h2d_exposed, span),
        "tensor_core_pct": share(float(duration[tensor_core].sum()), kernel_time),
        # Of it, FP32 math in TF32 (kernel_names.uses_tf32): what a table's precision label reads
        # (compare.precision), cuDNN's convolutions by default.
        "tf32_pct": share(float(duration[tf32].sum()), kernel_time),
        # The GPU target reads "tensor-core share >= 80 % of GEMM time": of the GEMM
        # kernels' time, the share on tensor cores (null without GEMMs).
        "tensor_core_gemm_pct": (share(float(duration[gemm & tensor_core].sum()), gemm_time)
                                 if gemm_time > 0 else None),
        # Beyond the list: what the launch, sync and FP32 verdicts read.
        "kernel_ms_per_step": kernel_time / US_PER_MS / n_steps,
        "launch_ms_per_step": launch_time / US_PER_MS / n_steps,
        "gemm_pct": share(gemm_time, kernel_time),
        "non_tensor_core_gemm_pct": share(float(duration[gemm & ~tensor_core].sum()), kernel_time),
        # syncs_per_step, syncs_by_cause_per_step, sync_idle_pct (and by cause), sync sources
        **sync_metrics(syncs, busy, low, high, n_steps),
        **copy_metrics(columns, copied, runtime_step, n_steps),
        "idle_by_cause_pct": idle,
    }
