"""Read a Kineto trace into numpy columns (TraceColumns): one pass over its events, a piece at a
time, each event's meaning taken from its category (either vocabulary) and its name."""
from __future__ import annotations

import gc
import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path

import numpy as np

from common import sanity, trace
from common.intervals import Spans

# --- What an event is, from its category (lowercased). -----------------------------------------
# Works on any Kineto trace:
# both category vocabularies (2021: Kernel, Runtime, Operator, Memcpy, Memset; current:
# kernel, cuda_runtime, cuda_driver, cpu_op, user_annotation, gpu_memcpy, gpu_memset; and what our
# harness rewrites for the TensorBoard plugin, common/tensorboard_compat.py: DataLoader spans
# user_annotation -> cpu_op, cuda_runtime/cuda_driver -> Runtime, fwdbwd -> forward_backward, the
# GPU copies of ProfilerStep#N gpu_user_annotation -> gpu_profiler_step; our data/forward/backward/
# optimizer regions stay user_annotation), integer or float timestamps. Spans are found by name
# (ProfilerStep#N, enumerate(DataLoader)#...__next__, data, forward, ...) in any CPU-side category.
KERNEL_CATEGORIES = {"kernel"}
MEMCPY_CATEGORIES = {"gpu_memcpy", "memcpy"}
MEMSET_CATEGORIES = {"gpu_memset", "memset"}
RUNTIME_CATEGORIES = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
# GPU-timeline copies of record_function ranges (ProfilerStep#N among them): neither GPU work
# nor CPU spans, so they are skipped (they would double the steps). Any other gpu_* category
# but the copies and memsets is skipped too (our harness renames the step copies
# gpu_profiler_step for the TensorBoard plugin).
SKIPPED_CATEGORIES = {"gpu_user_annotation", "gpu_profiler_step"}
SKIPPED_CATEGORY_PREFIX = "gpu_"
# Of those copies, the optimizer region's are read (TraceColumns.gpu_optimizer): the time the GPU
# spent in optimizer.step, which on a GPU-bound run the CPU's span does not show (the CPU reaches
# the optimizer long before the GPU does, and its span holds waits for a full launch queue).
GPU_REGION_CATEGORY = "gpu_user_annotation"
# CPU work for the step breakdown's "CPU Exec": the plugin's CpuOp role, which is operator spans
# only (torch_tb_profiler 0.4.3, trace.py create_trace_event and event_parser.py _parse_step: the
# categories it maps to Operator and Python). It drops every user_annotation but ProfilerStep#N
# (so our data/forward/backward/optimizer regions are not CPU Exec) and keeps python_function
# out of CpuOp: Python time between operators is "other", as in its Overview. Other CPU-side
# categories (user_annotation, python_function, Trace, overhead, ...) are searched for step,
# DataLoader and region names but not counted as work.
CPU_OP_CATEGORIES = {"cpu_op", "operator", "python"}
# Python frames (torch.profiler with_stack=True): read besides, for the hot frames (metrics).
PYTHON_FRAME_CATEGORY = "python_function"

# record_function ranges are written in this category by current Kineto (and stay so after our
# TensorBoard rewrite): where the host regions (idle_causes.host_regions) are looked for, besides the
# harness's own region names in any category (the 2021 vocabulary writes every range and
# operator as "Operator", where a user's region cannot be told from an operator).
ANNOTATION_CATEGORY = "user_annotation"
# The harness's record_function regions, drawn on the report's CPU timeline.
REGION_NAMES = ("data", "forward", "backward", "optimizer")
DATALOADER_REGION = "DataLoader"
# torch.optim wraps every optimizer.step() in a record_function of its own ("Optimizer.step#AdamW.
# step", torch/optim/optimizer.py): counted into the "optimizer" region, so traces recorded
# without our harness have one too.
OPTIMIZER_REGION = "optimizer"
OPTIMIZER_STEP_PREFIX = "Optimizer.step#"

# The forward layers whose input's first dimension is the batch, read from "Input Dims" (written
# with record_shapes=True, as our harness records): what the small-batch and launch-overhead
# verdicts tell apart by. F.conv*d and F.linear (nn.Conv*d, nn.Linear) enter these ops and only in
# forward; backward's mm and convolution_backward carry transposed shapes that do not say which
# dimension is the batch. A compiled model (torch.compile) calls neither: no evidence then.
CONVOLUTION_OPS = ("aten::conv1d", "aten::conv2d", "aten::conv3d")
LINEAR_OPS = ("aten::linear",)
# Collectives of torch.distributed: each call is a "<backend>:<collective>" record_function span
# (nccl:all_reduce, gloo:all_reduce; c10d's ProcessGroup names them so), over the c10d::*
# operator that issued it (c10d::allreduce_), which only newer traces have; on a GPU the work is
# NCCL's kernels (ncclKernel_AllReduce_..., ncclDevKernel_... in NCCL 2.19 on).
COLLECTIVE_SPAN_PREFIXES = ("nccl:", "gloo:", "mpi:", "ucc:", "xccl:")
COLLECTIVE_OP_PREFIX = "c10d::"
# Collective kernels, the GPU's side of communication (lowercased, searched): NCCL's
# (ncclKernel_..., ncclDevKernel_... from NCCL 2.19; RCCL on ROCm names its kernels the same),
# PyTorch's symmetric-memory and intra-node collectives (symm_mem, c10d::symmetric_memory::...,
# c10d::intra_node_comm::...), DeepEP's MoE dispatch and combine (deep_ep::...), vLLM's custom
# all-reduce (cross_device_reduce_1stage/2stage) and MSCCL++ (mscclpp). A reduction inside one
# GPU (cub::DeviceReduce, a block reduction) carries none of these. Limit: a library that names
# its collectives otherwise is read as compute.
COLLECTIVE_KERNEL_PATTERN = re.compile(
    r"^(?:void )?(?:nccl|rccl)|symm_mem|symmetric_memory|intra_node_comm|deep_ep"
    r"|cross_device_reduce|mscclpp")
