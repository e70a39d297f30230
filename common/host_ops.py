"""The host's operators as a CPU-only trace shows them: how many a step, how long each takes
for itself, and the step's time outside any of them (Python, between the operators).

On a CPU the operators are the work: what a GPU trace splits between the host (launches) and the
device (kernels) happens in each operator's own time. Two regimes hold a CPU step back without a
single slow operator: many short operators, where the framework's fixed cost per operator
(dispatch, allocation, the Python call) sets the pace (llm_decode/bad: every generated token runs
every block's operators one by one); and Python between the operators (host_roundtrip/bad: a loop
over .tolist() values), long gaps where no operator runs at all. The verdicts cpu_op_overhead and
python_between_ops read these numbers (common/verdicts.py).
"""
from __future__ import annotations

import numpy as np

from common.idle_causes import compiling_operators, enqueues_nothing, names_where
from common.intervals import Spans, concat, merge, minus, union_in
from common.trace_columns import ROLE_COLLECTIVE, TraceColumns, name_role
from common.trace_steps import US_PER_MS, self_time_us

# Operators whose own time (self time: less the operators they call) is under this are short:
# their time is mostly the framework's fixed cost per call, not arithmetic; so are the gaps
# between operators under it, each call's Python. ~10 µs is what one eager CPU operator costs
# through Python on current PyTorch (dispatch, output allocation, the binding).
CPU_SHORT_OP_US = 10.0  # µs of self time
CPU_OPS_SHOWN = 3  # operators named in the evidence, by self time per step


def operators(columns: TraceColumns) -> np.ndarray:
    """Per cpu_ops span, whether it is a PyTorch operator (not a harness region written as one)."""
    if columns.cpu_op_is_region.size:
        return ~columns.cpu_op_is_region
    return np.ones(columns.cpu_ops.size, bool)


def cpu_run_metrics(columns: TraceColumns, host_window: tuple[float, float], n_steps: int,
                    held: Spans) -> dict:
    """A CPU-only trace's operators in the host window: per step, how many and their self time;
    the median operator's self time; the share of the window in short operators' self time
    (CPU_SHORT_OP_US) and outside every operator. `held`: time another cause already names (the
    DataLoader's spans, the host regions, collective calls), not counted as outside operators.
    torch.compile's compiling ranges (torch 2.14 writes them as operators) and the operators
    inside them are no operators: their time is compiling, which `compiled` and `initialization`
    name, held as well (idle_causes.compiling_operators)."""
    low, high = host_window
    span = high - low
    ops = columns.cpu_ops
    compiling = compiling_operators(columns)
    held = concat(held, Spans(ops.start[compiling], ops.end[compiling]))
    every = operators(columns)
    ours = every & ~compiling
    in_window = ours & (ops.start >= low) & (ops.start < high)
    # Self time among all of them: the compiling an operator holds (the backward's, compiled in
    # CompiledFunctionBackward's first call) is none of its own time.
    self_us = self_time_us(Spans(ops.start[every], ops.end[every]), columns.cpu_op_thread[every])
    self_us = self_us[in_window[every]]
    covered = merge(concat(Spans(ops.start[in_window], ops.end[in_window]), held))
    outside = span - union_in(covered, low, high)
    # The gaps between operators (and other named time) inside the window: the short ones are
    # each call's own Python (argument parsing, the binding), the long ones Python work.
    edges = np.clip(np.r_[low, covered.end, covered.start, high], low, high)
    count = covered.size + 1
    gaps = (edges[count:] - edges[:count]).clip(min=0)  # [low, first start], ..., [last end, high]
    short_gaps_us = float(gaps[gaps < CPU_SHORT_OP_US].sum())
    short = self_us < CPU_SHORT_OP_US

    def share(us: float) -> float:
        return 100.0 * us / span if span > 0 else 0.0

    short_pct, outside_pct = share(float(self_us[short].sum())), share(max(outside, 0.0))
    short_gaps_pct = share(short_gaps_us)
    # Names are interned strings (trace_columns): grouped by identity, without sorting strings.
    op_names = columns.cpu_op_names[in_window]
    _, first, code = np.unique(np.fromiter(map(id, op_names), np.int64, op_names.size),
                               return_index=True, return_inverse=True)
    by_name = np.bincount(code.ravel(), weights=self_us, minlength=first.size)
    top = [(str(op_names[first[i]]), float(by_name[i]))
           for i in np.argsort(-by_name, kind="stable")[:CPU_OPS_SHOWN]]
    # Communication no operator hides (the GPU's exposed_comm_pct, on a CPU): a collective in
    # flight (its "<backend>:<collective>" span, which gloo runs on threads of its own; else its
    # c10d::* operator) while no other operator runs on any thread, the training thread waiting
    # for it. DDP all-reduces its buckets during the backward pass: what overlaps it is hidden.
    # Collective calls are no such operator, in the 2021 vocabulary's "Operator" spans too; with
    # no other operator in the window (a rank's trace of its all-reduces alone) nothing shows
    # what could have hidden them: None.
    calls = columns.collective_spans if columns.collective_spans.size else columns.collective_ops
    work = ours & ~names_where(columns.cpu_op_names,
                               lambda name: name_role(name) == ROLE_COLLECTIVE)
    exposed = minus(calls, Spans(ops.start[work], ops.end[work]))
    works = (work & (ops.start >= low) & (ops.start < high)).any()
    return {
        "ops_per_step": float(in_window.sum()) / n_steps,
        "median_op_self_us": float(np.median(self_us)) if self_us.size else None,
        "short_op_pct": short_pct,
        "outside_ops_pct": outside_pct,
        # Of it, the gaps of CPU_SHORT_OP_US or more: Python's own work between operators.
        "long_gap_pct": max(outside_pct - short_gaps_pct, 0.0),
        "short_gap_pct": short_gaps_pct,
        # The step's time in making calls rather than in arithmetic: short operators' own time
        # and the short gaps between operators, where eager mode runs each call's Python.
        "call_pct": short_pct + short_gaps_pct,
        "top_ops_ms_per_step": [(name, us / US_PER_MS / n_steps) for name, us in top],
        "exposed_comm_pct": share(union_in(exposed, low, high)) if works else None,
    }


