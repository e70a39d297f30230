"""The steps of a trace and the basics every metric reads: the ProfilerStep#N spans extended to
the GPU work they launched, each GPU op's launching call, each step's time breakdown (the
TensorBoard plugin's Overview), and time per operator and kernel name."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.intervals import Spans, clip, concat, covered_length, merge
from common.syncs import step_index
from common.trace_columns import BACKWARD_MARKER, DATALOADER_REGION, OPTIMIZER_REGION, TraceColumns

# Definitions (sources in common/README.md, "Analyzing a trace"):
#   steps        ProfilerStep#N spans but a last one that is the loop's end (ends_the_loop); without
#                them, the training iterations that optimizer.step() calls end (optimizer_steps);
#                without those, the whole trace is one step. Each is extended to the end of the
#                GPU work launched inside it (runtime call -> kernel by correlation id), the
#                TensorBoard plugin's rule.
#                The window runs from the first step's start to the last step's end; the host
#                window over the steps before their extension (host_steps), where the CPU ran
#                its part of them: CPU-side facts are read there.
#   breakdown    each instant of a step goes to the first active of kernel > memcpy > memset >
#                runtime > DataLoader > CPU Exec (operator spans only) > other (plugin Overview).

US_PER_MS = 1000.0

BREAKDOWN_ROLES = ("kernel", "memcpy", "memset", "runtime", "dataloader", "cpu_exec", "other")
# The TensorBoard plugin's Overview breakdown assigns each instant of a step to the first of these
# roles active then (Kernel > Memcpy > Memset > Runtime > DataLoader > CPU Exec > Other).

# --- Steps and their extension to the GPU work they launched. ----------------------------------

# A profile() without a schedule records no ProfilerStep#N, prof.step() or not (torch.profiler
# marks steps only under a schedule): the first thing a new user records. torch.optim still
# wraps every optimizer.step() in "Optimizer.step#<class>.step", and that call ends a training
# iteration as prof.step() after it would: the steps are cut there (optimizer_steps). Counted as
# one step, three iterations read as one three times as long, and every per-step count (syncs,
# graph breaks, compiled regions) three times as high.
OPTIMIZER_STEPS_MIN = 2  # optimizer.step() calls; one call's step would be the whole trace again


def host_steps(columns: TraceColumns) -> Spans:
    """ProfilerStep#N spans, less a last one that is the loop's end (ends_the_loop) behind
    others; with none, the steps the optimizer's calls end (optimizer_steps); with neither, the
    whole trace (its CPU side) is one step."""
    if columns.steps.size > 1 and ends_the_loop(columns):
        return Spans(columns.steps.start[:-1], columns.steps.end[:-1])
    if columns.steps.size:
        return columns.steps
    by_optimizer = optimizer_steps(columns)
    if by_optimizer.size:
        return by_optimizer
    low, high = columns.cpu_extent or columns.all_extent
    return Spans(np.array([low]), np.array([high]))


def optimizer_steps(columns: TraceColumns) -> Spans:
    """A trace without ProfilerStep#N cut into training iterations, each ending where an
    optimizer step ends: the first from the trace's start (its first CPU-side span, record_function
    ranges such as the first DataLoader call or DDP forward included), each later one from the end
    of the one before; what runs after the last optimizer step (an iteration cut short, the
    loop's end) is in no step. A call is the iteration's last when a backward operator starts
    between its start and the next call's (LBFGS runs its closure's backward inside the call):
    two optimizers stepped one after the other end one iteration; with gradient accumulation an
    iteration holds its micro-batches. Limits: a GAN's two optimizers, each after a backward pass
    of its own, end two steps an iteration; an optimizer.step() under torch.compile records no
    Optimizer.step# range. Empty with fewer than OPTIMIZER_STEPS_MIN iterations."""
    calls = merge(columns.regions[OPTIMIZER_REGION])  # the harness's region holds torch.optim's
    if calls.size < OPTIMIZER_STEPS_MIN:
        return Spans.empty()
    names = columns.cpu_op_names
    _, first, codes = np.unique(np.fromiter(map(id, names), np.int64, names.size),
                                return_index=True, return_inverse=True)
    backward_name = np.fromiter((BACKWARD_MARKER in name for name in names[first]), bool,
                                first.size)
    backward_start = np.sort(columns.cpu_ops.start[backward_name[codes.ravel()]])
    ends = calls.end
    if backward_start.size:  # an iteration ends at the last call before the next backward pass
        between = (np.searchsorted(backward_start, calls.start[1:])
                   - np.searchsorted(backward_start, calls.start[:-1]))
        ends = calls.end[np.r_[between > 0, True]]
    if ends.size < OPTIMIZER_STEPS_MIN:
        return Spans.empty()
    low, _ = columns.cpu_extent or columns.all_extent
    named = (columns.annotations, columns.dataloader, columns.collective_spans,
             columns.ddp_forwards, calls)
    low = min([low] + [float(spans.start.min()) for spans in named if spans.size])
    return Spans(np.r_[low, ends[:-1]], ends.copy())