# A backward pass: autograd's nodes (AddmmBackward0, autograd::engine::evaluate_function: ...)
# or our "backward" region. Without one the trace is inference: no training-only advice.
BACKWARD_MARKER = "Backward"
# DistributedDataParallel records each forward call under this name (torch/nn/parallel/
# distributed.py): one per micro-batch, which tells how many backward passes a step holds.
DDP_FORWARD = "DistributedDataParallel.forward"
# The collectives that synchronise gradients (DDP's bucket all-reduces, FSDP's reduce-scatters):
# "<backend>:all_reduce", "nccl:reduce_scatter", "nccl:_reduce_scatter_base", c10d::allreduce_,
# c10d::reduce_scatter_ ... Not all_to_all (an embedding's exchange in the forward) nor
# all_gather/broadcast (parameters, not gradients).
GRADIENT_COLLECTIVE = re.compile(r"all_?reduce|reduce_?scatter")
# Softmax calls (with record_shapes): attention written by hand runs one over a [..., s, s] score
# matrix; its "Input Dims" give s (softmax_rows).
SOFTMAX_OPS = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax")

# Kernel launches: runtime and driver API calls that put a kernel (or a whole CUDA graph) in a
# stream. Prefix match, so cudaLaunchKernelExC and cuLaunchKernelEx count. ROCm's Kineto writes
# HIP's names in the same categories (cuda_runtime): hipLaunchKernel for PyTorch's own kernels,
# hipExtModuleLaunchKernel for hipBLASLt/Tensile GEMMs (the MI250 trace in ../shared/traces has
# both), hipModuleLaunchKernel for JIT-compiled (Triton) kernels.
LAUNCH_PREFIXES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel",
                   "cuLaunchCooperativeKernel", "cudaGraphLaunch", "cuGraphLaunch",
                   "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel",
                   "hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel",
                   "hipLaunchCooperativeKernel", "hipExtLaunchMultiKernel", "hipGraphLaunch")
# Host syncs: calls that make the host wait for the GPU. The explicit ones (device, stream, event:
# cudaStreamSynchronize, cuCtxSynchronize, hipDeviceSynchronize, ...) and the blocking copies,
# which wait for the stream before they copy (CUDA runtime API docs, "API synchronization
# behavior"): cudaMemcpy, hipMemcpy, and hipMemcpyWithStream, which PyTorch on ROCm calls for a
# blocking .to()/.item() where on CUDA it calls cudaMemcpyAsync + cudaStreamSynchronize
# (c10/cuda/CUDAFunctions.h, memcpy_and_sync). Not syncs: the *Async copies and
# cudaStreamWaitEvent (the GPU waits, not the host). CUPTI's per-thread-stream variants end in
# _ptsz or _ptds. Limit: a blocking device-to-device cudaMemcpy does not wait, but counts.
SYNC_PATTERN = re.compile(r"^(?:(?:cu|hip)\w*Synchronize"
                          r"|(?:cuda|hip)Memcpy(?:2D|3D|WithStream|DtoH|HtoD)?"
                          r"|cuMemcpy(?:DtoH|HtoD)(?:_v2)?)(?:_pt(?:sz|ds))?$")
# CUDA graph replays: one call enqueues every kernel of a captured graph, which share its
# correlation id (CUPTI; ROCm's roctracer writes hipGraphLaunch's the same way: the shared
# MI300X vLLM trace's 25 replays carry 361 kernels). A subset of LAUNCH_PREFIXES.
GRAPH_LAUNCH_PREFIXES = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")
# Runtime calls that enqueue a copy or a memset (cudaMemcpyAsync, cudaMemsetAsync, cuMemcpyHtoD,
# hipMemcpyWithStream, ...): GPU work as much as a launch. A host region that holds one
# (idle_causes.host_regions) is not host work alone.
COPY_PREFIXES = ("cudaMemcpy", "cudaMemset", "cuMemcpy", "cuMemset", "hipMemcpy", "hipMemset")
HIP_API_PREFIX = "hip"  # runtime calls named hip*: a ROCm (AMD GPU) trace
# Current Kineto also writes each sync as an event of its own (category cuda_sync, on the GPU's
# row, args "cuda_sync_kind"), with the correlation id of the runtime call that made it (one
# "Stream Sync" per cudaStreamSynchronize, "Context Sync" per cudaDeviceSynchronize, in
# a100_alexnet_no_steps.json.gz). Host syncs are these kinds (libkineto's syncTypeString);
# "Stream Wait Event" is cudaStreamWaitEvent, a wait on the GPU.
SYNC_CATEGORIES = {"cuda_sync"}
HOST_SYNC_KINDS = ("Stream Sync", "Event Sync", "Context Sync")
# Kineto names copies "Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pageable)",
# "Memcpy HtoD (Pinned -> Device)" (libkineto's memoryKindString: Pageable, Pinned, Managed,
# Unknown, ...); ROCm writes "Memcpy HtoD (Host -> Device)", older Kineto "Memcpy HtoD": the host
# memory not named.
H2D_MARKER = "HtoD"
D2H_MARKER = "DtoH"
PAGEABLE_MARKER = "Pageable"
PINNED_MARKER = "Pinned"
MEMORY_EVENT = "[memory]"


