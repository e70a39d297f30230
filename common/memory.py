"""Memory over the recorded steps, from the [memory] events profile_memory=True writes (one per
allocation or free of the allocator, with its totals after it): what is allocated at each step's
end and how fast it grows, what earlier steps kept, the peak, and what the peak is made of (the
TensorBoard plugin's memory view). Definitions in common/README.md, "Memory over the steps"."""
from __future__ import annotations

import numpy as np

from common import trace
from common.intervals import Spans, concat, merge
from common.trace_columns import OPTIMIZER_REGION, TraceColumns

# The growth fit needs this many recorded steps: the fewest at which start-up that grows over two
# steps and then holds (0, 1, 2, 2, 2 MB) fits a line with R^2 0.78, under the verdict's 0.9; over
# four steps (0, 1, 2, 2) it fits 0.89, and over the default schedule's three (0, 1, 2) exactly,
# which no fit tells from a leak. compare.FEW_STEPS is 5 too.
GROWTH_FIT_MIN_STEPS = 5  # recorded steps
MEMORY_OPERATORS_SHOWN = 3  # operators listed per ranking (kept, allocating), by MB per step
# Where an allocation came from: the outermost operator open on its thread at its time (the call
# the user's code made, aten::linear, not the aten::empty inside it); outside every operator:
NO_OPERATOR = "(no operator)"
# The parts of the peak's own step (peak_breakdown_mb). With the harness's record_function regions
# (forward, backward, optimizer) an allocation is in the phase whose region holds its time; without
# them, backward is autograd's work (an allocation whose outermost operator is one of these, or made
# on a thread whose outermost operators all are: the engine's own thread on a GPU), optimizer is
# torch.optim's spans (Optimizer.step#AdamW.step, Optimizer.zero_grad#AdamW.zero_grad), and the rest
# "other": forward cannot be told from other work without its region (forward is null then).
PHASES = ("forward", "backward", "optimizer", "other")
BACKWARD_OP_PREFIX = "autograd::engine::evaluate_function"
ZERO_GRAD_PREFIX = "Optimizer.zero_grad#"


def memory_metrics(columns: TraceColumns, events: np.ndarray, steps: Spans) -> dict | None:
    """metrics["memory"] for the [memory] events at these indices (device_events: one device's,
    by time) over the recorded steps (trace_steps.host_steps); None without one in the steps."""
    if not events.size:
        return None
    ts = columns.memory_ts[events]
    low, high = float(steps.start[0]), float(steps.end[-1])
    in_window = (ts >= low) & (ts <= high)
    if not in_window.any():
        return None
    allocated = columns.memory_bytes[events]
    delta = np.nan_to_num(columns.memory_delta[events])  # Bytes not written: no change known
    reserved = columns.memory_reserved[events]
    if (columns.memory_device_type[events] == trace.CPU_DEVICE_TYPE).all() or not (
            np.nan_to_num(reserved) > 0).any():
        reserved = None  # a CPU, or not written, or always 0: no caching allocator's view
    n_steps = steps.size
    # Each step's end: the last event at or before it (before the first event: that event's
    # Total Allocated less its own Bytes, the state it changed).
    last = np.searchsorted(ts, steps.end, side="right") - 1
    at_end = np.where(last >= 0, allocated[np.maximum(last, 0)],
                      allocated[0] - delta[0]) / trace.BYTES_PER_MB
    reserved_at_end = None
    if reserved is not None:
        values = np.where(last >= 0, reserved[np.maximum(last, 0)], np.nan) / trace.BYTES_PER_MB
        reserved_at_end = [None if np.isnan(v) else float(v) for v in values]
    growth, r2 = growth_fit(at_end)
    # Each event in the window to the step that started last before it (a gap between two steps
    # is the earlier one's); -1 outside the window.
    step_of = np.where(in_window, np.searchsorted(steps.start, ts, side="right") - 1, -1)
    follows = next_event_at_address(columns.memory_addr[events])
    freed_at = np.r_[ts, np.inf][follows]  # the time the block was freed; inf: never
    allocation = (delta > 0) & (step_of >= 0)  # in a recorded step
    thread = columns.memory_thread[events]
    outer = {tid: outermost_spans(columns, tid) for tid in np.unique(thread[allocation])}
    source = outermost_operator(outer, ts, thread, allocation)
    # Kept: allocated in a recorded step before the last and not freed by the window's end.
    kept = allocation & (step_of < n_steps - 1) & (freed_at > high)
    earlier = n_steps - 1  # the steps that can keep memory
    result = {
        "steps_read": int(n_steps),
        "allocated_mb_at_step_end": [float(v) for v in at_end],
        "reserved_mb_at_step_end": reserved_at_end,
        "growth_mb_per_step": growth,
        "growth_fit_r2": r2,
        "kept_mb_per_step": (float(delta[kept].sum()) / trace.BYTES_PER_MB / earlier
                             if earlier else None),
        "kept_by_operator": (by_operator(operator_names(columns, source[kept]), delta[kept],
                                         earlier) if earlier else []),
        "allocating_operators": by_operator(operator_names(columns, source[allocation]),
                                            delta[allocation], n_steps),
    }
    result.update(peaks(ts, allocated, reserved, in_window))
    at = result.pop("at")
    result["steps_peak_step"] = int(step_of[at])  # 0-based, of the recorded steps
    result["peak_breakdown_mb"], result["peak_phases_from"] = peak_breakdown(
        columns, steps, at, ts, allocated, delta, step_of, follows, in_window, source, thread,
        outer)
    return result


