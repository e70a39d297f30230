"""Where each host sync comes from: the syncs in a trace (by API name, or named by a cuda_sync
event), the operator that issued each one and so its cause (a value read, a host-to-device copy,
other), and the GPU idle time in the gaps they return in. gpu_metrics (metrics.py) reports them;
the host_sync and h2d_copy verdicts (verdicts.py) read them."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from common.intervals import Spans
from common.trace_columns import TraceColumns

# A sync is the operator's that issued it: the innermost CPU operator span on the same thread that
# holds the runtime call. (Runtime calls also carry an "External id", but in the 2022-2023 traces
# the real traces the tests read it does not match their operator's: time on the thread does.)
# value_read: the host reads a value computed on the GPU (.item(), .cpu(), .tolist(), `if t:`,
#   print(t); data-dependent shapes: nonzero, boolean-mask indexing, unique, masked_select).
#   The operators below, or a copy (COPY_OPS) whose GPU copy runs device-to-host.
# h2d_copy: a copy whose GPU copy runs host-to-device: from pageable memory the copy waits for
#   the stream (.to(device, non_blocking=True) included), and a blocking one waits as well.
# other: anything else (torch.cuda.synchronize() outside any operator, a library's own syncs).
SYNC_CAUSES = ("value_read", "h2d_copy", "other")
# Operators whose output's shape depends on the data: the host must read a count before it can
# allocate the result (PyTorch documents nonzero as a host-device sync; boolean-mask indexing
# x[mask] runs it). They read a value (host_sync counts them), and the host_roundtrip verdict
# counts them apart: a sync no loop can defer, only a fixed-shape op avoids.
DATA_DEPENDENT_OPS = frozenset({
    "aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique", "aten::_unique2",
    "aten::unique_dim", "aten::unique_consecutive", "aten::repeat_interleave"})
VALUE_READ_OPS = frozenset({"aten::item", "aten::_local_scalar_dense", "aten::is_nonzero",
                            "aten::equal", "aten::allclose"}) | DATA_DEPENDENT_OPS
COPY_OPS = frozenset({"aten::copy_", "aten::_to_copy", "aten::to", "aten::_copy_from",
                      "aten::_copy_from_and_resize"})
NO_OPERATOR = "(no operator)"
SYNC_SOURCES_SHOWN = 3  # issuing operators listed per cause, the most frequent first


@dataclass
class HostSyncs:
    """Every host sync in the trace, one entry each: when the host waited (start) and got
    control back (end), on which thread (-1: a cuda_sync event of no runtime call), its host
    step (-1: none), its cause (index into SYNC_CAUSES) and its source (operator and copy)."""
    start: np.ndarray
    thread: np.ndarray
    end: np.ndarray
    step: np.ndarray
    cause: np.ndarray
    source: list[str]


def step_index(steps: Spans, spans: Spans) -> np.ndarray:
    """For each span, the host step that wholly contains it (-1: none)."""
    index = np.searchsorted(steps.start, spans.start, side="right") - 1
    inside = index >= 0
    inside[inside] = spans.end[inside] <= steps.end[index[inside]]
    return np.where(inside, index, -1)


def previous_longer(end: np.ndarray) -> np.ndarray:
    """For each j, the largest k < j with end[k] > end[j] (-1: none), by a stack."""
    result = np.full(end.size, -1, np.int64)
    stack: list[int] = []
    values = end.tolist()
    for j, value in enumerate(values):
        while stack and values[stack[-1]] <= value:
            stack.pop()
        if stack:
            result[j] = stack[-1]
        stack.append(j)
    return result


def innermost_holders(ops: Spans, op_thread: np.ndarray, calls: Spans,
                      call_thread: np.ndarray) -> np.ndarray:
    """For each call, the index of the innermost op on its thread that holds it (starts no later,
    ends no earlier), -1 where none. Calls on one thread run one after another; ops nest."""
    result = np.full(calls.size, -1, np.int64)
    for thread in np.unique(call_thread):
        asked = np.flatnonzero(call_thread == thread)
        asked = asked[np.argsort(calls.start[asked], kind="stable")]
        mine = np.flatnonzero(op_thread == thread)
        if not mine.size:
            continue
        # Only the ops that hold a call matter (a few per call): an op holds one if the first
        # call that starts inside it also ends inside it.
        first = np.searchsorted(calls.start[asked], ops.start[mine], side="left")
        some = first < asked.size
        holds = np.zeros(mine.size, bool)
        holds[some] = calls.end[asked[first[some]]] <= ops.end[mine[some]]
        holders = mine[holds]
        holders = holders[np.lexsort((-ops.end[holders], ops.start[holders]))]
        start, end = ops.start[holders], ops.end[holders]
        jump = previous_longer(end)
        # The innermost holder is the last (by start, then shortest) op that ends after the call
        # does among those that start before it: from the last that starts before it, jump back
        # over the ops that end too early (every op between j and jump[j] ends before j does).
        last = np.searchsorted(start, calls.start[asked], side="right") - 1
        for call, j in zip(asked.tolist(), last.tolist()):
            call_end = calls.end[call]
            while j >= 0 and end[j] < call_end:
                j = jump[j]
            if j >= 0:
                result[call] = holders[j]
    return result


def copy_direction(columns: TraceColumns, op: int, thread: int, copy_calls: dict) -> str:
    """"DtoH", "HtoD, pageable", "HtoD" or "" for the GPU copies that runtime calls inside the
    operator span `op` (on `thread`) launched."""
    starts, ends, copies = copy_calls.get(thread, (np.empty(0), np.empty(0), np.empty(0, int)))
    low, high = columns.cpu_ops.start[op], columns.cpu_ops.end[op]
    inside = slice(np.searchsorted(starts, low, side="left"),
                   np.searchsorted(starts, high, side="right"))
    chosen = copies[inside][ends[inside] <= high]
    if columns.memcpy_d2h[chosen].any():
        return "DtoH"
    h2d = columns.memcpy_h2d[chosen]
    if h2d.any():
        return "HtoD, pageable" if columns.memcpy_pageable[chosen[h2d]].any() else "HtoD"
    return ""


def host_syncs(columns: TraceColumns, steps: Spans, runtime_step: np.ndarray) -> HostSyncs:
    """The runtime calls that made the host wait (by name, SYNC_PATTERN, or named by a cuda_sync
    event of a host kind through its correlation id: counted once), and the cuda_sync events of
    no runtime call in the trace (their own time; no operator known)."""
    runtime = columns.runtime
    marked = columns.host_sync_correlation[columns.host_sync_correlation >= 0]
    linked = np.isin(columns.runtime_correlation, marked) & (columns.runtime_correlation >= 0)
    calls = np.flatnonzero(columns.runtime_is_sync | linked)
    known = columns.runtime_correlation[columns.runtime_correlation >= 0]
    alone = ~np.isin(columns.host_sync_correlation, known) | (columns.host_sync_correlation < 0)

    call_spans = Spans(runtime.start[calls], runtime.end[calls])
    call_thread = columns.runtime_thread[calls]
    holder = innermost_holders(columns.cpu_ops, columns.cpu_op_thread, call_spans, call_thread)
    # The runtime calls that launched a GPU copy, per thread, by start: what a copy op copied.
    copy_order = np.argsort(columns.memcpy_correlation, kind="stable")
    copy_correlation = columns.memcpy_correlation[copy_order]
    position = np.clip(np.searchsorted(copy_correlation, columns.runtime_correlation), 0,
                       max(copy_correlation.size - 1, 0))
    launches_copy = (copy_correlation.size > 0) & (columns.runtime_correlation >= 0)
    if copy_correlation.size:
        launches_copy &= copy_correlation[position] == columns.runtime_correlation
    copy_calls = {}
    for thread in np.unique(call_thread):
        mine = np.flatnonzero(launches_copy & (columns.runtime_thread == thread))
        mine = mine[np.argsort(runtime.start[mine], kind="stable")]
        copy_calls[int(thread)] = (runtime.start[mine], runtime.end[mine],
                                   copy_order[position[mine]])

    cause, source = [], []
    for op, thread in zip(holder.tolist(), call_thread.tolist()):
        name = str(columns.cpu_op_names[op]) if op >= 0 else NO_OPERATOR
        direction = copy_direction(columns, op, thread, copy_calls) if name in COPY_OPS else ""
        if name in VALUE_READ_OPS or direction == "DtoH":
            cause.append(0)
        elif direction.startswith("HtoD"):
            cause.append(1)
        else:
            cause.append(2)
        source.append(f"{name} ({direction})" if direction else name)
    lone = Spans(columns.host_syncs.start[alone], columns.host_syncs.end[alone])
    cause += [2] * lone.size
    source += [NO_OPERATOR] * lone.size
    return HostSyncs(start=np.r_[call_spans.start, lone.start],
                     thread=np.r_[call_thread, np.full(lone.size, -1)].astype(np.int64),
                     end=np.r_[call_spans.end, lone.end],
                     step=np.r_[runtime_step[calls], step_index(steps, lone)].astype(np.int64),
                     cause=np.array(cause, np.int64), source=source)


# --- The GPU idle they cost, and the numbers gpu_metrics reports. ---------------------------

def gap_of(sync_ends: np.ndarray, busy: Spans) -> np.ndarray:
    """The GPU idle gap each sync returns in, -1 for one that returns while the GPU is busy. Gap
    k runs from the end of busy interval k-1 (or the start of time) to the start of busy interval
    k (or the end of time): k = how many busy intervals start at or before the sync's end."""
    k = np.searchsorted(busy.start, sync_ends, side="right")
    after = np.r_[-np.inf, busy.end][k]  # when gap k starts
    return np.where(sync_ends < after, -1, k)


