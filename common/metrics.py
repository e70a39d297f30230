"""The GPU metrics the verdicts read, from a trace's columns in the steps' window: utilization,
idle and its causes (idle_causes.py), kernels and tensor cores, launches and CUDA graph replays, host
syncs (syncs.py), copies and round trips, the optimizer region and attention."""
from __future__ import annotations

import numpy as np

from common.communication import collective_kernels
from common.idle_causes import HostRegions, idle_by_cause_pct, unrecorded_work
from common.intervals import Spans, clip, concat, covered_length, merge, total, union_in
from common.kernel_names import (
    SIXTEEN_BIT_PRECISIONS,
    data_precision,
    handwritten_gemm_precision,
    is_gemm,
    is_layout_conversion,
    is_memory_bound_op,
    is_softmax,
    signature_precision,
    uses_tensor_cores,
    uses_tf32,
)
from common.syncs import HostSyncs, host_syncs, sync_metrics
from common.trace import BYTES_PER_MB
from common.trace_columns import (
    OPTIMIZER_REGION,
    ROLE_REGION,
    TraceColumns,
    name_role,
)
from common.trace_steps import US_PER_MS, launching_call

# Definitions (sources in common/README.md, "Analyzing a trace"; the steps and the window in
# trace_steps.py, the idle causes in idle_causes.py):
#   utilization  union of kernels in the window / window (plugin "GPU Utilization").
#   idle         1 - union(kernels, memcpy, memset) / (last GPU end - first GPU start), whole
#                trace (Holistic Trace Analysis temporal breakdown), on float timestamps.
#   dataloader   union of enumerate(DataLoader)#...__next__ spans in the window / window.
#   syncs        host syncs in the steps, each the cause of the operator that issued it, and the
#                GPU idle in the gaps they return in (common/syncs.py).

SHORT_KERNEL_US = 10.0  # "short" kernel, µs: the issue's and peers' launch-overhead cut

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


BYTES_PER_GB = 1e9  # decimal, as MB (trace.BYTES_PER_MB) and Kineto's "memory bandwidth (GB/s)"
US_PER_S = 1e6


def host_memory_pct(columns: TraceColumns, copies: np.ndarray, duration_us: np.ndarray
                    ) -> tuple[float | None, float | None]:
    """Of these copies' time on the GPU, the shares (%) that copied from or to pinned and pageable
    host memory, as each copy's name says (trace_columns.PINNED_MARKER, PAGEABLE_MARKER); the
    rest names neither (ROCm's "Host", CUPTI's "Unknown" or "Managed", older Kineto's bare "Memcpy
    HtoD"). (None, None) where no copy names either: not a guess. Of time, not bytes: every copy
    has a duration, a trace without "bytes" too, so the share has one definition everywhere; and
    time is what pinning saves (pageable copies ran 7.8 GB/s against pinned ones' 54 on the H100,
    dataloader_workers bad and fixed: 5 % of the bytes from pageable memory is about a quarter
    of the time)."""
    if not copies.size:
        return None, None
    pinned = columns.memcpy_pinned
    pinned, pageable = pinned[copies], columns.memcpy_pageable[copies]
    time = float(duration_us.sum())
    if not (pinned | pageable).any() or time <= 0:
        return None, None
    if pinned.all() or pageable.all():  # exactly all: 100 * x / x need not be 100.0
        return (100.0, 0.0) if pinned.all() else (0.0, 100.0)
    return (100.0 * float(duration_us[pinned].sum()) / time,
            100.0 * float(duration_us[pageable].sum()) / time)


def achieved_gb_per_s(size_of: np.ndarray, duration_us: np.ndarray) -> float | None:
    """Bytes over time on the GPU, of the copies whose bytes the trace writes (GB/s, GB = 10^9
    bytes): Kineto's per-copy "memory bandwidth (GB/s)" averaged over the copies, each weighted
    by its time. None without bytes or time. Small copies measure latency, not bandwidth: a
    4-byte .item() copy of 1.6 µs reads 0.0025 GB/s."""
    known = ~np.isnan(size_of)
    time_us = float(duration_us[known].sum())
    if not known.any() or time_us <= 0:
        return None
    return float(size_of[known].sum()) / BYTES_PER_GB / (time_us / US_PER_S)