def ends_the_loop(columns: TraceColumns) -> bool:
    """Whether the last ProfilerStep#N is the loop's end: a loop over a DataLoader ends in the
    call that finds it empty (StopIteration), in a step of its own that the profiler's exit ends.
    It starts a DataLoader call and holds nothing outside such calls (only_loader_calls), behind
    a step of the model's work; a step alone only if no operator runs in it at all (the call made
    no batch). A loader timed alone (steps of DataLoader calls only) keeps its steps."""
    steps = columns.steps
    if not steps.size:
        return False
    start, end = float(steps.start[-1]), float(steps.end[-1])
    loader = merge(columns.dataloader)
    if not ((columns.dataloader.start >= start) & (columns.dataloader.start < end)).any():
        return False  # an empty step is no loop's end (analyze.recorded_nothing reads it)
    if not only_loader_calls(columns, loader, start, end):
        return False
    if steps.size == 1:
        return not ((columns.cpu_ops.start >= start) & (columns.cpu_ops.start < end)).any()
    return any(not only_loader_calls(columns, loader, float(before), float(after))
               for before, after in zip(steps.start[-2::-1], steps.end[-2::-1]))


def only_loader_calls(columns: TraceColumns, loader: Spans, start: float, end: float) -> bool:
    """Whether [start, end) holds no operator, runtime call, collective call or record_function
    range but inside the merged DataLoader calls `loader`."""
    regions = [spans for name, spans in columns.regions.items() if name != DATALOADER_REGION]
    for spans in (columns.cpu_ops, columns.runtime, columns.collective_spans,
                  columns.collective_ops, columns.annotations, *regions):
        meets = (spans.start < end) & ((spans.end > start) | (spans.start >= start))
        inner = np.searchsorted(loader.start, spans.start[meets], side="right") - 1
        inside = (inner >= 0) & (loader.end[np.maximum(inner, 0)] >= spans.end[meets])
        if not inside.all():
            return False
    return True


def op_threads(columns: TraceColumns) -> np.ndarray:
    """Each operator's thread (one thread where the reader kept none)."""
    if columns.cpu_op_thread.size:
        return columns.cpu_op_thread
    return np.zeros(columns.cpu_op_names.size, np.int64)


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
    count twice) and GPU kernels (in the window). torch.compile's compiling (its ranges and the
    operators it runs inside them while tracing) is `compiling`, by the same self time: no
    operator, as the CPU line has it."""
    operators: dict[str, tuple[float, float]]
    kernels: dict[str, tuple[float, float]]
    compiling: dict[str, tuple[float, float]]


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
                 host_window: tuple[float, float], compiling: np.ndarray) -> TimeByName:
    """Operators' self time in the host window, per name and step, those `compiling` marks
    (idle_causes.compiling_operators) apart; kernels' time per name and step, of the kernels the
    recorded steps ran (kernels_of_steps)."""
    low, high = host_window
    ops = columns.cpu_ops
    self_us = self_time_us(ops, columns.cpu_op_thread)
    in_window = (ops.start >= low) & (ops.start < high)
    operators, compiled = (ops_by_name(columns, self_us, in_window & (compiling == marked),
                                       n_steps) for marked in (False, True))
    in_window = kernels_of_steps(columns, window, host_window)
    kernels = columns.kernels
    return TimeByName(operators, per_name(columns.kernel_name_id[in_window],
                                          columns.kernel_name_table,
                                          (kernels.end - kernels.start)[in_window], n_steps),
                      compiled)


def ops_by_name(columns: TraceColumns, self_us: np.ndarray, keep: np.ndarray,
                n_steps: int) -> dict[str, tuple[float, float]]:
    """The kept operators' self time and calls per name and step."""
    # Names are interned strings (trace_columns.read_cpu_group): grouping by identity is grouping
    # by name, without sorting Python strings.
    op_names = columns.cpu_op_names[keep]
    _, first, codes = np.unique(np.fromiter(map(id, op_names), np.int64, op_names.size),
                                return_index=True, return_inverse=True)
    return per_name(codes.ravel(), list(op_names[first]), self_us[keep], n_steps)