# --- Host work in operators while the GPU waits. -------------------------------------------------
# A host operator that enqueues no GPU work (no launch, copy or memset call starts while it is
# open, on any thread) and lasts at least this long is work on the host: CPU tensor creation
# (torch.randn on the CPU), CPU math, decoding. Ten launch calls' worth (a launch costs ~5 µs):
# shorter ones (views, empty, as_strided) are dispatch, which the idle cause "launch" holds.
HOST_OP_MIN_US = 50.0  # µs an operator runs without enqueuing GPU work


def host_work_ops(columns: TraceColumns, host_window: tuple[float, float]
                  ) -> tuple[Spans, np.ndarray, list[str]]:
    """The outermost such operators (HOST_OP_MIN_US) starting in the host window, as disjoint
    segments sorted by start (a later one clipped where an earlier one, on another thread, still
    runs), the index of each one's name, and the names."""
    low, high = host_window
    ops = columns.cpu_ops
    candidate = operators(columns) & (ops.start >= low) & (ops.start < high) & (
        ops.end - ops.start >= HOST_OP_MIN_US)
    # Without runtime calls (a trace of GPU events alone) nothing tells what enqueued the work.
    if not candidate.any() or not columns.runtime_enqueues.any():
        return Spans.empty(), np.empty(0, np.int64), []
    index = np.flatnonzero(candidate)
    index = index[enqueues_nothing(columns, ops.start[index], ops.end[index])]
    if not index.size:
        return Spans.empty(), np.empty(0, np.int64), []
    index = index[np.lexsort((-ops.end[index], ops.start[index]))]  # outer before inner
    start, end = ops.start[index], ops.end[index]
    reach = np.maximum.accumulate(end)
    before = np.r_[-np.inf, reach[:-1]]  # the furthest end among the earlier ones
    outermost = end > before  # not inside an earlier one
    start = np.maximum(start, before)[outermost]
    end, index = end[outermost], index[outermost]
    names, label = np.unique(columns.cpu_op_names[index].astype(str), return_inverse=True)
    return Spans(start, end), label.ravel(), list(names)


# The idle cause of a host operator's time (idle_causes.idle_by_cause_pct takes it as it takes a
# host region's name): "CPU op aten::randn".
HOST_OP_CAUSE_PREFIX = "CPU op "


def without(a: Spans, a_label: np.ndarray, b: Spans) -> tuple[Spans, np.ndarray]:
    """The parts of the disjoint, sorted segments `a` (each with its label) that no interval of
    the merged `b` covers."""
    if not a.size or not b.size:
        return a, a_label
    points = np.unique(np.r_[a.start, a.end, b.start, b.end])
    low, high = points[:-1], points[1:]
    middle = (low + high) / 2
    k = np.searchsorted(a.start, middle, side="right") - 1
    in_a = (k >= 0) & (middle < a.end[np.maximum(k, 0)])
    j = np.searchsorted(b.start, middle, side="right") - 1
    in_b = (j >= 0) & (middle < b.end[np.maximum(j, 0)])
    keep = in_a & ~in_b
    return Spans(low[keep], high[keep]), a_label[k[keep]]


def with_host_work_ops(regions, columns: TraceColumns, host_window: tuple[float, float]):
    """The host regions (idle_causes.HostRegions) and, in the time no region, DataLoader span or
    runtime call holds, the host operators that enqueue no GPU work (host_work_ops), each a cause
    named HOST_OP_CAUSE_PREFIX + its name: what the idle split names while the GPU waits. A
    runtime call inside one is the CUDA runtime's time (context creation under a first
    aten::empty_strided, a sync), not the operator's work."""
    ops, label, names = host_work_ops(columns, host_window)
    if not ops.size:
        return regions
    ops, label = without(ops, label, merge(concat(regions.segments, columns.dataloader,
                                                  columns.runtime)))
    segments = concat(regions.segments, ops)
    labels = np.r_[regions.label, label + len(regions.names)].astype(np.int64)
    order = np.argsort(segments.start, kind="stable")
    op_names = [HOST_OP_CAUSE_PREFIX + name for name in names]
    return type(regions)(Spans(segments.start[order], segments.end[order]), labels[order],
                         list(regions.names) + op_names,
                         {**regions.outside_ops_pct, **dict.fromkeys(op_names, 0.0)})