def sync_idle_us(sync_ends: np.ndarray, busy: Spans, low: float, high: float) -> np.ndarray:
    """Per sync, the GPU idle time in the gap it returns in: the GPU drained its queue for the
    host, and waits until the host launches again. Each gap counts once, for the first sync that
    returns in it (the one that waited; those after it return at once); 0 for the others, for a
    sync that returns while the GPU is busy, and outside [low, high]."""
    credit = np.zeros(sync_ends.size)
    inside = np.flatnonzero((sync_ends >= low) & (sync_ends <= high))
    if not inside.size:
        return credit
    gap_start = np.r_[low, busy.end]
    gap_end = np.r_[busy.start, high]
    inside = inside[np.argsort(sync_ends[inside], kind="stable")]
    k = gap_of(sync_ends[inside], busy)
    idle = k >= 0
    gaps, first = np.unique(k[idle], return_index=True)  # the first sync (by end) in each gap
    lengths = np.minimum(gap_end[gaps], high) - np.maximum(gap_start[gaps], low)
    credit[inside[np.flatnonzero(idle)[first]]] = lengths.clip(min=0)
    return credit


def ends_its_step(sync_ends: np.ndarray, step_ends: np.ndarray, busy: Spans) -> np.ndarray:
    """Per sync, whether the GPU idle gap it returns in lasts past the end of its host step
    (`step_ends`, each sync's): the GPU's next op is the next step's, so what it waits for after
    the sync is the host's own work between steps (Python, the next batch, logging), not the
    sync. A sync that returns while the GPU is busy: False."""
    k = gap_of(sync_ends, busy)
    gap_end = np.r_[busy.start, np.inf][np.maximum(k, 0)]
    return (k >= 0) & (gap_end > step_ends)