@dataclass
class TraceColumns:
    """The events the analysis needs, as arrays (one pass over the parsed JSON)."""
    kernels: Spans
    kernel_name_id: np.ndarray  # index into kernel_name_table
    kernel_name_table: list[str]
    kernel_correlation: np.ndarray
    kernel_stream: np.ndarray  # each kernel's stream (its tid; what_changed's kernels_of_steps)
    memcpy: Spans
    memcpy_h2d: np.ndarray  # bool per memcpy
    memcpy_correlation: np.ndarray
    memset: Spans
    memset_correlation: np.ndarray
    runtime: Spans
    runtime_correlation: np.ndarray
    runtime_is_launch: np.ndarray
    runtime_is_sync: np.ndarray
    runtime_name_id: np.ndarray  # index into runtime_name_table
    runtime_name_table: list[str]
    steps: Spans  # ProfilerStep#N on the CPU, sorted
    dataloader: Spans
    dataloader_iterators: frozenset[str]  # the iterator classes its spans name (trace.py)
    cpu_ops: Spans  # CPU Exec candidates (not steps, not DataLoader)
    cpu_extent: tuple[float, float] | None  # first start, last end of CPU-side spans
    all_extent: tuple[float, float]  # of every timed event
    regions: dict[str, Spans]
    # [memory] events (profile_memory=True), in file order: time, Total Allocated (bytes after
    # the event), Device Type; the rest (common/memory.py) below.
    memory_ts: np.ndarray
    memory_bytes: np.ndarray
    memory_device_type: np.ndarray
    device_properties: list[dict]
    batch_ts: np.ndarray  # start (µs) of each forward conv/linear call with shapes
    batch_rows: np.ndarray  # its batch dimension (input_batch_of)
    # start (µs) and s of each softmax over a square [..., s, s] input (square_softmax_side)
    softmax_ts: np.ndarray = field(default_factory=lambda: np.empty(0))
    softmax_side: np.ndarray = field(default_factory=lambda: np.empty(0))
    # What the sync attribution reads (syncs.host_syncs): the thread of each runtime call and
    # operator (thread_ids), the operators' names, each copy's direction and source, the
    # cuda_sync events that made the host wait, and whether the runtime is HIP (ROCm).
    runtime_thread: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    cpu_op_thread: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # cpu_ops'
    cpu_op_names: np.ndarray = field(default_factory=lambda: np.empty(0, object))  # cpu_ops'
    memcpy_d2h: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    memcpy_pageable: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    memcpy_pinned: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    host_syncs: Spans = field(default_factory=Spans.empty)  # cuda_sync, HOST_SYNC_KINDS
    host_sync_correlation: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    hip_runtime: bool = False
    # torch.distributed: the trace's distributedInfo (backend, rank, world_size; None without),
    # the "<backend>:<collective>" spans and the c10d::* operators (COLLECTIVE_SPAN_PREFIXES).
    distributed_info: dict | None = None
    collective_spans: Spans = field(default_factory=Spans.empty)
    collective_ops: Spans = field(default_factory=Spans.empty)
    gpu_optimizer: Spans = field(default_factory=Spans.empty)  # GPU_REGION_CATEGORY's optimizer
    memcpy_bytes: np.ndarray = field(default_factory=lambda: np.empty(0))  # NaN: not written
    # Python frames (PYTHON_FRAME_CATEGORY; empty without with_stack): spans, threads, names,
    # callers (read_python_frames).
    python: Spans = field(default_factory=Spans.empty)
    python_thread: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    python_names: np.ndarray = field(default_factory=lambda: np.empty(0, object))
    python_call_from: np.ndarray = field(default_factory=lambda: np.empty(0, object))
    ddp_forwards: Spans = field(default_factory=Spans.empty)  # DDP_FORWARD spans, sorted
    ddp_forward_thread: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    # Gradient collectives (GRADIENT_COLLECTIVE; the backend's spans, else the c10d::* operators):
    # start (µs) and size in elements (the first "Input Dims", record_shapes; NaN unknown).
    gradient_collective_start: np.ndarray = field(default_factory=lambda: np.empty(0))
    gradient_collective_size: np.ndarray = field(default_factory=lambda: np.empty(0))
    # Impossible events left out of every column above, by kind (common/sanity.py): all zero for
    # a sound trace.
    impossible: dict = field(default_factory=dict)
    has_backward: bool = False  # a CPU span of a backward pass (BACKWARD_MARKER, the region)
    # CUDA graph launches (GRAPH_LAUNCH_PREFIXES) and calls that enqueue GPU work (a launch, a
    # copy or a memset by name: COPY_PREFIXES), per runtime call.
    runtime_is_graph_launch: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    runtime_enqueues: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    # Per operator: a harness region written as an operator (the 2021 vocabulary), which is no
    # PyTorch operator for the host regions' "outside operators" test.
    cpu_op_is_region: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    # Host region candidates (idle_causes.host_regions): record_function ranges on a CPU
    # (ANNOTATION_CATEGORY, and the harness's regions in any category) but steps, DataLoader
    # spans, the optimizer region and collectives; sorted by start, with their names.
    annotations: Spans = field(default_factory=Spans.empty)
    annotation_names: np.ndarray = field(default_factory=lambda: np.empty(0, object))
    # The rest of each [memory] event: Total Reserved (NaN: not written), Bytes (> 0 an
    # allocation, < 0 a free; NaN: not written), Device Id, Addr (memory_address_ids) and the
    # allocating thread (thread_ids).
    memory_reserved: np.ndarray = field(default_factory=lambda: np.empty(0))
    memory_delta: np.ndarray = field(default_factory=lambda: np.empty(0))
    memory_device_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    memory_addr: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    memory_thread: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    # Which GPU ran each kernel, copy and memset: an index into gpu_devices, the pids of the GPUs'
    # events in order of appearance (Kineto writes a GPU's events under pid = its device index).
    kernel_device: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    memcpy_device: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    memset_device: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    gpu_devices: list = field(default_factory=list)


# --- Reading the events. ----------------------------------------------------------------------

def category_kind(category) -> str:
    name = str(category or "").lower()
    for kind, names in (("kernel", KERNEL_CATEGORIES), ("memcpy", MEMCPY_CATEGORIES),
                        ("memset", MEMSET_CATEGORIES), ("runtime", RUNTIME_CATEGORIES),
                        ("sync", SYNC_CATEGORIES), ("skip", SKIPPED_CATEGORIES),
                        ("cpu_op", CPU_OP_CATEGORIES)):
        if name in names:
            return kind
    return "skip" if name.startswith(SKIPPED_CATEGORY_PREFIX) else "cpu_other"


def has_gpu_kernels(events: list[dict]) -> bool:
    """Whether a trace's events hold a GPU kernel, by the analyzer's own category rule."""
    return any(category_kind(event.get("cat")) == "kernel" for event in events)


# Events are trace.event_pieces' objects (attributes: trace.EVENT_FIELDS, args: ARG_FIELDS).
# map(attrgetter) runs the per-event loop in C: about a third faster than a comprehension.
TS, DUR, NAME, PID = attrgetter("ts"), attrgetter("dur"), attrgetter("name"), attrgetter("pid")
CORRELATION = attrgetter("args.correlation")


