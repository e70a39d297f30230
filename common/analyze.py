"""Read a Kineto trace and say what limits the run: the numbers an engineer reads off a trace,
and a plain verdict per bottleneck, each pointing at the demo that fixes it.

    python -m common.analyze PATH [--json]

PATH is a .pt.trace.json(.gz) file or a run directory (its newest trace). Works on any Kineto
trace: both category vocabularies (2021: Kernel, Runtime, Operator, Memcpy, Memset; current:
kernel, cuda_runtime, cuda_driver, cpu_op, user_annotation, gpu_memcpy, gpu_memset; and what our
harness rewrites for the TensorBoard plugin, common/tensorboard_compat.py: DataLoader spans
user_annotation -> cpu_op, cuda_runtime/cuda_driver -> Runtime, fwdbwd -> forward_backward, the
GPU copies of ProfilerStep#N gpu_user_annotation -> gpu_profiler_step; our data/forward/backward/
optimizer regions stay user_annotation), integer or float timestamps. Spans are found by name
(ProfilerStep#N, enumerate(DataLoader)#...__next__, data, forward, ...) in any CPU-side category.
Imports no torch: parsing is orjson, interval work is numpy (sort, merge).

Definitions (sources in README.md, "Analyzing a trace"):
  steps        ProfilerStep#N spans (none: the whole trace is one step), each extended to the end
               of the GPU work launched inside it (runtime call -> kernel by correlation id), the
               TensorBoard plugin's rule. The window runs from the first step's start to the last
               step's end.
  utilization  union of kernels in the window / window (plugin "GPU Utilization").
  idle         1 - union(kernels, memcpy, memset) / (last GPU end - first GPU start), whole
               trace (Holistic Trace Analysis temporal breakdown), on float timestamps.
  dataloader   union of enumerate(DataLoader)#...__next__ spans in the window / window.
  breakdown    each instant of a step goes to the first active of kernel > memcpy > memset >
               runtime > DataLoader > CPU Exec (operator spans only) > other (plugin Overview).
"""
from __future__ import annotations

import gc
import json
import math
import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

import numpy as np

from common import trace

US_PER_MS = 1000.0

# --- What an event is, from its category (lowercased). -----------------------------------------
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
# CPU work for the step breakdown's "CPU Exec": the plugin's CpuOp role, which is operator spans
# only (torch_tb_profiler 0.4.3, trace.py create_trace_event and event_parser.py _parse_step: the
# categories it maps to Operator and Python). It drops every user_annotation but ProfilerStep#N
# (so our data/forward/backward/optimizer regions are not CPU Exec) and keeps python_function
# out of CpuOp: Python time between operators is "other", as in its Overview. Other CPU-side
# categories (user_annotation, python_function, Trace, overhead, ...) are searched for step,
# DataLoader and region names but not counted as work.
CPU_OP_CATEGORIES = {"cpu_op", "operator", "python"}

# The harness's record_function regions, drawn on the report's CPU timeline.
REGION_NAMES = ("data", "forward", "backward", "optimizer")
DATALOADER_REGION = "DataLoader"

# The forward layers whose input's first dimension is the batch, read from "Input Dims" (written
# with record_shapes=True, as our harness records): what the small-batch and launch-overhead
# verdicts tell apart by. F.conv*d and F.linear (nn.Conv*d, nn.Linear) enter these ops and only in
# forward; backward's mm and convolution_backward carry transposed shapes that do not say which
# dimension is the batch. A compiled model (torch.compile) calls neither: no evidence then.
CONVOLUTION_OPS = ("aten::conv1d", "aten::conv2d", "aten::conv3d")
LINEAR_OPS = ("aten::linear",)

# Kernel launches: runtime and driver API calls that put a kernel (or a whole CUDA graph) in a
# stream. Prefix match, so cudaLaunchKernelExC and cuLaunchKernelEx count.
LAUNCH_PREFIXES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel",
                   "cudaGraphLaunch", "cuGraphLaunch")
SYNC_PATTERN = re.compile(r"^cuda\w*Synchronize$")  # cudaDeviceSynchronize, cudaStreamSync...
H2D_MARKER = "HtoD"  # Kineto names copies "Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH ..."
MEMORY_EVENT = "[memory]"
CUDA_DEVICE_TYPE = 1  # "Device Type" of a [memory] event (c10::DeviceType): 0 CPU, 1 CUDA

# --- Tensor cores, from kernel names (lowercased substrings). ---------------------------------
# Names are all a trace gives; there is no counter for tensor-core instructions in it. Markers:
# 884 (Volta HMMA), 1688 (Turing), 16816 (Ampere and later, also i8816), hmma/imma, CUTLASS's
# "tensorop", Hopper's warpgroup MMA (gmma, wgmma), and tensor16x8 (cuBLAS/cuDNN tile names). The
# TensorBoard plugin's list (from NVIDIA PyProf) has the first few and "xmma", which we do not
# take alone: xmma kernels also run plain FP32 FFMA math.
TENSOR_CORE_MARKERS = ("884", "1688", "16816", "hmma", "imma", "tensorop", "gmma", "tensor16x8")
# cuBLAS's nvjet kernels (Hopper on) name their types after "nvjet_" (after "nvjet_sm90_" in some
# builds), one BLAS letter each, before the first "_": nvjet_tst_... (bf16 in and out, FP32
# accumulate), nvjet_hsh_... (fp16), nvjet_qqtst_... (fp8 in), nvjet_sss_... (FP32). Names seen
# in public profiles; cuBLAS does not document the scheme. All-"s" types are FP32 math on the CUDA
# cores, unless the name also says tf32 (nvjet_sss_tf32_..., FP32 with TF32 tensor cores).
# A name with "nvjet" but no readable types counts: every nvjet kernel seen so far but FP32 ones
# runs on tensor cores.
NVJET_MARKER = "nvjet"
NVJET_PATTERN = re.compile(r"nvjet_(?:sm\d+_)?(?P<types>[a-z]+)(?:_|$)")
NVJET_FP32_TYPES = re.compile(r"s+")  # fullmatch on the types: FP32 in, compute and out
TF32_MARKER = "tf32"
# A GEMM (or implicit-GEMM convolution) whose name states a tensor-core input type also runs on
# tensor cores (cuBLAS "sm80_xmma_gemm_bf16bf16_...", cuDNN "..._implicit_gemm_tf32f32_..."). Only
# these compact tags: C++ type names (__nv_bfloat16, __half) also appear in cuBLAS's small gemv and
# gemmSN kernels, which run on the CUDA cores.
TENSOR_CORE_TYPES = ("tf32", "bf16", "f16", "fp16", "e4m3", "e5m2", "fp8", "int8")
# ...unless the name says it uses the CUDA cores: FFMA (fused multiply-add) or SIMT tiles.
CUDA_CORE_MARKERS = ("ffma", "simt")
# Attention kernels: FlashAttention 2 (flash_fwd_kernel, flash_bwd_dq_dk_dv_..., PyTorch's
# pytorch_flash::), FlashAttention 3 (flash::FlashAttnFwdSm90) and CUTLASS memory-efficient
# attention (fmha_cutlassF_bf16_...). Their MMAs run on tensor cores for 16-bit (and 8-bit) inputs,
# which they name as C++ types (cutlass::bfloat16_t, cutlass::half_t) or tags (bf16, f16). Their
# FP32 variants (fmha_cutlassF_f32_...) are not counted. Not matched: "flash" alone (flashinfer's
# RMSNorm is no attention), and FlashAttention's two small non-MMA backward kernels.
ATTENTION_PATTERN = re.compile(r"flash_?attn|flash_(?:fwd|bwd)|fmha")
ATTENTION_NON_MMA_MARKERS = ("dot_do_o", "convert_dq")  # flash_bwd_dot_do_o_kernel, ..._convert_dq_
ATTENTION_TENSOR_CORE_TYPES = ("bfloat16", "half", "bf16", "f16", "fp16", "e4m3", "e5m2", "fp8")
# GEMM-like kernels: cuBLAS/CUTLASS GEMMs (sgemm, hgemm, s16816gemm, xmma_gemm), cuDNN
# implicit-GEMM convolutions, Hopper gmma and nvjet kernels. Limits: direct convolutions, FFTs,
# attention and hand-written kernels are not recognised; a future naming scheme needs a new marker.
GEMM_MARKERS = ("gemm", "gmma", "nvjet")