def sync_metrics(syncs: HostSyncs, busy: Spans, low: float, high: float, n_steps: int,
                 step_ends: np.ndarray | None = None) -> dict:
    """Syncs per step (all, and by cause), GPU idle in the gaps they return in, and the operators
    that issued them. With the host steps' ends (`step_ends`, by step index), the part of that
    idle in gaps that outlast their step (ends_its_step), by cause."""
    in_steps = syncs.step >= 0
    idle = sync_idle_us(syncs.end[in_steps], busy, low, high)
    final = (ends_its_step(syncs.end[in_steps], step_ends[syncs.step[in_steps]], busy)
             if step_ends is not None else np.zeros(idle.size, bool))
    cause = syncs.cause[in_steps]
    sources = [s for s, inside in zip(syncs.source, in_steps.tolist()) if inside]
    span = high - low
    by_cause, idle_by_cause, sources_by_cause, final_by_cause = {}, {}, {}, {}
    for index, name in enumerate(SYNC_CAUSES):
        mine = cause == index
        by_cause[name] = float(mine.sum()) / n_steps
        idle_by_cause[name] = 100.0 * float(idle[mine].sum()) / span if span > 0 else 0.0
        final_by_cause[name] = 100.0 * float(idle[mine & final].sum()) / span if span > 0 else 0.0
        counts = Counter(s for s, chosen in zip(sources, mine.tolist()) if chosen)
        sources_by_cause[name] = {s: n / n_steps for s, n in counts.most_common(SYNC_SOURCES_SHOWN)}
    data_dependent = sum(source in DATA_DEPENDENT_OPS for source in sources)
    return {"syncs_per_step": float(in_steps.sum()) / n_steps,
            "data_dependent_syncs_per_step": data_dependent / n_steps,
            "syncs_by_cause_per_step": by_cause,
            "sync_idle_pct": 100.0 * float(idle.sum()) / span if span > 0 else 0.0,
            "sync_idle_pct_by_cause": idle_by_cause,
            # Of it, the gaps that outlast the sync's step: the host's own work between steps.
            "step_end_sync_idle_pct_by_cause": final_by_cause,
            "sync_sources_per_step": sources_by_cause}