def times_of(events: list) -> np.ndarray:
    """The events' ts; an event without one (numpy makes None a NaN) is no Kineto event."""
    start = np.fromiter(map(TS, events), np.float64, len(events))
    if np.isnan(start).any():
        raise ValueError("an event without a ts")
    return start


def spans_of(events: list) -> Spans:
    start = times_of(events)
    duration = np.fromiter(map(DUR, events), np.float64, len(events))
    duration[np.isnan(duration)] = 0  # an event without a duration (or null): zero length
    return Spans(start, start + duration)


def names_of(events: list) -> list[str]:
    return list(map(NAME, events))


def correlations(events: list) -> np.ndarray:
    return np.fromiter(map(CORRELATION, events), np.int64, len(events))


# What a CPU span's name says: nothing, a step, a DataLoader fetch, one of our regions, or a
# forward layer whose input shape gives the batch.
(ROLE_OTHER, ROLE_STEP, ROLE_DATALOADER, ROLE_REGION, ROLE_LAYER, ROLE_SOFTMAX,
 ROLE_COLLECTIVE) = range(7)


def is_collective_kernel(name: str) -> bool:
    return bool(COLLECTIVE_KERNEL_PATTERN.search(name.lower()))


def name_role(name: str) -> int:
    if name.startswith(trace.STEP_PREFIX):
        return ROLE_STEP
    if trace.is_dataloader_span(name):
        return ROLE_DATALOADER
    if name in CONVOLUTION_OPS or name in LINEAR_OPS:
        return ROLE_LAYER
    if name in SOFTMAX_OPS:
        return ROLE_SOFTMAX
    if name in REGION_NAMES or name.startswith(OPTIMIZER_STEP_PREFIX):
        return ROLE_REGION
    if (name.startswith(COLLECTIVE_SPAN_PREFIXES) or name.startswith(COLLECTIVE_OP_PREFIX)
            or name == DDP_FORWARD):
        return ROLE_COLLECTIVE
    return ROLE_OTHER


def square_softmax_side(input_dims) -> int | None:
    """s of a softmax over a [..., s, s] input, from its "Input Dims"; None for any other."""
    if not isinstance(input_dims, list) or not input_dims or not isinstance(input_dims[0], list):
        return None
    shape = input_dims[0]
    if len(shape) < 2 or not all(isinstance(size, int) for size in shape[-2:]):
        return None
    return shape[-1] if shape[-1] == shape[-2] else None


def collective_elements(input_dims) -> int | None:
    """Elements a collective moves, from its first "Input Dims" (a tensor's shape, or a list of
    shapes for a TensorList); None without shapes."""
    if not isinstance(input_dims, list) or not input_dims or not input_dims[0] or not isinstance(
            input_dims[0], list):
        return None  # no shapes, or [] (a TensorList c10d::allreduce_ recorded without them)
    shapes = input_dims[0] if isinstance(input_dims[0][0], list) else [input_dims[0]]
    if not all(isinstance(shape, list) and all(isinstance(size, int) for size in shape)
               for shape in shapes):
        return None
    return sum(math.prod(shape) for shape in shapes) or None


def input_batch_of(name: str, input_dims) -> int | None:
    """The batch dimension of one forward layer call from its "Input Dims": a convolution's N
    (an unbatched input, one dimension fewer than its weight, is 1), a linear layer's rows: every
    input dimension but the last (samples x positions, what its GEMM sees). None without shapes."""
    if not isinstance(input_dims, list) or not input_dims:
        return None
    shape = input_dims[0]
    if (not isinstance(shape, list) or not shape
            or not all(isinstance(size, int) for size in shape)):
        return None
    if name in LINEAR_OPS:
        return math.prod(shape[:-1])
    weight = input_dims[1] if len(input_dims) > 1 and isinstance(input_dims[1], list) else []
    return 1 if len(shape) < len(weight) else shape[0]


@dataclass
class Pieces:
    """What read_piece keeps of each piece of the trace: numpy columns (joined by finish), the
    few named CPU spans, and caches of what a category or a name means."""
    arrays: dict[str, list[np.ndarray]] = field(default_factory=dict)
    kernel_name_ids: dict[str, int] = field(default_factory=dict)
    gpu_pids: set = field(default_factory=set)
    gpu_device_ids: dict = field(default_factory=dict)  # a GPU event's pid -> its device's index
    named_spans: list[tuple[str, float, float, object]] = field(default_factory=list)
    layer_batches: list[tuple[float, int]] = field(default_factory=list)  # (start µs, batch)
    # (start µs, end µs, name, pid, thread, elements or None) of each collective span and DDP
    # forward
    collective_calls: list[tuple] = field(default_factory=list)
    square_softmaxes: list[tuple[float, int]] = field(default_factory=list)  # (start µs, s)
    # (start µs, end µs, name, pid) of each host region candidate (read_cpu_group)
    annotations: list[tuple] = field(default_factory=list)
    kind_by_category: dict = field(default_factory=dict)
    role_by_name: dict[str, int] = field(default_factory=dict)
    runtime_by_name: dict[str, int] = field(default_factory=dict)  # LAUNCH_BIT | SYNC_BIT
    has_backward: bool = False
    thread_ids: dict = field(default_factory=dict)  # a tid that is no number -> its index
    cpu_extent: list[float] = field(default_factory=lambda: [np.inf, -np.inf])
    all_extent: list[float] = field(default_factory=lambda: [np.inf, -np.inf])

    def add(self, key: str, values) -> None:
        self.arrays.setdefault(key, []).append(np.asarray(values))

    def column(self, key: str, dtype=np.float64) -> np.ndarray:
        parts = self.arrays.get(key)
        if not parts:
            return np.empty(0, dtype)
        # One part (sanity.drop_impossible joins them) is used as it is: no second copy.
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)).astype(dtype, copy=False)


def widen(extent: list[float], spans: Spans) -> None:
    if spans.size:
        extent[0] = min(extent[0], float(spans.start.min()))
        extent[1] = max(extent[1], float(spans.end.max()))


