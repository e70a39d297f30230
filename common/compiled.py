"""torch.compile in the trace: the compiled regions of the recorded steps, read for recompiles and
graph breaks. Definitions in common/README.md, "Compiled regions".

Each call of a compiled function runs under an operator "Torch-Compiled Region: F/C" (torch >=
2.5; earlier releases write no frame and compile id): Dynamo's frame F (a Python function it
compiled; a function resumed after a graph break is a frame of its own) and compile C of it (0 the
first, 1 the first recompile, ...). Inside it, "TorchDynamo Cache Lookup" and "Pregraph bytecode"
are Dynamo's guard checks and set-up, and the compiled graph runs as "CompiledFunction" (training:
AOTAutograd's autograd function; its backward is "CompiledFunctionBackward") or directly as
"## Call CompiledFxGraph <hash> ##" (inference). An operator inside a region and outside all of
those ran eagerly: the code between two graphs at a graph break, or a frame Dynamo declined to
compile (past its recompile limit). A frame resumed after a break runs as a region nested in its
caller's. Compiling writes ranges (idle_causes.is_compile_work), and ranges of its own name the
compile id they build ("... compile_id=F/C")."""
from __future__ import annotations

import re

import numpy as np

from common.idle_causes import is_compile_work, names_where, step_of
from common.intervals import Spans, concat, merge, minus, union_in
from common.trace_columns import TraceColumns
from common.trace_steps import US_PER_MS, op_threads

REGION_NAME = re.compile(r"^Torch-Compiled Region(?:: !?(?:\d+/)?(\d+)/(\d+))?")
# Calls that run a compiled graph (forward, backward, inference) and Dynamo's work around one, on
# every call: none of this is eager code.
GRAPH_CALL_PREFIXES = ("CompiledFunction", "## Call CompiledFxGraph")
DYNAMO_CALL_PREFIXES = ("TorchDynamo Cache Lookup", "Pregraph bytecode", "AOTDispatcher")
COMPILE_ID_OF_WORK = re.compile(r"compile_id=!?(?:\d+/)?(\d+)/(\d+)")
EAGER_OPERATORS_SHOWN = 3  # eager operators named in the evidence, by time per step


def compiled_metrics(columns: TraceColumns, steps: Spans) -> dict | None:
    """metrics["compiled"] over the recorded steps (trace_steps.host_steps): the compiled regions
    by frame and compile id, the graph breaks (regions holding eager operators of their own), the
    eager operators inside regions, and the compiling inside the steps. None when the steps hold
    no compiled region and no compiling."""
    names = columns.cpu_op_names
    ops = columns.cpu_ops
    if not names.size:
        return None
    low, high = float(steps.start[0]), float(steps.end[-1])
    in_window = (ops.start >= low) & (ops.start < high)
    region, covers, work, graph_call = region_flags(columns)
    region &= in_window
    compiling = merge(Spans(ops.start[work], ops.end[work]))
    compiling_ms = union_in(compiling, low, high) / US_PER_MS
    if not region.any() and compiling_ms == 0:
        return None
    n_steps = steps.size
    thread = op_threads(columns)
    regions = read_regions(columns, region, covers, thread)
    eager_index = [i for r in regions for i in r["eager"]]
    broken = [r for r in regions if r["eager"]]

    frames: dict[str, dict] = {}
    for r in regions:
        key = "?" if r["frame"] is None else str(r["frame"])
        entry = frames.setdefault(key, {"compile_ids": set(), "calls": 0, "broke": 0})
        if r["compile_id"] is not None:
            entry["compile_ids"].add(r["compile_id"])
        entry["calls"] += 1
        entry["broke"] += bool(r["eager"])
    for entry in frames.values():
        entry["compile_ids"] = sorted(entry["compile_ids"])
        entry["calls_per_step"] = entry.pop("calls") / n_steps
        entry["breaks_per_step"] = entry.pop("broke") / n_steps

    eager = np.array(sorted(set(eager_index)), dtype=np.int64)
    by_name: dict[str, list[float]] = {}
    for i in eager.tolist():
        ms_calls = by_name.setdefault(str(names[i]), [0.0, 0.0])
        ms_calls[0] += (ops.end[i] - ops.start[i]) / US_PER_MS / n_steps
        ms_calls[1] += 1 / n_steps
    top = sorted(by_name.items(), key=lambda item: -item[1][0])[:EAGER_OPERATORS_SHOWN]

    outer = outermost_regions(regions)
    region_ms = union_in(Spans(np.array([r["start"] for r in outer]),
                               np.array([r["end"] for r in outer])), low, high) if outer else 0.0
    # The graphs' time less the compiling they hold on their thread (a backward compiles inside
    # its first call).
    graph_parts = []
    for each in np.unique(thread[graph_call & in_window]).tolist():
        graph, held = graph_call & in_window & (thread == each), work & (thread == each)
        graph_parts.append(minus(Spans(ops.start[graph], ops.end[graph]),
                                 Spans(ops.start[held], ops.end[held])))
    graphs = union_in(concat(*graph_parts), low, high) if graph_parts else 0.0
    eager_ms = union_in(Spans(ops.start[eager], ops.end[eager]), low, high) if eager.size else 0.0

    # Compiling inside the steps: the steps it falls in, and the compile ids it built.
    inside = compiling.end > low
    inside &= compiling.start < high
    compile_steps = sorted(set(step_of(steps, compiling.start[inside]).tolist()))
    built = set()
    for start, end, name in zip(columns.annotations.start, columns.annotations.end,
                                columns.annotation_names):
        found = COMPILE_ID_OF_WORK.search(str(name))
        if found and end > low and start < high:
            built.add((int(found.group(1)), int(found.group(2))))
    return {
        "steps_read": int(n_steps),
        "regions_per_step": len(regions) / n_steps,
        "frames": frames,
        "region_ms_per_step": region_ms / US_PER_MS / n_steps,
        "graph_ms_per_step": graphs / US_PER_MS / n_steps,
        "eager_in_regions_ms_per_step": eager_ms / US_PER_MS / n_steps,
        "eager_operators": [{"name": name, "ms_per_step": ms, "calls_per_step": calls}
                            for name, (ms, calls) in top],
        "graph_breaks_per_step": len(broken) / n_steps,
        "broken_frames": sorted({"?" if r["frame"] is None else str(r["frame"]) for r in broken}),
        "nested_regions_per_step": (len(regions) - len(outer)) / n_steps,
        "compiling_ms": compiling_ms,
        "compiling_steps": compile_steps,
        "compiled_in_steps": [f"{frame}/{cid}" for frame, cid in sorted(built)],
    }