# --- Verdict thresholds. ----------------------------------------------------------------------
SHORT_KERNEL_US = 10.0  # "short" kernel, µs: the issue's and peers' launch-overhead cut
DATALOADER_SHARE_MIN_PCT = 20.0  # % of the window; gpu-idle and fournex use 20 %
SMALL_BATCH_UTILIZATION_MAX_PCT = 50.0  # % GPU utilization; peers' small-batch rule
SMALL_BATCH_MEDIAN_KERNEL_MAX_US = 25.0  # µs median kernel; peers' small-batch rule
# Short kernels on an idle GPU come from a batch too small to fill them (small_batch) or from a
# model of many small ops (launch_overhead); the timing is the same, the input shapes differ. Below
# this batch (input_batch, from record_shapes) it is the batch: a Hopper tensor-core MMA takes 64
# rows at a time (PTX ISA, wgmma.mma_async .m64nNk16), so with fewer even one tile of each GEMM
# runs part empty. The small_batch demo's GPU batch is 8, the launch_overhead demo's 64.
SMALL_BATCH_INPUT_BATCH_BELOW = 64  # samples (or rows) per forward conv/linear call
# Launch overhead: most kernels are short (our reading of peers' "kernels < 10 µs": a majority)
# and the CPU spends at least as long in launch calls as the GPU spends running kernels (peers).
LAUNCH_SHORT_KERNEL_MIN_PCT = 50.0  # % of kernels shorter than SHORT_KERNEL_US
LAUNCH_TO_KERNEL_TIME_MIN = 1.0  # launch-call time / kernel time, per step
HOST_SYNC_PER_STEP_MIN = 1.0  # synchronize calls per step; peers' rule
# Peers ask for "idle gaps after" the syncs without a number; 5 % of the window is our cut: it
# stays silent on one .item() per step in a GPU-bound loop (a gap of tens of µs in a 30 ms step).
HOST_SYNC_IDLE_MIN_PCT = 5.0
# FP32 math: peers fire when tensor cores run 0 % while GEMMs are >= 20 % of kernel time. We fire
# when GEMMs *not* on tensor cores are >= 20 % of kernel time: the same when no kernel uses them,
# and still right when a few (say TF32 convolutions) do while the matmuls run in FP32.
FP32_GEMM_MIN_PCT = 20.0  # % of kernel time
ACTIVATION_MEMORY_MIN_PCT = 85.0  # peak allocated, % of the GPU's memory; peers' rule
ACTIVATION_MEMORY_HIGH_PCT = 95.0  # % of the GPU: the next larger step is likely out of memory
H2D_MIN_PCT = 10.0  # % of the window in host-to-device copies; peers' rule
# Severity: "high" when a value is twice its threshold (half, for an upper limit). Our choice,
# only to order the findings.
SEVERITY_HIGH_FACTOR = 2.0

BREAKDOWN_ROLES = ("kernel", "memcpy", "memset", "runtime", "dataloader", "cpu_exec", "other")
# The TensorBoard plugin's Overview breakdown assigns each instant of a step to the first of these
# roles active then (Kernel > Memcpy > Memset > Runtime > DataLoader > CPU Exec > Other).


@dataclass
class Spans:
    """Start and end times (µs, float) of a set of events."""
    start: np.ndarray
    end: np.ndarray

    @staticmethod
    def empty() -> "Spans":
        return Spans(np.empty(0), np.empty(0))

    @property
    def size(self) -> int:
        return int(self.start.size)


@dataclass
class TraceColumns:
    """The events the analysis needs, as arrays (one pass over the parsed JSON)."""
    kernels: Spans
    kernel_name_id: np.ndarray  # index into kernel_name_table
    kernel_name_table: list[str]
    kernel_correlation: np.ndarray
    memcpy: Spans
    memcpy_h2d: np.ndarray  # bool per memcpy
    memcpy_correlation: np.ndarray
    memset: Spans
    memset_correlation: np.ndarray
    runtime: Spans
    runtime_correlation: np.ndarray
    runtime_is_launch: np.ndarray
    runtime_is_sync: np.ndarray
    steps: Spans  # ProfilerStep#N on the CPU, sorted
    dataloader: Spans
    cpu_ops: Spans  # CPU Exec candidates (not steps, not DataLoader)
    cpu_extent: tuple[float, float] | None  # first start, last end of CPU-side spans
    all_extent: tuple[float, float]  # of every timed event
    regions: dict[str, Spans]
    memory_ts: np.ndarray
    memory_bytes: np.ndarray
    memory_device_type: np.ndarray
    device_properties: list[dict]
    batch_ts: np.ndarray  # start (µs) of each forward conv/linear call with shapes
    batch_rows: np.ndarray  # its batch dimension (input_batch_of)