# What a runtime call's name says (Pieces.runtime_by_name): a launch, a sync, a graph launch, a
# copy or memset.
LAUNCH_BIT, SYNC_BIT, GRAPH_BIT, COPY_BIT = 1, 2, 4, 8
NAME_SHIFT = 4  # runtime_by_name's value: the name's number above these bits


def read_piece(pieces: Pieces, events: list) -> None:
    """Group a piece's events by category in one loop, then read each group's columns."""
    by_category: defaultdict = defaultdict(list)
    memory: list = []
    for event in events:  # the one loop over every event: kept to the bare minimum
        phase = event.ph
        if phase == "X":
            by_category[event.cat].append(event)
        elif phase == "i" and event.name == MEMORY_EVENT:
            memory.append(event)
    for category, group in by_category.items():
        kind = pieces.kind_by_category.get(category)
        if kind is None:
            kind = pieces.kind_by_category[category] = category_kind(category)
        if kind == "skip":
            if str(category).lower() == GPU_REGION_CATEGORY:
                read_gpu_optimizer(pieces, group)
            continue
        spans = spans_of(group)
        widen(pieces.all_extent, spans)
        if kind == "sync":  # widens the extent only: kept for sanity's pass
            pieces.add("other_start", spans.start)
            pieces.add("other_end", spans.end)
        if kind in ("kernel", "memcpy", "memset", "runtime"):
            pieces.add(f"{kind}_start", spans.start)
            pieces.add(f"{kind}_end", spans.end)
            pieces.add(f"{kind}_correlation", correlations(group))
        if kind in ("kernel", "memcpy", "memset"):
            pids = list(map(PID, group))
            pieces.gpu_pids.update(pids)
            devices = pieces.gpu_device_ids
            pieces.add(f"{kind}_device", np.fromiter(
                (devices.setdefault(pid, len(devices)) for pid in pids), np.int64, len(pids)))
        if kind == "kernel":
            ids = pieces.kernel_name_ids
            names = names_of(group)
            for name in dict.fromkeys(names):  # new names numbered in order of appearance
                ids.setdefault(name, len(ids))
            pieces.add("kernel_name_id", np.fromiter(map(ids.__getitem__, names), np.int64,
                                                     len(names)))
            pieces.add("kernel_stream", thread_ids(pieces, group))  # a GPU event's tid: its stream
        elif kind == "memcpy":
            names = names_of(group)
            pieces.add("memcpy_bytes", [number_or_nan(event.args.copy_bytes) for event in group])
            pieces.add("memcpy_h2d", [H2D_MARKER in name for name in names])
            pieces.add("memcpy_d2h", [D2H_MARKER in name for name in names])  # sync attribution
            pieces.add("memcpy_pageable", [PAGEABLE_MARKER in name for name in names])
            pieces.add("memcpy_pinned", [PINNED_MARKER in name for name in names])
        elif kind == "runtime":
            meaning = pieces.runtime_by_name
            names = names_of(group)
            for name in set(names) - meaning.keys():
                # The bits, and the name's number in runtime_name_table above them.
                meaning[name] = (LAUNCH_BIT * name.startswith(LAUNCH_PREFIXES)
                                 | SYNC_BIT * bool(SYNC_PATTERN.match(name))
                                 | GRAPH_BIT * name.startswith(GRAPH_LAUNCH_PREFIXES)
                                 | COPY_BIT * name.startswith(COPY_PREFIXES)
                                 | len(meaning) << NAME_SHIFT)
            flags = np.fromiter(map(meaning.__getitem__, names), np.int64, len(names))
            pieces.add("runtime_name_id", flags >> NAME_SHIFT)
            pieces.add("runtime_is_launch", (flags & LAUNCH_BIT).astype(bool))
            pieces.add("runtime_is_sync", (flags & SYNC_BIT).astype(bool))
            pieces.add("runtime_is_graph_launch", (flags & GRAPH_BIT).astype(bool))
            pieces.add("runtime_enqueues", (flags & (LAUNCH_BIT | COPY_BIT)).astype(bool))
            pieces.add("runtime_thread", thread_ids(pieces, group))  # sync attribution
        elif kind == "sync":
            read_host_syncs(pieces, group, spans)
        elif kind in ("cpu_op", "cpu_other"):
            read_cpu_group(pieces, kind, group, spans,
                           annotation=str(category).lower() == ANNOTATION_CATEGORY)
            if str(category).lower() == PYTHON_FRAME_CATEGORY:
                read_python_frames(pieces, group, spans)
    kept = [event for event in memory if event.args.total_allocated is not None]
    if kept:
        pieces.add("memory_ts", times_of(kept))
        pieces.add("memory_bytes", [event.args.total_allocated for event in kept])
        pieces.add("memory_device_type", [event.args.device_type for event in kept])
        pieces.add("memory_reserved", floats(TOTAL_RESERVED, kept))
        pieces.add("memory_delta", floats(MEMORY_DELTA, kept))
        pieces.add("memory_device_id", [event.args.device_id for event in kept])
        pieces.add("memory_addr", memory_address_ids(pieces, kept))
        pieces.add("memory_thread", thread_ids(pieces, kept))