def device_events(columns: TraceColumns, device_types: tuple[int, ...]) -> np.ndarray | None:
    """The indices of the [memory] events read, by time (stable: file order at equal times): the
    device types asked for, and of several devices (Device Id) the one with the highest Total
    Allocated, whose peak is the trace's (peak_memory_mb); None without any."""
    chosen = np.flatnonzero(np.isin(columns.memory_device_type, device_types))
    if not chosen.size:
        return None
    device = columns.memory_device_id[chosen]
    if (device != device[0]).any():
        chosen = chosen[device == device[np.argmax(columns.memory_bytes[chosen])]]
    chosen = chosen[np.argsort(columns.memory_ts[chosen], kind="stable")]
    return chosen[~outside_the_total(columns.memory_bytes[chosen],
                                     np.nan_to_num(columns.memory_delta[chosen]),
                                     columns.memory_addr[chosen])]


def outside_the_total(allocated: np.ndarray, delta: np.ndarray, addr: np.ndarray) -> np.ndarray:
    """Per event (by time), whether it comes from a reporter that keeps no Total Allocated: an
    allocation that leaves less allocated than its own Bytes, which an allocator counting itself
    cannot (ATen's MapAllocator, the shared memory a DataLoader worker's batch arrives in, writes
    Total Allocated 0), and the next event at its address, its free. Read with the others, each
    pulls the curve to 0 and its Bytes count in no total (a CPU's peak less them)."""
    outside = (delta > 0) & (allocated < delta)
    follows = next_event_at_address(addr)
    freed = follows[outside]
    outside[freed[freed < addr.size]] = True
    return outside


def growth_fit(at_end: np.ndarray) -> tuple[float | None, float | None]:
    """Least-squares slope (MB per step) of the allocated memory at each step's end over the step
    index, and its R^2; (None, None) under GROWTH_FIT_MIN_STEPS steps. A series the line fits
    exactly (a flat one among them) has R^2 1, as scikit-learn's r2_score gives it."""
    if at_end.size < GROWTH_FIT_MIN_STEPS:
        return None, None
    x = np.arange(at_end.size, dtype=np.float64)
    dx, dy = x - x.mean(), at_end - at_end.mean()
    slope = float((dx * dy).sum() / (dx * dx).sum())
    residual = float(((dy - slope * dx) ** 2).sum())
    spread = float((dy * dy).sum())
    # Residuals of float rounding (1e-24 of the squared values: 1e-12 of each) are an exact fit.
    if spread == 0 or residual <= 1e-24 * float((at_end * at_end).sum()):
        return slope, 1.0
    return slope, 1.0 - residual / spread


def next_event_at_address(addr: np.ndarray) -> np.ndarray:
    """For each event (sorted by time), the index of the next event at the same address, the
    number of events where none follows: after an allocation, its free (or the address's reuse,
    which means a free)."""
    order = np.argsort(addr, kind="stable")  # by address, then by time
    follows = np.full(addr.size, addr.size)
    same = addr[order[1:]] == addr[order[:-1]]
    follows[order[:-1][same]] = order[1:][same]
    return follows


