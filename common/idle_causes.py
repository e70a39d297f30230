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
from common.trace_columns import TraceColumns
from common.trace_steps import US_PER_MS, gpu_ops, launching_call

# Definitions (sources in common/README.md, "Analyzing a trace"):
#   host regions record_function ranges that are host work: while one is open no GPU work is
#                enqueued, and for at least four fifths of its time no operator or collective
#                call runs (host_regions).
#   idle causes  each idle instant of the GPU in the window goes to the first that holds of:
#                DataLoader (a __next__ span is open), a host region (by name, the innermost),
#                host sync (a sync returns in its gap), launch (the gap's next GPU op was
#                enqueued after the gap began), other.

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