def read_cpu_group(pieces: Pieces, kind: str, group: list, spans: Spans, *,
                   annotation: bool = False) -> None:
    """Steps, DataLoader spans and regions are kept by name (any CPU-side category); spans of an
    operator category (CPU_OP_CATEGORIES) other than steps and DataLoader are CPU Exec: a region
    only where it is written as an operator (the 2021 vocabulary), as the plugin reads it.
    `annotation`: the group is record_function ranges (ANNOTATION_CATEGORY), whose names other
    than steps, DataLoader spans and collectives are host region candidates, as are the
    harness's regions in any category; the optimizer's are not."""
    roles_by_name = pieces.role_by_name
    names = names_of(group)
    for name in set(names) - roles_by_name.keys():  # each name once per trace
        roles_by_name[name] = name_role(name)
        pieces.has_backward |= BACKWARD_MARKER in name or name == "backward"
    roles = np.fromiter(map(roles_by_name.__getitem__, names), np.int8, len(names))
    named = ((roles == ROLE_STEP) | (roles == ROLE_DATALOADER) | (roles == ROLE_REGION)
             | (roles == ROLE_COLLECTIVE))
    for index in np.flatnonzero(named):  # a few per step
        pieces.named_spans.append((names[index], float(spans.start[index]),
                                   float(spans.end[index]), group[index].pid))
    if kind == "cpu_other":  # widen the extent only: kept for sanity's pass (named: above)
        pieces.add("other_start", spans.start[~named])
        pieces.add("other_end", spans.end[~named])
    # Steps and DataLoader spans, by name, before an impossible duration takes their role: such
    # a span stays out of the operators below (where it would be counted a second time).
    step_or_loader = (roles == ROLE_STEP) | (roles == ROLE_DATALOADER)
    # The records below (shapes, collective calls) keep a start only, which the impossible-event
    # pass checks; an operator whose duration is impossible makes none.
    roles = np.where(sanity.possible_duration(spans), roles, ROLE_OTHER)
    candidate = roles == ROLE_REGION
    if annotation:  # an impossible duration made its role ROLE_OTHER: kept out here
        candidate |= (roles == ROLE_OTHER) & sanity.possible_duration(spans)
    # Not the optimizer region either: like the DataLoader's spans it has a metric and a verdict
    # of its own (metrics.optimizer_metrics, unfused_optimizer), whose fix is another.
    candidates = [index for index in np.flatnonzero(candidate).tolist()  # a few per step
                  if names[index] != OPTIMIZER_REGION
                  and not names[index].startswith(OPTIMIZER_STEP_PREFIX)]
    for index in candidates:
        pieces.annotations.append((float(spans.start[index]), float(spans.end[index]),
                                   names[index], group[index].pid))
    for index in np.flatnonzero(roles == ROLE_LAYER):  # one per conv or linear layer per step
        batch = input_batch_of(names[index], trace.decoded(group[index].args.input_dims))
        if batch is not None:
            pieces.layer_batches.append((float(spans.start[index]), batch))
    collective = np.flatnonzero(roles == ROLE_COLLECTIVE)  # a few per step
    if collective.size:
        threads = thread_ids(pieces, [group[index] for index in collective])
        for index, thread in zip(collective.tolist(), threads.tolist()):
            pieces.collective_calls.append(
                (float(spans.start[index]), float(spans.end[index]), names[index],
                 group[index].pid, thread,
                 collective_elements(trace.decoded(group[index].args.input_dims))))
    for index in np.flatnonzero(roles == ROLE_SOFTMAX):  # a few per attention layer per step
        side = square_softmax_side(trace.decoded(group[index].args.input_dims))
        if side is not None:
            pieces.square_softmaxes.append((float(spans.start[index]), side))
    if kind == "cpu_op":  # the plugin's CPU extent: operators (and steps)
        widen(pieces.cpu_extent, spans)
        work = ~step_or_loader
        pieces.add("cpu_named_start", spans.start[~work])  # for the extent, after sanity
        pieces.add("cpu_named_end", spans.end[~work])
        pieces.add("cpu_op_start", spans.start[work])
        pieces.add("cpu_op_end", spans.end[work])
        pieces.add("cpu_op_thread", thread_ids(pieces, group)[work])  # sync attribution
        pieces.add("cpu_op_is_region", (roles == ROLE_REGION)[work])  # host regions
        # Interned: one string per distinct name is kept, not each event's own copy (holding
        # those across pieces fragments the allocator: 0.2-0.3 s slower on the 135 MB benchmark).
        pieces.add("cpu_op_name", np.array(list(map(sys.intern, names)), dtype=object)[work])


def read_python_frames(pieces: Pieces, group: list, spans: Spans) -> None:
    """Python frames: their spans, threads, names ("file(line): function", or a built-in's
    "<built-in method ...>") and callers ("file:line"), names interned (a few thousand distinct
    ones against 100 000s of events)."""
    pieces.add("python_start", spans.start)
    pieces.add("python_end", spans.end)
    pieces.add("python_thread", thread_ids(pieces, group))
    pieces.add("python_name", np.array(list(map(sys.intern, names_of(group))), dtype=object))
    pieces.add("python_call_from", np.array([sys.intern(str(event.args.call_from or ""))
                                             for event in group], dtype=object))