def outermost_spans(columns: TraceColumns, tid: int) -> tuple[np.ndarray, ...]:
    """The operators of one thread that no other of its operators holds: (start, end, index into
    columns.cpu_ops), sorted and disjoint. The harness's regions written as operators (the 2021
    vocabulary) are no operators here."""
    index = np.flatnonzero((columns.cpu_op_thread == tid) & ~columns.cpu_op_is_region)
    start, end = columns.cpu_ops.start[index], columns.cpu_ops.end[index]
    order = np.lexsort((-end, start))  # by start, the longest first where two start together
    index, start, end = index[order], start[order], end[order]
    reach = np.maximum.accumulate(np.r_[-np.inf, end[:-1]])  # the furthest end before each
    outer = start >= reach
    return start[outer], end[outer], index[outer]


def outermost_operator(outer: dict, ts: np.ndarray, thread: np.ndarray,
                       wanted: np.ndarray) -> np.ndarray:
    """For each wanted event, the index (into columns.cpu_ops) of the outermost operator open on
    its thread at its time (outer: outermost_spans by thread); -1 where none is, or for an event
    not wanted."""
    found = np.full(ts.size, -1)
    for tid, (start, end, index) in outer.items():
        if not start.size:  # a thread that allocates and runs no operator
            continue
        mine = np.flatnonzero(wanted & (thread == tid))
        k = np.searchsorted(start, ts[mine], side="right") - 1
        hit = (k >= 0) & (ts[mine] <= end[np.maximum(k, 0)])
        found[mine[hit]] = index[k[hit]]
    return found


def operator_names(columns: TraceColumns, index: np.ndarray) -> np.ndarray:
    """The names of these operators (indices into columns.cpu_ops; -1: NO_OPERATOR)."""
    names = np.full(index.size, NO_OPERATOR, dtype=object)
    names[index >= 0] = columns.cpu_op_names[index[index >= 0]]
    return names


def by_operator(names: np.ndarray, delta: np.ndarray, steps: int) -> list[dict]:
    """The top MEMORY_OPERATORS_SHOWN operators by bytes allocated: MB and allocations per step.
    Names are interned strings (trace_columns): grouped by identity, without sorting strings;
    equal bytes in the order the trace first names them."""
    if not names.size:
        return []
    _, first, code = np.unique(np.fromiter(map(id, names), np.int64, names.size),
                               return_index=True, return_inverse=True)
    mb = np.bincount(code, weights=delta) / trace.BYTES_PER_MB / steps
    count = np.bincount(code) / steps
    # Ties go to the operator seen first in the trace: the groups' own order is by object id,
    # which changes from one process to the next.
    top = np.lexsort((first, -mb))[:MEMORY_OPERATORS_SHOWN]
    return [{"operator": str(names[first[k]]), "mb_per_step": float(mb[k]),
             "allocations_per_step": float(count[k])} for k in top]


def peaks(ts: np.ndarray, allocated: np.ndarray, reserved: np.ndarray | None,
          in_window: np.ndarray) -> dict:
    """The steps' peaks: the highest Total Allocated of the events in them (`at`: the first event
    that reaches it) and, with a caching allocator, the highest Total Reserved and what of it
    was not allocated at its fullest: the reserved peak less the most allocated while reserved
    stood at it (reserved holds its peak from warm-up on, through steps that free everything)."""
    window = np.flatnonzero(in_window)
    at = int(window[np.argmax(allocated[window])])
    result = {"at": at, "steps_peak_allocated_mb": float(allocated[at]) / trace.BYTES_PER_MB,
              "steps_peak_reserved_mb": None, "reserved_unallocated_mb": None}
    if reserved is not None:
        most = float(np.nanmax(reserved[window]))
        result["steps_peak_reserved_mb"] = most / trace.BYTES_PER_MB
        result["reserved_unallocated_mb"] = (most - float(
            allocated[window][reserved[window] == most].max())) / trace.BYTES_PER_MB
    return result


