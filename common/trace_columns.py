"""Read a Kineto trace into numpy columns (TraceColumns): one pass over its events, a piece at a
time, each event's meaning taken from its category (either vocabulary) and its name."""
from __future__ import annotations

import gc
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

import numpy as np

from common import trace
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