@dataclass
class Analysis:
    """The JSON result, and the per-step detail the report draws."""
    result: dict
    steps: Spans  # extended steps, µs
    window: tuple[float, float]  # µs
    breakdown_ms: np.ndarray  # [step, role] in BREAKDOWN_ROLES order
    regions: dict[str, Spans] = field(default_factory=dict)
    kernel_busy: Spans = field(default_factory=Spans.empty)  # merged kernel intervals
    memory_ts: np.ndarray = field(default_factory=lambda: np.empty(0))  # µs, device's events
    memory_mb: np.ndarray = field(default_factory=lambda: np.empty(0))


# --- Interval arithmetic. ---------------------------------------------------------------------

def merge(spans: Spans) -> Spans:
    """Union of possibly overlapping intervals as sorted, disjoint intervals (sort + sweep)."""
    if spans.size == 0:
        return Spans.empty()
    order = np.argsort(spans.start, kind="stable")
    start = spans.start[order]
    reach = np.maximum.accumulate(spans.end[order])  # furthest end so far
    first = np.flatnonzero(np.r_[True, start[1:] > reach[:-1]])  # an interval after a gap
    last = np.r_[first[1:] - 1, start.size - 1]
    return Spans(start[first], reach[last])


def clip(spans: Spans, low: float, high: float) -> Spans:
    start = np.maximum(spans.start, low)
    end = np.minimum(spans.end, high)
    keep = end > start
    return Spans(start[keep], end[keep])


def total(spans: Spans) -> float:
    return float((spans.end - spans.start).sum())


def union_in(spans: Spans, low: float, high: float) -> float:
    """Length of the union of `spans` inside [low, high]."""
    return total(clip(merge(spans), low, high))


def covering(merged: Spans, points: np.ndarray) -> np.ndarray:
    """Index of the merged interval that holds each point, -1 where none does."""
    index = np.searchsorted(merged.start, points, side="right") - 1
    inside = index >= 0
    inside[inside] = points[inside] < merged.end[index[inside]]
    return np.where(inside, index, -1)


def concat(*parts: Spans) -> Spans:
    return Spans(np.concatenate([p.start for p in parts]), np.concatenate([p.end for p in parts]))


# --- Reading the events. ----------------------------------------------------------------------

def category_kind(category) -> str:
    name = str(category or "").lower()
    for kind, names in (("kernel", KERNEL_CATEGORIES), ("memcpy", MEMCPY_CATEGORIES),
                        ("memset", MEMSET_CATEGORIES), ("runtime", RUNTIME_CATEGORIES),
                        ("skip", SKIPPED_CATEGORIES), ("cpu_op", CPU_OP_CATEGORIES)):
        if name in names:
            return kind
    return "skip" if name.startswith(SKIPPED_CATEGORY_PREFIX) else "cpu_other"


# map(itemgetter) runs the per-event loop in C: about a third faster than a comprehension.
TS, DUR, NAME = itemgetter("ts"), itemgetter("dur"), itemgetter("name")


def spans_of(events: list[dict]) -> Spans:
    start = np.fromiter(map(TS, events), np.float64, len(events))
    try:
        duration = np.fromiter(map(DUR, events), np.float64, len(events))
    except (KeyError, TypeError):  # an event without a duration (or null): zero length
        duration = np.array([e.get("dur") or 0 for e in events], dtype=np.float64)
    return Spans(start, start + duration)


def names_of(events: list[dict]) -> list[str]:
    try:
        return list(map(NAME, events))
    except KeyError:
        return [e.get("name", "") for e in events]


def correlations(events: list[dict]) -> np.ndarray:
    return np.array([(e.get("args") or {}).get("correlation", -1) for e in events], dtype=np.int64)


# What a CPU span's name says: nothing, a step, a DataLoader fetch, one of our regions, or a
# forward layer whose input shape gives the batch.
ROLE_OTHER, ROLE_STEP, ROLE_DATALOADER, ROLE_REGION, ROLE_LAYER = 0, 1, 2, 3, 4


def name_role(name: str) -> int:
    if name.startswith(trace.STEP_PREFIX):
        return ROLE_STEP
    if trace.is_dataloader_span(name):
        return ROLE_DATALOADER
    if name in CONVOLUTION_OPS or name in LINEAR_OPS:
        return ROLE_LAYER
    return ROLE_REGION if name in REGION_NAMES else ROLE_OTHER


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
    named_spans: list[tuple[str, float, float, object]] = field(default_factory=list)
    layer_batches: list[tuple[float, int]] = field(default_factory=list)  # (start µs, batch)
    kind_by_category: dict = field(default_factory=dict)
    role_by_name: dict[str, int] = field(default_factory=dict)
    runtime_by_name: dict[str, tuple[bool, bool]] = field(default_factory=dict)
    cpu_extent: list[float] = field(default_factory=lambda: [np.inf, -np.inf])
    all_extent: list[float] = field(default_factory=lambda: [np.inf, -np.inf])

    def add(self, key: str, values) -> None:
        self.arrays.setdefault(key, []).append(np.asarray(values))

    def column(self, key: str, dtype=np.float64) -> np.ndarray:
        parts = self.arrays.get(key)
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)


def widen(extent: list[float], spans: Spans) -> None:
    if spans.size:
        extent[0] = min(extent[0], float(spans.start.min()))
        extent[1] = max(extent[1], float(spans.end.max()))


def read_piece(pieces: Pieces, events: list[dict]) -> None:
    """Group a piece's events by category in one loop, then read each group's columns."""
    by_category: defaultdict = defaultdict(list)
    memory: list[dict] = []
    for event in events:  # the one loop over every event: kept to the bare minimum
        phase = event.get("ph")
        if phase == "X":
            by_category[event.get("cat")].append(event)
        elif phase == "i" and event.get("name") == MEMORY_EVENT:
            memory.append(event)
    for category, group in by_category.items():
        kind = pieces.kind_by_category.get(category)
        if kind is None:
            kind = pieces.kind_by_category[category] = category_kind(category)
        if kind == "skip":
            continue
        spans = spans_of(group)
        widen(pieces.all_extent, spans)
        if kind in ("kernel", "memcpy", "memset", "runtime"):
            pieces.add(f"{kind}_start", spans.start)
            pieces.add(f"{kind}_end", spans.end)
            pieces.add(f"{kind}_correlation", correlations(group))
        if kind in ("kernel", "memcpy", "memset"):
            pieces.gpu_pids.update({e.get("pid") for e in group})
        if kind == "kernel":
            ids = pieces.kernel_name_ids
            pieces.add("kernel_name_id", [ids.setdefault(name, len(ids))
                                          for name in names_of(group)])
        elif kind == "memcpy":
            pieces.add("memcpy_h2d", [H2D_MARKER in name for name in names_of(group)])
        elif kind == "runtime":
            meaning = pieces.runtime_by_name
            names = names_of(group)
            for name in set(names) - meaning.keys():
                meaning[name] = (name.startswith(LAUNCH_PREFIXES), bool(SYNC_PATTERN.match(name)))
            flags = [meaning[name] for name in names]
            pieces.add("runtime_is_launch", [launch for launch, _ in flags])
            pieces.add("runtime_is_sync", [sync for _, sync in flags])
        elif kind in ("cpu_op", "cpu_other"):
            read_cpu_group(pieces, kind, group, spans)
    if memory:
        args = [e.get("args") or {} for e in memory]
        kept = [i for i, a in enumerate(args) if "Total Allocated" in a]
        pieces.add("memory_ts", [memory[i]["ts"] for i in kept])
        pieces.add("memory_bytes", [args[i]["Total Allocated"] for i in kept])
        pieces.add("memory_device_type", [args[i].get("Device Type", -1) for i in kept])