def copy_metrics(columns: TraceColumns, copied: tuple[np.ndarray, np.ndarray],
                 runtime_step: np.ndarray, n_steps: int) -> dict:
    """Per step, the copies each way (count, MB where the trace writes their bytes, ms on the
    GPU), and of them the shares of their time from or to pinned and pageable host memory
    (host_memory_pct) and the GB/s they ran at (achieved_gb_per_s); and the round trips: a
    device-to-host copy answered, later in the same step, by a host-to-device one of about its
    size (ROUND_TRIP_SIZE_RATIO_MAX; data taken to the host and sent back: .cpu() -> numpy ->
    .to(device), .tolist() -> torch.tensor(list, device=...)), each copy down paired once."""
    calls, copies = copied  # copy_calls'
    duration_us = (columns.memcpy.end - columns.memcpy.start)[copies]
    duration_ms = duration_us / US_PER_MS
    size_of = sizes(columns, copies)
    megabytes = size_of / BYTES_PER_MB
    per_direction = {}
    for direction, mask in (("h2d", columns.memcpy_h2d[copies]),
                            ("d2h", columns.memcpy_d2h[copies])):
        known = mask & ~np.isnan(megabytes)
        pinned_pct, pageable_pct = host_memory_pct(columns, copies[mask], duration_us[mask])
        per_direction[direction] = {
            "count": float(mask.sum()) / n_steps,
            "mb": float(megabytes[known].sum()) / n_steps if known.any() or not mask.any()
            else None,
            "ms": float(duration_ms[mask].sum()) / n_steps,
            "pinned_pct": pinned_pct,
            "pageable_pct": pageable_pct,
            "gb_per_s": achieved_gb_per_s(size_of[mask], duration_us[mask])}
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
    # A per-tensor loop calls each of its update operators once per parameter tensor (AdamW's
    # lerp_, addcmul_, sqrt, div, addcdiv_; SGD's add_): the call count most of its operator
    # names share is the tensors, and its calls over that count the calls a tensor (ties: the
    # smaller count, so SGD with momentum's mul_ once and add_ twice reads 3 calls a tensor).
    _, per_name = np.unique(columns.cpu_op_names[inside].astype(str), return_counts=True)
    counts, names_sharing = np.unique(per_name, return_counts=True)
    tensors = int(counts[np.argmax(names_sharing)]) if counts.size else 0
    cpu_us = total(region) - float(in_runtime)
    gpu_us = union_in(columns.gpu_optimizer, *window)
    low, high = window
    return {"ms_per_step": max(cpu_us, gpu_us) / US_PER_MS / n_steps,
            "pct": 100.0 * max(cpu_us, gpu_us) / (high - low) if high > low else 0.0,
            "cpu_ms_per_step": cpu_us / US_PER_MS / n_steps,
            "gpu_ms_per_step": gpu_us / US_PER_MS / n_steps if columns.gpu_optimizer.size else None,
            "ops_per_step": float(inside.sum()) / n_steps,
            "multi_tensor_ops_per_step": float(multi_tensor.sum()) / n_steps,
            "tensors_per_step": tensors / n_steps,
            "calls_per_tensor": float(inside.sum()) / tensors if tensors else None}


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


def utilization_by_device(columns: TraceColumns, low: float,
                          high: float) -> dict[str, float] | None:
    """Each GPU's utilization (its kernels, copies and memsets: their union in [low, high] over
    its length) by the pid its events are under; None where one GPU works in [low, high] (another
    may have, outside it: the union there is the one GPU's)."""
    if len(columns.gpu_devices) < 2 or high <= low:
        return None
    ops = ((columns.kernels, columns.kernel_device), (columns.memcpy, columns.memcpy_device),
           (columns.memset, columns.memset_device))
    by_device = {}
    for index, pid in enumerate(columns.gpu_devices):
        mine = concat(*(Spans(spans.start[device == index], spans.end[device == index])
                        for spans, device in ops))
        by_device[str(pid)] = 100.0 * union_in(mine, low, high) / (high - low)
    return by_device if sum(pct > 0 for pct in by_device.values()) >= 2 else None