def number_or_nan(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


# --- What memory.py reads of the [memory] events (and thread_ids, below). ---------------------
TOTAL_RESERVED, MEMORY_DELTA = attrgetter("args.total_reserved"), attrgetter("args.bytes")
ADDR = attrgetter("args.addr")


def floats(field: attrgetter, events: list) -> np.ndarray:
    """A field of each event as float64, None (not written) as NaN: fromiter where none is None,
    40 % faster than an array of a list."""
    try:
        return np.fromiter(map(field, events), np.float64, len(events))
    except TypeError:
        return np.array(list(map(field, events)), np.float64)


def memory_address_ids(pieces: Pieces, events: list) -> np.ndarray:
    """Each [memory] event's Addr as an int64 (an allocation and its free share it). Another
    value gets a negative number (no real address is negative: user space lies below 2**47):
    one per value, so that a block still pairs with its free; one per event where Addr is
    absent, which pairs with nothing."""
    try:
        return np.fromiter(map(ADDR, events), np.int64, len(events))
    except (TypeError, ValueError, OverflowError):
        ids = pieces.thread_ids  # the odd tids' numbering, which these continue
        numbers = []
        for addr in map(ADDR, events):
            if isinstance(addr, int) and -2**63 <= addr < 2**63:
                numbers.append(addr)
            else:
                key = ("addr", len(ids)) if addr is None else ("addr", str(addr))
                numbers.append(ids.setdefault(key, -1 - len(ids)))
        return np.array(numbers, np.int64)


# --- What the sync attribution reads (syncs.host_syncs). -------------------------------------
TID = attrgetter("tid")


def thread_ids(pieces: Pieces, group: list) -> np.ndarray:
    """The thread of each event: its tid, which Linux keeps unique across processes (a tid that
    is no number, a negative index of its own)."""
    try:
        return np.fromiter(map(TID, group), np.int64, len(group))
    except (TypeError, ValueError, OverflowError):
        return np.array([thread_id(pieces.thread_ids, tid) for tid in map(TID, group)], np.int64)


def thread_id(ids: dict, tid) -> int:
    try:
        return int(tid)
    except (TypeError, ValueError, OverflowError):
        return ids.setdefault(tid, -1 - len(ids))


def read_host_syncs(pieces: Pieces, group: list, spans: Spans) -> None:
    """cuda_sync events that made the host wait (HOST_SYNC_KINDS, by name)."""
    keep = np.fromiter((name in HOST_SYNC_KINDS for name in names_of(group)), bool, len(group))
    pieces.add("host_sync_start", spans.start[keep])
    pieces.add("host_sync_end", spans.end[keep])
    pieces.add("host_sync_correlation", correlations(group)[keep])


def read_gpu_optimizer(pieces: Pieces, group: list) -> None:
    """The GPU-timeline copies of the optimizer region: from the first kernel launched inside it
    to the end of the last."""
    spans = spans_of(group)
    keep = np.fromiter((name == OPTIMIZER_REGION or name.startswith(OPTIMIZER_STEP_PREFIX)
                        for name in names_of(group)), bool, len(group))
    pieces.add("gpu_optimizer_start", spans.start[keep])
    pieces.add("gpu_optimizer_end", spans.end[keep])


def extent_of(pieces: Pieces, groups: tuple[str, ...], named: list) -> list[float]:
    """[first start, last end] of these column groups and named spans (tuples with start and end
    second and third; [inf, -inf]: none)."""
    extent = [np.inf, -np.inf]
    for group in groups:
        widen(extent, Spans(pieces.column(f"{group}_start"), pieces.column(f"{group}_end")))
    widen(extent, Spans(np.array([span[1] for span in named], dtype=np.float64),
                        np.array([span[2] for span in named], dtype=np.float64)))
    return extent


def finish(pieces: Pieces, top: dict) -> TraceColumns:
    if not np.isfinite(pieces.all_extent[0]):
        raise ValueError("no timed events (ph 'X'): nothing to analyse")

    def cpu_steps() -> list[tuple[str, float, float]]:
        # A step or region range on a GPU's timeline (whatever its category) is not a CPU span.
        return [(name, start, end) for name, start, end, pid in pieces.named_spans
                if name.startswith(trace.STEP_PREFIX) and pid not in pieces.gpu_pids]

    steps_written = bool(cpu_steps())
    impossible = sanity.drop_impossible(pieces.arrays, pieces.named_spans,
                                        [pieces.layer_batches, pieces.square_softmaxes,
                                         pieces.collective_calls, pieces.annotations])
    if any(impossible.values()):  # the extents were widened by what is now left out
        pieces.all_extent = extent_of(pieces, sanity.EXTENT_GROUPS, pieces.named_spans)
        pieces.cpu_extent = extent_of(pieces, ("cpu_op", "cpu_named"), [])
        if not np.isfinite(pieces.all_extent[0]):
            raise sanity.NothingLeft(f"nothing left to analyse, {sanity.warning_line(impossible)}")
    steps = sanity.possible_steps(cpu_steps(), impossible)
    if steps_written and not steps:  # the whole trace as one step would be another trace
        raise sanity.NothingLeft(f"no ProfilerStep#N left, {sanity.warning_line(impossible)}")
    named = [(name, start, end) for name, start, end, pid in pieces.named_spans
             if pid not in pieces.gpu_pids]
    if pieces.cpu_extent[0] > pieces.cpu_extent[1]:  # no operators: the named spans' extent
        pieces.cpu_extent = extent_of(pieces, (), named)

    def spans_named(keep) -> Spans:
        chosen = sorted((start, end) for name, start, end in named if keep(name))
        return Spans(np.array([s for s, _ in chosen], dtype=np.float64),
                     np.array([e for _, e in chosen], dtype=np.float64))

    regions = {name: spans_named(lambda n, name=name: n == name) for name in REGION_NAMES}
    regions[OPTIMIZER_REGION] = spans_named(lambda n: n == OPTIMIZER_REGION
                                            or n.startswith(OPTIMIZER_STEP_PREFIX))
    dataloader = spans_named(lambda n: name_role(n) == ROLE_DATALOADER)
    regions[DATALOADER_REGION] = dataloader
    collective_spans = spans_named(lambda n: n.startswith(COLLECTIVE_SPAN_PREFIXES))
    collective_ops = spans_named(lambda n: n.startswith(COLLECTIVE_OP_PREFIX))
    # (start, end, name, pid, thread, elements) of each collective call and DDP forward on a CPU
    calls = sorted(call for call in pieces.collective_calls if call[3] not in pieces.gpu_pids)
    forwards = [(start, end, thread) for start, end, name, _, thread, _ in calls
                if name == DDP_FORWARD]
    ddp_forwards = Spans(np.array([start for start, _, _ in forwards], dtype=np.float64),
                         np.array([end for _, end, _ in forwards], dtype=np.float64))
    spans_first = any(call[2].startswith(COLLECTIVE_SPAN_PREFIXES) for call in calls)
    gradient = [(start, np.nan if size is None else size) for start, _, name, _, _, size in calls
                if name.startswith(COLLECTIVE_SPAN_PREFIXES if spans_first
                                   else COLLECTIVE_OP_PREFIX) and GRADIENT_COLLECTIVE.search(name)]
    distributed = top.get("distributedInfo")
    memcpy_h2d = pieces.column("memcpy_h2d", bool)
    # Host region candidates on a CPU, by start: (start, end, name, pid)
    annotations = sorted((span for span in pieces.annotations if span[3] not in pieces.gpu_pids),
                         key=lambda span: (span[0], span[1]))
    properties = top.get("deviceProperties")
    return TraceColumns(
        kernels=Spans(pieces.column("kernel_start"), pieces.column("kernel_end")),
        kernel_name_id=pieces.column("kernel_name_id", np.int64),
        kernel_name_table=list(pieces.kernel_name_ids),
        kernel_correlation=pieces.column("kernel_correlation", np.int64),
        kernel_stream=pieces.column("kernel_stream", np.int64),
        memcpy=Spans(pieces.column("memcpy_start"), pieces.column("memcpy_end")),
        memcpy_h2d=memcpy_h2d, memcpy_correlation=pieces.column("memcpy_correlation", np.int64),
        memset=Spans(pieces.column("memset_start"), pieces.column("memset_end")),
        memset_correlation=pieces.column("memset_correlation", np.int64),
        runtime=Spans(pieces.column("runtime_start"), pieces.column("runtime_end")),
        runtime_correlation=pieces.column("runtime_correlation", np.int64),
        runtime_is_launch=pieces.column("runtime_is_launch", bool),
        runtime_is_sync=pieces.column("runtime_is_sync", bool),
        runtime_name_id=pieces.column("runtime_name_id", np.int64),
        runtime_name_table=list(pieces.runtime_by_name),
        steps=Spans(np.array([start for _, start, _ in steps], dtype=np.float64),
                    np.array([end for _, _, end in steps], dtype=np.float64)),
        dataloader=dataloader,
        dataloader_iterators=frozenset(filter(None, (trace.dataloader_iterator(name)
                                                     for name, _, _ in named))),
        cpu_ops=Spans(pieces.column("cpu_op_start"), pieces.column("cpu_op_end")),
        cpu_extent=(tuple(pieces.cpu_extent) if pieces.cpu_extent[0] <= pieces.cpu_extent[1]
                    else None),
        all_extent=tuple(pieces.all_extent), regions=regions,
        memory_ts=pieces.column("memory_ts"), memory_bytes=pieces.column("memory_bytes"),
        memory_device_type=pieces.column("memory_device_type", np.int64),
        memory_reserved=pieces.column("memory_reserved"),
        memory_delta=pieces.column("memory_delta"),
        memory_device_id=pieces.column("memory_device_id", np.int64),
        memory_addr=pieces.column("memory_addr", np.int64),
        memory_thread=pieces.column("memory_thread", np.int64),
        device_properties=properties if isinstance(properties, list) else [],
        batch_ts=np.array([ts for ts, _ in pieces.layer_batches], dtype=np.float64),
        batch_rows=np.array([rows for _, rows in pieces.layer_batches], dtype=np.float64),
        softmax_ts=np.array([ts for ts, _ in pieces.square_softmaxes], dtype=np.float64),
        softmax_side=np.array([side for _, side in pieces.square_softmaxes], dtype=np.float64),
        runtime_thread=pieces.column("runtime_thread", np.int64),
        cpu_op_thread=pieces.column("cpu_op_thread", np.int64),
        cpu_op_names=pieces.column("cpu_op_name", object),
        memcpy_bytes=pieces.column("memcpy_bytes"),
        python=Spans(pieces.column("python_start"), pieces.column("python_end")),
        python_thread=pieces.column("python_thread", np.int64),
        python_names=pieces.column("python_name", object),
        python_call_from=pieces.column("python_call_from", object),
        memcpy_d2h=pieces.column("memcpy_d2h", bool),
        memcpy_pageable=pieces.column("memcpy_pageable", bool),
        memcpy_pinned=pieces.column("memcpy_pinned", bool),
        host_syncs=Spans(pieces.column("host_sync_start"), pieces.column("host_sync_end")),
        host_sync_correlation=pieces.column("host_sync_correlation", np.int64),
        gpu_optimizer=Spans(pieces.column("gpu_optimizer_start"),
                            pieces.column("gpu_optimizer_end")),
        hip_runtime=any(name.startswith(HIP_API_PREFIX) for name in pieces.runtime_by_name),
        distributed_info=distributed if isinstance(distributed, dict) else None,
        collective_spans=collective_spans, collective_ops=collective_ops,
        ddp_forwards=ddp_forwards, impossible=impossible, has_backward=pieces.has_backward,
        ddp_forward_thread=np.array([thread for _, _, thread in forwards], dtype=np.int64),
        gradient_collective_start=np.array([start for start, _ in gradient], dtype=np.float64),
        gradient_collective_size=np.array([size for _, size in gradient], dtype=np.float64),
        runtime_is_graph_launch=pieces.column("runtime_is_graph_launch", bool),
        runtime_enqueues=pieces.column("runtime_enqueues", bool),
        cpu_op_is_region=pieces.column("cpu_op_is_region", bool),
        annotations=Spans(np.array([span[0] for span in annotations], dtype=np.float64),
                          np.array([span[1] for span in annotations], dtype=np.float64)),
        annotation_names=np.array([span[2] for span in annotations], dtype=object),
        kernel_device=pieces.column("kernel_device", np.int64),
        memcpy_device=pieces.column("memcpy_device", np.int64),
        memset_device=pieces.column("memset_device", np.int64),
        gpu_devices=list(pieces.gpu_device_ids))


def read_pieces(pieces_of_events) -> Pieces:
    pieces = Pieces()
    for events in pieces_of_events:
        read_piece(pieces, events)
        del events  # before the next piece is decoded: one piece's events in memory at a time
    return pieces


def read_trace(path: Path) -> TraceColumns:
    """The trace's columns, its file read once and its events decoded a piece at a time (see
    trace.event_pieces)."""
    # The parser makes many small objects, none of them cyclic: the cyclic garbage collector
    # would walk them over and over as they pile up (it doubles the time on 135 MB with dicts).
    collecting = gc.isenabled()
    gc.disable()
    try:
        try:
            top, pieces_of_events = trace.event_pieces(path)
            pieces = read_pieces(pieces_of_events)
        except trace.ReadAsDicts:  # what msgspec does not take: read again, as dicts
            top, pieces_of_events = trace.plain_pieces(path, trace.read_bytes(path))
            pieces = read_pieces(pieces_of_events)
        return finish(pieces, top)
    except trace.TraceError:
        raise
    except sanity.NothingLeft as error:
        raise trace.TraceError(f"{path}: {error}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        raise trace.TraceError(f"{path}: not a Kineto trace ({error})") from None
    finally:
        if collecting:
            gc.enable()