def read_cpu_group(pieces: Pieces, kind: str, group: list[dict], spans: Spans) -> None:
    """Steps, DataLoader spans and regions are kept by name (any CPU-side category); spans of an
    operator category (CPU_OP_CATEGORIES) other than steps and DataLoader are CPU Exec: a region
    only where it is written as an operator (the 2021 vocabulary), as the plugin reads it."""
    roles_by_name = pieces.role_by_name
    names = names_of(group)
    for name in set(names) - roles_by_name.keys():
        roles_by_name[name] = name_role(name)
    roles = np.array([roles_by_name[n] for n in names], dtype=np.int8)
    for index in np.flatnonzero((roles != ROLE_OTHER) & (roles != ROLE_LAYER)):  # a few per step
        pieces.named_spans.append((names[index], float(spans.start[index]),
                                   float(spans.end[index]), group[index].get("pid")))
    for index in np.flatnonzero(roles == ROLE_LAYER):  # one per conv or linear layer per step
        batch = input_batch_of(names[index], (group[index].get("args") or {}).get("Input Dims"))
        if batch is not None:
            pieces.layer_batches.append((float(spans.start[index]), batch))
    if kind == "cpu_op":  # the plugin's CPU extent: operators (and steps)
        widen(pieces.cpu_extent, spans)
        work = (roles == ROLE_OTHER) | (roles == ROLE_REGION) | (roles == ROLE_LAYER)
        pieces.add("cpu_op_start", spans.start[work])
        pieces.add("cpu_op_end", spans.end[work])


def finish(pieces: Pieces, top: dict) -> TraceColumns:
    if not np.isfinite(pieces.all_extent[0]):
        raise ValueError("no timed events (ph 'X'): nothing to analyse")
    # A step or region range on a GPU's timeline (whatever its category) is not a CPU span.
    named = [(name, start, end) for name, start, end, pid in pieces.named_spans
             if pid not in pieces.gpu_pids]
    if pieces.cpu_extent[0] > pieces.cpu_extent[1]:  # no operators: the named spans' extent
        for _, start, end in named:
            pieces.cpu_extent[:] = [min(pieces.cpu_extent[0], start),
                                    max(pieces.cpu_extent[1], end)]

    def spans_named(keep) -> Spans:
        chosen = sorted((start, end) for name, start, end in named if keep(name))
        return Spans(np.array([s for s, _ in chosen], dtype=np.float64),
                     np.array([e for _, e in chosen], dtype=np.float64))

    regions = {name: spans_named(lambda n, name=name: n == name) for name in REGION_NAMES}
    dataloader = spans_named(lambda n: name_role(n) == ROLE_DATALOADER)
    regions[DATALOADER_REGION] = dataloader
    memcpy_h2d = pieces.column("memcpy_h2d", bool)
    properties = top.get("deviceProperties")
    return TraceColumns(
        kernels=Spans(pieces.column("kernel_start"), pieces.column("kernel_end")),
        kernel_name_id=pieces.column("kernel_name_id", np.int64),
        kernel_name_table=list(pieces.kernel_name_ids),
        kernel_correlation=pieces.column("kernel_correlation", np.int64),
        memcpy=Spans(pieces.column("memcpy_start"), pieces.column("memcpy_end")),
        memcpy_h2d=memcpy_h2d, memcpy_correlation=pieces.column("memcpy_correlation", np.int64),
        memset=Spans(pieces.column("memset_start"), pieces.column("memset_end")),
        memset_correlation=pieces.column("memset_correlation", np.int64),
        runtime=Spans(pieces.column("runtime_start"), pieces.column("runtime_end")),
        runtime_correlation=pieces.column("runtime_correlation", np.int64),
        runtime_is_launch=pieces.column("runtime_is_launch", bool),
        runtime_is_sync=pieces.column("runtime_is_sync", bool),
        steps=spans_named(lambda n: name_role(n) == ROLE_STEP), dataloader=dataloader,
        cpu_ops=Spans(pieces.column("cpu_op_start"), pieces.column("cpu_op_end")),
        cpu_extent=(tuple(pieces.cpu_extent) if pieces.cpu_extent[0] <= pieces.cpu_extent[1]
                    else None),
        all_extent=tuple(pieces.all_extent), regions=regions,
        memory_ts=pieces.column("memory_ts"), memory_bytes=pieces.column("memory_bytes"),
        memory_device_type=pieces.column("memory_device_type", np.int64),
        device_properties=properties if isinstance(properties, list) else [],
        batch_ts=np.array([ts for ts, _ in pieces.layer_batches], dtype=np.float64),
        batch_rows=np.array([rows for _, rows in pieces.layer_batches], dtype=np.float64))


def read_trace(path: Path) -> TraceColumns:
    """The trace's columns, read a piece at a time (see trace.event_pieces)."""
    # The parser makes millions of small dicts and lists, none of them cyclic: the cyclic garbage
    # collector would walk them over and over as they pile up (it doubles the time on 135 MB).
    collecting = gc.isenabled()
    gc.disable()
    try:
        try:
            top, pieces_of_events = trace.event_pieces(path)
            pieces = Pieces()
            for events in pieces_of_events:
                read_piece(pieces, events)
        except trace.SplitFailed:  # a piece did not parse alone: read the whole file at once
            top = trace.load_trace(path)
            pieces = Pieces()
            read_piece(pieces, top.pop("traceEvents"))
        return finish(pieces, top)
    except trace.TraceError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        raise trace.TraceError(f"{path}: not a Kineto trace ({error})") from None
    finally:
        if collecting:
            gc.enable()