def peak_breakdown(columns: TraceColumns, steps: Spans, at: int, ts: np.ndarray,
                   allocated: np.ndarray, delta: np.ndarray, step_of: np.ndarray,
                   follows: np.ndarray, in_window: np.ndarray, source: np.ndarray,
                   thread: np.ndarray, outer: dict) -> tuple[dict, str]:
    """What is live at the allocated peak (event `at`), MB by where it was allocated: before the
    recorded steps (Total Allocated at the peak less what the steps allocated and still hold),
    kept from earlier recorded steps, and in the peak's own step by phase (PHASES); the parts
    add up to the peak. And what the phases were read from: "regions" or "operators"."""
    index = np.arange(ts.size)
    live = in_window & (delta > 0) & (index <= at) & (follows > at)
    own = live & (step_of == step_of[at])
    regions = harness_regions(columns, steps)
    phase = step_phases(columns, ts, source, thread, outer, own, regions)
    parts = {"before_steps": float(allocated[at] - delta[live].sum()),
             "kept": float(delta[live & ~own].sum())}
    parts.update((name, float(delta[own & (phase == k)].sum())) for k, name in enumerate(PHASES))
    breakdown = {key: value / trace.BYTES_PER_MB for key, value in parts.items()}
    if not regions:
        breakdown["forward"] = None  # not told from "other" without the region
    return breakdown, "regions" if regions else "operators"


def harness_regions(columns: TraceColumns, steps: Spans) -> bool:
    """Whether the steps hold the harness's forward or backward region."""
    low, high = float(steps.start[0]), float(steps.end[-1])
    return any(((columns.regions[name].start < high) & (columns.regions[name].end > low)).any()
               for name in ("forward", "backward"))


def inside(spans: Spans, ts: np.ndarray) -> np.ndarray:
    """Per time, whether one of the spans holds it."""
    merged = merge(spans)
    if not merged.size:
        return np.zeros(ts.size, bool)
    k = np.searchsorted(merged.start, ts, side="right") - 1
    return (k >= 0) & (ts <= merged.end[np.maximum(k, 0)])


def named(names: np.ndarray, prefix: str) -> np.ndarray:
    """Per name (interned strings), whether it starts with prefix: tested once per distinct name."""
    if not names.size:
        return np.zeros(0, bool)
    _, first, code = np.unique(np.fromiter(map(id, names), np.int64, names.size),
                               return_index=True, return_inverse=True)
    return np.array([str(names[k]).startswith(prefix) for k in first], bool)[code]


def step_phases(columns: TraceColumns, ts: np.ndarray, source: np.ndarray, thread: np.ndarray,
                outer: dict, wanted: np.ndarray, regions: bool) -> np.ndarray:
    """Per wanted event, the index in PHASES of its phase (see PHASES); "other" elsewhere."""
    phase = np.full(ts.size, PHASES.index("other"))
    optimizer = columns.regions[OPTIMIZER_REGION]  # the harness's and Optimizer.step#... spans
    if regions:
        for name in ("forward", "backward"):
            phase[wanted & inside(columns.regions[name], ts)] = PHASES.index(name)
        phase[wanted & inside(optimizer, ts)] = PHASES.index("optimizer")
        return phase
    names = columns.cpu_op_names
    backward = np.zeros(ts.size, bool)
    by_op = wanted & (source >= 0)
    backward[by_op] = named(names[source[by_op]], BACKWARD_OP_PREFIX)
    for tid, (_, _, index) in outer.items():  # autograd's thread: all its outermost ops are
        if index.size and named(names[index], BACKWARD_OP_PREFIX).all():
            backward |= thread == tid
    phase[wanted & backward] = PHASES.index("backward")
    zero_grad = named(columns.annotation_names, ZERO_GRAD_PREFIX)
    # torch.optim's span written as an operator (the 2021 vocabulary): an outermost one
    outermost = np.concatenate([index for _, _, index in outer.values()] + [np.empty(0, int)])
    zero_grad_ops = outermost[named(names[outermost], ZERO_GRAD_PREFIX)]
    spans = concat(optimizer, Spans(columns.annotations.start[zero_grad],
                                    columns.annotations.end[zero_grad]),
                   Spans(columns.cpu_ops.start[zero_grad_ops], columns.cpu_ops.end[zero_grad_ops]))
    phase[wanted & inside(spans, ts)] = PHASES.index("optimizer")
    return phase