def gpu_metrics(columns: TraceColumns, window: tuple[float, float], n_steps: int,
                runtime_step: np.ndarray, steps: Spans | None = None,
                syncs: HostSyncs | None = None,
                copied: tuple[np.ndarray, np.ndarray] | None = None,
                regions: HostRegions | None = None) -> dict:
    """`steps`: the host steps (trace_steps.host_steps), for the syncs recorded only as
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
    # Off the tensor cores, a GEMM whose demangled signature gives 16-bit operands runs FP16/BF16
    # math on the CUDA cores, no FP32 math; a kernel of one's own whose signature gives only
    # float operands runs FP32 math that autocast does not change (kernel_names).
    off_tensor_cores = gemm & ~tensor_core
    cuda_core_16bit = off_tensor_cores & np.array(
        [signature_precision(n) in SIXTEEN_BIT_PRECISIONS for n in table], dtype=bool)[name_id]
    handwritten_fp32 = off_tensor_cores & np.array(
        [handwritten_gemm_precision(n) == "fp32" for n in table], dtype=bool)[name_id]
    # Eager operators' memory-bound kernels (kernel_names.is_memory_bound_op), and those of them
    # whose data is FP32 (kernel_names.data_precision): what BF16 halves and fusion cuts.
    memory_bound = np.array([is_memory_bound_op(n) for n in table], dtype=bool)
    memory_bound_fp32 = memory_bound & np.array([data_precision(n) == "fp32" for n in table],
                                                dtype=bool)
    layout_conversion = np.array([is_layout_conversion(n) for n in table], dtype=bool)
    softmax = memory_bound & np.array([is_softmax(n) for n in table], dtype=bool)

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
    # GPU work of every kind (kernels, copies, memsets): utilization, and the idle time the causes
    # split, are its share of the window and the rest (they add up to 100).
    gpu_busy = union_in(busy, low, high)

    def kernels_in_window(named: np.ndarray) -> float:
        """The union in the window of the kernels whose name `named` marks (per name)."""
        chosen = named[columns.kernel_name_id]
        return union_in(Spans(kernels.start[chosen], kernels.end[chosen]), low, high)

    idle = idle_by_cause_pct(columns, busy, window, syncs.end[syncs.step >= 0], regions,
                             unrecorded_work(columns, window))
    return {
        "utilization_pct": share(gpu_busy, span),
        # Of a trace with GPU work on several devices (one process driving them: a model split
        # across GPUs), each device's utilization: every other GPU number is of their union.
        "utilization_pct_by_device": utilization_by_device(columns, low, high),
        # The same, of the time the trace accounts for: without the idle stretches in which the
        # GPU ran or waited on work launched before the recording (idle cause "unrecorded").
        "recorded_utilization_pct": share(gpu_busy, span * (1 - idle["unrecorded"] / 100.0)),
        # Utilization in three parts that add up to it: compute kernels, collective kernels with
        # no compute beside them, and copies and memsets with no kernel beside them.
        "compute_pct": share(compute_busy, span),
        "exposed_comm_pct": share(kernel_busy - compute_busy, span),
        "copy_only_pct": share(gpu_busy - kernel_busy, span),
        # The window's idle time: what the causes (idle_by_cause_pct) split.
        "idle_pct": 100.0 - share(gpu_busy, span),
        # HTA's idle: the same work over another span, the first to the last GPU op of the trace
        # (any steps), as Holistic Trace Analysis defines it; shown only under HTA's name.
        "hta_idle_pct": 100.0 - share(total(busy), gpu_span) if gpu_span > 0 else 0.0,
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
        "non_tensor_core_gemm_pct": share(float(duration[off_tensor_cores].sum()), kernel_time),
        # Of it: GEMMs of 16-bit operands (not what fp32_matmul reads), and one's own FP32 GEMMs
        # with the one that takes the most time (null without).
        "cuda_core_16bit_gemm_pct": share(float(duration[cuda_core_16bit].sum()), kernel_time),
        "handwritten_fp32_gemm_pct": share(float(duration[handwritten_fp32].sum()), kernel_time),
        # Share of the window the GPU spends in eager memory-bound kernels (the union of them in
        # the window / window, as utilization), in those of them moving FP32 data, and in two parts
        # of them: layout conversions and softmaxes.
        "memory_bound_pct": share(kernels_in_window(memory_bound), span),
        "memory_bound_fp32_pct": share(kernels_in_window(memory_bound_fp32), span),
        "layout_conversion_pct": share(kernels_in_window(layout_conversion), span),
        "softmax_pct": share(kernels_in_window(softmax), span),
        "handwritten_fp32_gemm_top": (
            table[int(np.bincount(name_id[handwritten_fp32], weights=duration[handwritten_fp32],
                                  minlength=len(table)).argmax())]
            if handwritten_fp32.any() else None),
        # syncs_per_step, syncs_by_cause_per_step, sync_idle_pct (and by cause), sync sources
        **sync_metrics(syncs, busy, low, high, n_steps,
                       None if steps is None else steps.end),
        **copy_metrics(columns, copied, runtime_step, n_steps),
        "idle_by_cause_pct": idle,
    }
