"""torch.distributed in a rank's trace: its collectives per step, their time and the share of it
no compute kernel hides (TraceLens's exposed communication), and gradient accumulation's
micro-batches with the gradient all-reduces that follow each."""
from __future__ import annotations

import numpy as np

from common.intervals import Spans, union_in
from common.trace_columns import TraceColumns, is_collective_kernel
from common.trace_steps import US_PER_MS

# Share of the most gradient elements any micro-batch's collectives hold: a micro-batch holding
# this much all-reduced every bucket. Below 1 for what a step may add on top (a logged metric);
# two DDP models of near-equal size (within 1 %) would read as one.
BUCKET_ELEMENTS_SHARE_MIN = 0.99


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
    followed, before the next (or the window's end), by the gradient buckets' collectives. A
    micro-batch is synced when what follows it holds (nearly) as many elements as the most any
    micro-batch's collectives hold: every bucket of the model. The buckets' sizes may change (DDP
    rebuilds them after its first iteration, which a trace without a schedule records); their sum
    does not. Two DDP models (a GAN) hold two sums, and only the larger counts. Without sizes
    (no record_shapes), one is synced when it is followed by as many collectives as the most.
    Without no_sync every micro-batch all-reduces every bucket; with it only the last of a step
    does, and a loss all-reduced after each one (a scalar) is no bucket sync."""
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
    held = [sizes[a:b] for a, b in zip(first.tolist(), last.tolist())]
    elements = np.array([np.nansum(each) for each in held])
    if elements.max() > 0:
        synced = elements >= BUCKET_ELEMENTS_SHARE_MIN * elements.max()
    else:
        counts = np.array([each.size for each in held])
        synced = (counts > 0) & (counts == counts.max())
    return int(forwards.size), int(synced.sum())