# --- Steps and their extension to the GPU work they launched. ----------------------------------

def host_steps(columns: TraceColumns) -> Spans:
    """ProfilerStep#N spans; with none, the whole trace (its CPU side) is one step."""
    if columns.steps.size:
        return columns.steps
    low, high = columns.cpu_extent or columns.all_extent
    return Spans(np.array([low]), np.array([high]))


def runtime_step_index(columns: TraceColumns, steps: Spans) -> np.ndarray:
    """For each runtime call, the host step that wholly contains it (-1: none)."""
    runtime = columns.runtime
    index = np.searchsorted(steps.start, runtime.start, side="right") - 1
    inside = index >= 0
    inside[inside] = runtime.end[inside] <= steps.end[index[inside]]
    return np.where(inside, index, -1)


def extend_steps(columns: TraceColumns, steps: Spans, runtime_step: np.ndarray) -> Spans:
    """The TensorBoard plugin's rule (torch_tb_profiler StepParser._update_steps_duration): a step
    ends when the GPU work launched by the runtime calls inside it ends (linked by correlation
    id), and starts no earlier than the previous step's end. Unlike the plugin, trailing steps
    whose GPU work looks incompletely captured are kept."""
    gpu = concat(columns.kernels, columns.memcpy, columns.memset)
    gpu_correlation = np.concatenate([columns.kernel_correlation, columns.memcpy_correlation,
                                      columns.memset_correlation])
    linked = runtime_step >= 0
    if not gpu.size or not linked.any():
        return steps
    launch_correlation = columns.runtime_correlation[linked]
    launch_step = runtime_step[linked]
    order = np.argsort(launch_correlation, kind="stable")
    launch_correlation, launch_step = launch_correlation[order], launch_step[order]
    position = np.clip(np.searchsorted(launch_correlation, gpu_correlation), 0,
                       launch_correlation.size - 1)
    matched = (launch_correlation[position] == gpu_correlation) & (gpu_correlation >= 0)
    if not matched.any():
        return steps
    gpu_step = launch_step[position[matched]]
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
    BREAKDOWN_ROLES priority), the rest to "other"."""
    low, high = float(steps.start.min()), float(steps.end.max())
    merged = [merge(clip(s, low, high)) for s in role_spans]
    points = np.unique(np.concatenate([steps.start, steps.end]
                                      + [m.start for m in merged] + [m.end for m in merged]))
    middle = (points[:-1] + points[1:]) / 2
    length = np.diff(points)
    other = len(role_spans)
    role = np.full(middle.size, other)
    for index, spans in enumerate(merged):
        role[(role == other) & (covering(spans, middle) >= 0)] = index
    step = covering(steps, middle)  # extended steps are disjoint and sorted
    keep = step >= 0
    columns = other + 1
    flat = np.bincount(step[keep] * columns + role[keep], weights=length[keep],
                       minlength=steps.size * columns)
    return flat.reshape(steps.size, columns) / US_PER_MS


# --- GPU metrics. -------------------------------------------------------------------------------

def is_gemm(name: str) -> bool:
    return any(marker in name for marker in GEMM_MARKERS)


def uses_tensor_cores(name: str) -> bool:
    """From the kernel's name alone; see TENSOR_CORE_MARKERS and what follows it for the lists
    and their limits."""
    lowered = name.lower()
    if any(marker in lowered for marker in CUDA_CORE_MARKERS):
        return False
    if any(marker in lowered for marker in TENSOR_CORE_MARKERS):
        return True
    if NVJET_MARKER in lowered:  # the type letters decide, not the type tags below
        nvjet = NVJET_PATTERN.search(lowered)
        fp32 = bool(nvjet) and bool(NVJET_FP32_TYPES.fullmatch(nvjet["types"]))
        return not fp32 or TF32_MARKER in lowered
    if ATTENTION_PATTERN.search(lowered):
        return (not any(marker in lowered for marker in ATTENTION_NON_MMA_MARKERS)
                and any(kind in lowered for kind in ATTENTION_TENSOR_CORE_TYPES))
    return is_gemm(lowered) and any(kind in lowered for kind in TENSOR_CORE_TYPES)


def sync_idle_us(sync_ends: np.ndarray, busy: Spans, low: float, high: float) -> float:
    """GPU idle time in the gaps that a synchronize call returns in: the GPU drained its queue
    for the host, and waits until the host launches again. Each gap counts once."""
    ends = sync_ends[(sync_ends >= low) & (sync_ends <= high)]
    if not ends.size:
        return 0.0
    # Gap k runs from the end of busy interval k-1 (or `low`) to the start of busy interval k (or
    # `high`); k = how many busy intervals start at or before the sync's end.
    gap_start = np.r_[low, busy.end]
    gap_end = np.r_[busy.start, high]
    k = np.searchsorted(busy.start, ends, side="right")
    gpu_busy = (k > 0) & (ends < gap_start[k])
    gaps = np.unique(k[~gpu_busy])
    lengths = np.minimum(gap_end[gaps], high) - np.maximum(gap_start[gaps], low)
    return float(lengths.clip(min=0).sum())


def gpu_metrics(columns: TraceColumns, window: tuple[float, float], n_steps: int,
                runtime_step: np.ndarray) -> dict:
    low, high = window
    span = high - low
    kernels = columns.kernels
    in_window = (kernels.start >= low) & (kernels.start < high)
    duration = (kernels.end - kernels.start)[in_window]
    name_id = columns.kernel_name_id[in_window]
    kernel_time = float(duration.sum())
    table = columns.kernel_name_table  # decided once per distinct kernel name
    tensor_core = np.array([uses_tensor_cores(n) for n in table], dtype=bool)[name_id]
    gemm = np.array([is_gemm(n.lower()) for n in table], dtype=bool)[name_id]
    gemm_time = float(duration[gemm].sum())

    in_steps = runtime_step >= 0
    launch_time = float((columns.runtime.end - columns.runtime.start)[
        in_steps & columns.runtime_is_launch].sum())
    busy = merge(concat(columns.kernels, columns.memcpy, columns.memset))
    first_gpu, last_gpu = float(busy.start[0]), float(busy.end[-1])
    gpu_span = last_gpu - first_gpu
    h2d = Spans(columns.memcpy.start[columns.memcpy_h2d], columns.memcpy.end[columns.memcpy_h2d])
    sync_ends = columns.runtime.end[in_steps & columns.runtime_is_sync]

    def share(part: float, whole: float) -> float:
        return 100.0 * part / whole if whole > 0 else 0.0

    return {
        "utilization_pct": share(union_in(kernels, low, high), span),
        "idle_pct": 100.0 - share(total(busy), gpu_span) if gpu_span > 0 else 0.0,
        "kernels_per_step": duration.size / n_steps,
        "median_kernel_us": float(np.median(duration)) if duration.size else None,
        "short_kernel_pct": share(float((duration < SHORT_KERNEL_US).sum()), duration.size),
        "launches_per_step": float((in_steps & columns.runtime_is_launch).sum()) / n_steps,
        "syncs_per_step": float(sync_ends.size) / n_steps,
        "h2d_pct": share(union_in(h2d, low, high), span),
        "tensor_core_pct": share(float(duration[tensor_core].sum()), kernel_time),
        # The GPU target reads "tensor-core share >= 80 % of GEMM time": of the GEMM
        # kernels' time, the share on tensor cores (null without GEMMs).
        "tensor_core_gemm_pct": (share(float(duration[gemm & tensor_core].sum()), gemm_time)
                                 if gemm_time > 0 else None),
        # Beyond the list: what the launch, sync and FP32 verdicts read.
        "kernel_ms_per_step": kernel_time / US_PER_MS / n_steps,
        "launch_ms_per_step": launch_time / US_PER_MS / n_steps,
        "sync_idle_pct": share(sync_idle_us(sync_ends, busy, low, high), span),
        "gemm_pct": share(gemm_time, kernel_time),
        "non_tensor_core_gemm_pct": share(float(duration[gemm & ~tensor_core].sum()), kernel_time),
    }


# --- Verdicts: one small pure function per bottleneck. -----------------------------------------

def severity(value: float, threshold: float, upper_limit: bool = False) -> str:
    """"high" at SEVERITY_HIGH_FACTOR times the threshold (or a fraction of an upper limit)."""
    if upper_limit:
        return "high" if value <= threshold / SEVERITY_HIGH_FACTOR else "medium"
    return "high" if value >= threshold * SEVERITY_HIGH_FACTOR else "medium"


def finding(rule_id: str, level: str, evidence: str, fix: str, demo: str | None) -> dict:
    return {"id": rule_id, "severity": level, "evidence": evidence, "fix": fix, "demo": demo}


def rule_dataloader(m: dict) -> dict | None:
    pct = m["dataloader_pct"]
    if pct < DATALOADER_SHARE_MIN_PCT:
        return None
    return finding(
        "dataloader", severity(pct, DATALOADER_SHARE_MIN_PCT),
        f"data-loading bound: {pct:.0f} % of each step waits on the DataLoader "
        f"(enumerate(DataLoader)#...__next__; rule: >= {DATALOADER_SHARE_MIN_PCT:.0f} %)",
        "prepare batches in worker processes (DataLoader num_workers > 0, persistent_workers, "
        "prefetch_factor); on a GPU also pin_memory=True and .to(device, non_blocking=True)",
        "dataloader_workers")


def launch_to_kernel_ratio(gpu: dict) -> float | None:
    """Launch-call time over kernel time per step when the run is launch bound (most kernels
    short and the launches take at least as long as the kernels), else None."""
    if not gpu or gpu["kernel_ms_per_step"] <= 0:
        return None
    ratio = gpu["launch_ms_per_step"] / gpu["kernel_ms_per_step"]
    if gpu["short_kernel_pct"] < LAUNCH_SHORT_KERNEL_MIN_PCT or ratio < LAUNCH_TO_KERNEL_TIME_MIN:
        return None
    return ratio


def gpu_underfilled(gpu: dict) -> bool:
    """Low utilization with short kernels: the GPU has too little to do (peers' small-batch
    rule)."""
    return bool(gpu) and gpu["median_kernel_us"] is not None and (
        gpu["utilization_pct"] < SMALL_BATCH_UTILIZATION_MAX_PCT
        and gpu["median_kernel_us"] <= SMALL_BATCH_MEDIAN_KERNEL_MAX_US)


def batch_is_small(m: dict) -> bool:
    return m["input_batch"] is not None and m["input_batch"] < SMALL_BATCH_INPUT_BATCH_BELOW


def rule_launch_overhead(m: dict) -> dict | None:
    """Launch bound, unless the input shapes show a small batch (then rule_small_batch names it,
    and points here as the fix for a batch that cannot grow)."""
    gpu = m["gpu"]
    ratio = launch_to_kernel_ratio(gpu)
    if ratio is None or rule_small_batch(m):
        return None
    evidence = (
        f"launch bound: {gpu['short_kernel_pct']:.0f} % of kernels run < {SHORT_KERNEL_US:.0f} us "
        f"and the CPU spends {gpu['launch_ms_per_step']:.2f} ms/step in "
        f"{gpu['launches_per_step']:.0f} launch calls for {gpu['kernel_ms_per_step']:.2f} ms of "
        f"kernels ({ratio:.1f}x; rule: >= {LAUNCH_SHORT_KERNEL_MIN_PCT:.0f} % short and "
        f">= {LAUNCH_TO_KERNEL_TIME_MIN:.0f}x)")
    fix = ("launch fewer, larger kernels: torch.compile (fusion) and CUDA graphs "
           "(mode=\"reduce-overhead\")")
    if m["input_batch"] is not None:
        evidence += (f"; batch {m['input_batch']:.0f} at the conv/linear inputs"
                     + ("" if batch_is_small(m) else
                        f", not small (>= {SMALL_BATCH_INPUT_BATCH_BELOW}): many small ops"))
    elif gpu_underfilled(gpu):  # the timing fits a small batch as well: say both fixes
        fix += ("; or, if the batch is small, a larger one (see demos/small_batch/): the trace "
                "has no input shapes (record_shapes=True) to tell the two apart")
    return finding("launch_overhead", severity(ratio, LAUNCH_TO_KERNEL_TIME_MIN), evidence, fix,
                   "launch_overhead")


def rule_host_sync(m: dict) -> dict | None:
    gpu = m["gpu"]
    if (not gpu or gpu["syncs_per_step"] < HOST_SYNC_PER_STEP_MIN
            or gpu["sync_idle_pct"] < HOST_SYNC_IDLE_MIN_PCT):
        return None
    return finding(
        "host_sync", severity(gpu["sync_idle_pct"], HOST_SYNC_IDLE_MIN_PCT),
        f"host syncs: {gpu['syncs_per_step']:.1f} cuda*Synchronize calls per step, and the GPU "
        f"idles {gpu['sync_idle_pct']:.0f} % of the window in the gaps they end in (rule: >= "
        f"{HOST_SYNC_PER_STEP_MIN:.0f}/step and >= {HOST_SYNC_IDLE_MIN_PCT:.0f} %)",
        "keep values on the GPU: no .item(), .cpu(), print(tensor) or `if tensor:` in the step; "
        "accumulate metrics on the device and read them every N steps", "item_sync")


def rule_small_batch(m: dict) -> dict | None:
    """Low utilization with short kernels, when nothing else named explains the idle GPU. A
    launch-bound run is a small batch's only when its input shapes show a small batch (a small
    batch is launch bound too); otherwise rule_launch_overhead names it."""
    gpu = m["gpu"]
    if not gpu_underfilled(gpu) or rule_dataloader(m) or rule_host_sync(m):
        return None
    launch_ratio = launch_to_kernel_ratio(gpu)
    if launch_ratio is not None and not batch_is_small(m):
        return None
    evidence = (
        f"GPU under-filled: utilization {gpu['utilization_pct']:.0f} % with a median kernel of "
        f"{gpu['median_kernel_us']:.1f} us (rule: < {SMALL_BATCH_UTILIZATION_MAX_PCT:.0f} % and "
        f"<= {SMALL_BATCH_MEDIAN_KERNEL_MAX_US:.0f} us)")
    fix = ("give each kernel more work: a larger batch (scale the learning rate with it), or "
           "gradient accumulation if memory is the limit")
    if batch_is_small(m):
        evidence += (f"; batch {m['input_batch']:.0f} at the conv/linear inputs "
                     f"(< {SMALL_BATCH_INPUT_BATCH_BELOW})")
    elif m["input_batch"] is not None:  # the timing says under-filled, the shapes disagree
        evidence += (f"; but batch {m['input_batch']:.0f} at the conv/linear inputs is not small "
                     f"(>= {SMALL_BATCH_INPUT_BATCH_BELOW}): the short kernels may come from "
                     f"other ops, where a larger batch helps less")
    if launch_ratio is not None:
        evidence += (f"; launch bound too, as a small batch is: {gpu['launch_ms_per_step']:.2f} "
                     f"ms/step of launch calls for {gpu['kernel_ms_per_step']:.2f} ms of kernels "
                     f"({launch_ratio:.1f}x)")
        fix += ("; if the batch cannot grow, launch fewer kernels: torch.compile and CUDA graphs "
                "(see demos/launch_overhead/)")
    return finding(
        "small_batch",
        severity(gpu["utilization_pct"], SMALL_BATCH_UTILIZATION_MAX_PCT, upper_limit=True),
        evidence, fix, "small_batch")


def rule_fp32_matmul(m: dict) -> dict | None:
    gpu = m["gpu"]
    if not gpu or gpu["non_tensor_core_gemm_pct"] < FP32_GEMM_MIN_PCT:
        return None
    return finding(
        "fp32_matmul", severity(gpu["non_tensor_core_gemm_pct"], FP32_GEMM_MIN_PCT),
        f"FP32 math: GEMMs take {gpu['gemm_pct']:.0f} % of kernel time, "
        f"{gpu['non_tensor_core_gemm_pct']:.0f} % of it without tensor cores (tensor-core share "
        f"{gpu['tensor_core_pct']:.0f} %; rule: >= {FP32_GEMM_MIN_PCT:.0f} % off tensor cores)",
        "run matmuls on tensor cores: torch.autocast(\"cuda\", dtype=torch.bfloat16), or at "
        "least TF32 (torch.backends.cuda.matmul.allow_tf32 = True)", "mixed_precision")


def rule_activation_memory(m: dict) -> dict | None:
    if not m["gpu"] or m["peak_memory_mb"] is None or not m.get("device_memory_mb"):
        return None
    pct = 100.0 * m["peak_memory_mb"] / m["device_memory_mb"]
    if pct < ACTIVATION_MEMORY_MIN_PCT:
        return None
    return finding(
        "activation_memory", "high" if pct >= ACTIVATION_MEMORY_HIGH_PCT else "medium",
        f"memory bound: peak allocated {m['peak_memory_mb']:.0f} MB is {pct:.0f} % of the GPU's "
        f"{m['device_memory_mb']:.0f} MB (rule: >= {ACTIVATION_MEMORY_MIN_PCT:.0f} %)",
        "recompute activations in the backward pass instead of keeping them: "
        "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) per block",
        "activation_checkpointing")


def rule_h2d_copy(m: dict) -> dict | None:
    gpu = m["gpu"]
    if not gpu or gpu["h2d_pct"] < H2D_MIN_PCT:
        return None
    return finding(
        "h2d_copy", severity(gpu["h2d_pct"], H2D_MIN_PCT),
        f"copy bound: host-to-device copies take {gpu['h2d_pct']:.0f} % of the window "
        f"(rule: >= {H2D_MIN_PCT:.0f} %)",
        "copy from pinned memory asynchronously (DataLoader pin_memory=True, "
        ".to(device, non_blocking=True)), copy less (uint8 images, normalise on the GPU), or "
        "keep the data on the GPU", "dataloader_workers")


RULES = (rule_dataloader, rule_small_batch, rule_fp32_matmul, rule_activation_memory,
         rule_launch_overhead, rule_host_sync, rule_h2d_copy)


def findings_for(metrics: dict) -> list[dict]:
    found = [f for f in (rule(metrics) for rule in RULES) if f]
    return sorted(found, key=lambda f: f["severity"] != "high")  # stable: rule order within a level


# --- The whole analysis. -------------------------------------------------------------------------

def analyze(path: Path) -> Analysis:
    """Analyse the trace at `path` (a file, or a run directory: its newest trace).
    Raises trace.TraceError for unreadable input."""
    trace_path = trace.newest_trace(path)
    columns = read_trace(trace_path)

    host = host_steps(columns)
    runtime_step = runtime_step_index(columns, host)
    steps = extend_steps(columns, host, runtime_step)
    window = (float(steps.start[0]), float(steps.end[-1]))
    span = window[1] - window[0]
    n_steps = steps.size
    step_ms = (steps.end - steps.start) / US_PER_MS
    has_gpu = bool(columns.kernels.size or columns.memcpy.size or columns.memset.size)

    device_type = CUDA_DEVICE_TYPE if has_gpu else trace.CPU_DEVICE_TYPE
    memory_mask = columns.memory_device_type == device_type
    memory_ts = columns.memory_ts[memory_mask]
    memory_mb = columns.memory_bytes[memory_mask] / trace.BYTES_PER_MB
    order = np.argsort(memory_ts, kind="stable")
    memory_ts, memory_mb = memory_ts[order], memory_mb[order]
    gpu_props = columns.device_properties[0] if has_gpu and columns.device_properties else {}
    total_memory = gpu_props.get("totalGlobalMem") if isinstance(gpu_props, dict) else None
    layer_batches = columns.batch_rows[(columns.batch_ts >= window[0])
                                       & (columns.batch_ts < window[1])]

    metrics = {
        "trace": str(trace_path),
        "device": "cuda" if has_gpu else "cpu",
        "gpu_name": gpu_props.get("name") if isinstance(gpu_props, dict) else None,
        "steps": int(n_steps),
        "step_ms": {"mean": float(step_ms.mean()), "p50": float(np.percentile(step_ms, 50)),
                    "p95": float(np.percentile(step_ms, 95))},
        "dataloader_pct": (100.0 * union_in(columns.dataloader, *window) / span
                           if span > 0 else 0.0),
        "gpu": gpu_metrics(columns, window, n_steps, runtime_step) if has_gpu else None,
        "peak_memory_mb": float(memory_mb.max()) if memory_mb.size else None,
        # Beyond the list: the GPU's memory (for the activation-memory verdict), the
        # window and the plugin-style breakdown of an average step.
        "device_memory_mb": float(total_memory) / trace.BYTES_PER_MB if total_memory else None,
        "window_ms": span / US_PER_MS,
        # The median batch dimension of the forward conv/linear calls in the window (record_shapes;
        # null without shapes): tells a small batch from many small ops (input_batch_of).
        "input_batch": float(np.median(layer_batches)) if layer_batches.size else None,
        "steps_named": bool(columns.steps.size),
    }
    roles = [columns.kernels, columns.memcpy, columns.memset, columns.runtime, columns.dataloader,
             columns.cpu_ops]
    breakdown = step_breakdown_ms(steps, roles)
    metrics["step_breakdown_ms"] = dict(zip(BREAKDOWN_ROLES, map(float, breakdown.mean(axis=0))))
    metrics["findings"] = findings_for(metrics)
    return Analysis(result=metrics, steps=steps, window=window, breakdown_ms=breakdown,
                    regions=columns.regions, kernel_busy=merge(columns.kernels),
                    memory_ts=memory_ts, memory_mb=memory_mb)


def analyze_trace(path: Path) -> dict:
    """The --json object for the trace at `path` (a file or a run directory)."""
    return analyze(path).result


def memory_over_time(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ms since the first step's start, MB allocated) of the trace's [memory] events for its
    device (the GPU if the trace has GPU work, else the CPU)."""
    analysis = analyze(path)
    return (analysis.memory_ts - analysis.window[0]) / US_PER_MS, analysis.memory_mb