def region_flags(columns: TraceColumns) -> tuple[np.ndarray, ...]:
    """Per operator: whether it is a compiled region; whether it is no user code inside one (a
    region, a graph call, a Dynamo call, compiling: `covers`); whether it is compiling; whether
    it is a graph call."""
    names = columns.cpu_op_names
    region = names_where(names, REGION_NAME.match)
    work = names_where(names, is_compile_work)
    graph_call = names_where(names, lambda name: name.startswith(GRAPH_CALL_PREFIXES))
    dynamo_call = names_where(names, lambda name: name.startswith(DYNAMO_CALL_PREFIXES))
    return region, region | work | graph_call | dynamo_call, work, graph_call


def read_regions(columns: TraceColumns, region: np.ndarray, covers: np.ndarray,
                 thread: np.ndarray) -> list[dict]:
    """The compiled regions at the operators `region` marks (region_flags, and a window), by
    start: index, frame and compile_id (None where the name has none), start, end, thread, and
    `eager`: its own eager operators' indices. Those are on its thread, inside it, outside every
    operator `covers` marks (a graph call, a Dynamo call, compiling, a region nested in it), and
    the outermost of such."""
    ops, names = columns.cpu_ops, columns.cpu_op_names
    by_start = np.argsort(ops.start, kind="stable")
    sorted_start = ops.start[by_start]
    regions = []
    for i in np.flatnonzero(region).tolist():
        frame, compile_id = REGION_NAME.match(str(names[i])).groups()
        start, end = float(ops.start[i]), float(ops.end[i])
        near = by_start[np.searchsorted(sorted_start, start, side="left"):
                        np.searchsorted(sorted_start, end, side="right")]
        near = near[(ops.end[near] <= end) & (thread[near] == thread[i]) & (near != i)]
        covered = merge(Spans(ops.start[near[covers[near]]], ops.end[near[covers[near]]]))
        inside = near[~covers[near]]
        mine = outermost(inside[~contained(ops.start[inside], ops.end[inside], covered)], ops)
        regions.append({"index": i, "frame": None if frame is None else int(frame),
                        "compile_id": None if compile_id is None else int(compile_id),
                        "start": start, "end": end, "thread": int(thread[i]),
                        "eager": mine.tolist()})
    return regions


def contained(start: np.ndarray, end: np.ndarray, merged: Spans) -> np.ndarray:
    """Whether each [start, end] lies inside one of the merged (sorted, disjoint) intervals."""
    if not merged.size:
        return np.zeros(start.size, bool)
    k = np.searchsorted(merged.start, start, side="right") - 1
    ok = k >= 0
    k = np.maximum(k, 0)
    return ok & (merged.start[k] <= start) & (end <= merged.end[k])


def outermost(index: np.ndarray, ops: Spans) -> np.ndarray:
    """The operators at these indices that no other of them contains (operators nest)."""
    if not index.size:
        return index
    order = index[np.lexsort((-ops.end[index], ops.start[index]))]
    kept, reach = [], -np.inf
    for i in order.tolist():
        if ops.end[i] > reach or ops.start[i] >= reach:
            kept.append(i)
            reach = max(reach, float(ops.end[i]))
    return np.array(kept, dtype=np.int64)


def outermost_regions(regions: list[dict]) -> list[dict]:
    """The regions no other region on their thread contains (a resumed frame nests in its caller)."""
    kept = []
    for thread in sorted({r["thread"] for r in regions}):
        reach = -np.inf
        for r in sorted((r for r in regions if r["thread"] == thread),
                        key=lambda r: (r["start"], -r["end"])):
            if r["start"] >= reach or r["end"] > reach:
                kept.append(r)
                reach = max(reach, r["end"])
    return kept