# --- The command line. ---------------------------------------------------------------------------

def fmt(value, spec: str = ".1f", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def format_human(result: dict) -> str:
    step = result["step_ms"]
    lines = [f"trace        {result['trace']}",
             f"device       {result['device']}"
             + (f" ({result['gpu_name']})" if result["gpu_name"] else "")
             + ("" if result["gpu"] else " - no GPU activity in the trace"),
             f"steps        {result['steps']}"
             + ("" if result["steps_named"] else " (no ProfilerStep#N: the whole trace)")
             + f", step time mean {step['mean']:.1f} ms, p50 {step['p50']:.1f} ms, "
               f"p95 {step['p95']:.1f} ms",
             f"DataLoader   {result['dataloader_pct']:.1f} % of the steps",
             f"peak memory  {fmt(result['peak_memory_mb'], '.0f', ' MB')}"
             + (f" of {result['device_memory_mb']:.0f} MB" if result["device_memory_mb"] else "")]
    if result["input_batch"] is not None:
        lines.append(f"batch        {result['input_batch']:.0f} (median batch dimension of the "
                     f"forward conv/linear inputs, from record_shapes)")
    gpu = result["gpu"]
    if gpu:
        lines += [f"GPU          utilization {gpu['utilization_pct']:.1f} %, idle "
                  f"{gpu['idle_pct']:.1f} %, H2D copies {gpu['h2d_pct']:.1f} %",
                  f"kernels      {gpu['kernels_per_step']:.0f}/step, median "
                  f"{fmt(gpu['median_kernel_us'], '.1f', ' us')}, {gpu['short_kernel_pct']:.0f} % "
                  f"< {SHORT_KERNEL_US:.0f} us, tensor cores {gpu['tensor_core_pct']:.0f} % of "
                  f"kernel time and {fmt(gpu['tensor_core_gemm_pct'], '.0f', ' %')} of GEMM time "
                  f"(GEMMs {gpu['gemm_pct']:.0f} % of kernel time)",
                  f"host         {gpu['launches_per_step']:.0f} launches/step "
                  f"({gpu['launch_ms_per_step']:.2f} ms vs {gpu['kernel_ms_per_step']:.2f} ms of "
                  f"kernels), {gpu['syncs_per_step']:.1f} syncs/step"]
    parts = ", ".join(f"{role} {ms:.1f}" for role, ms in result["step_breakdown_ms"].items()
                      if ms >= 0.05)
    lines.append(f"breakdown    ms per step: {parts}")
    if not result["findings"]:
        lines.append("verdicts     none: no bottleneck rule fired"
                     + ("" if gpu else " (GPU rules need GPU activity)"))
    for found in result["findings"]:
        lines.append(f"[{found['severity']}] {found['id']}: {found['evidence']}")
        lines.append(f"    fix: {found['fix']}"
                     + (f" - see demos/{found['demo']}/" if found["demo"] else ""))
    return "\n".join(lines)



def print_output(text: str) -> int:
    """Print text and flush; the exit code: 0, or 1 when the reader closed the pipe early
    (`| head -1`). The recipe of Python's docs (signal module, "Note on SIGPIPE"): flush inside
    the try, then point stdout at devnull so the flush at exit raises no second BrokenPipeError
    ("Exception ignored ... BrokenPipeError" on stderr); 1 is the code Python exits with on
    EPIPE. Shared by the three command lines (analyze, compare, report)."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = trace.OneLineArgumentParser(
        prog="python -m common.analyze",
        description="Metrics and bottleneck verdicts for one Kineto (torch.profiler) trace.",
        epilog="Definitions and thresholds: README.md, section 'Analyzing a trace'. "
               "Exit code 2 for input that is not a readable trace.")
    parser.add_argument("path", metavar="PATH", type=Path,
                        help="a .pt.trace.json(.gz) file, or a run directory (its newest trace)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    flags = parser.parse_args(argv)
    try:
        result = analyze_trace(flags.path)
    except trace.TraceError as error:
        print(f"analyze: {error}", file=sys.stderr)
        return 2
    return print_output(json.dumps(result, indent=2) if flags.json else format_human(result))


if __name__ == "__main__":
    sys.exit(main())
