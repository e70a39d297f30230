"""torch.compile in the trace (common/compiled.py) and the recompiles and graph_breaks verdicts:
hand-built traces of each shape pin the reading to a known answer (a graph break with a resumed
frame nested in its caller, a frame past its recompile limit running eagerly, compile ids that
change, compiling inside the steps, train() and eval() graphs of one frame, inference graphs, a
region of an older torch without ids); and silence on every real trace the project holds that
compiles cleanly or not at all. The recompiles pair's own runs are in test_recompiles_pair.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from common import analyze, compiled, verdicts
from tests.conftest import ROOT
from tests.kineto_builder import KinetoTrace

STEP_US = 1000.0
START_US = 1_000_000.0
SHARED_TRACES = ROOT.parent / "shared" / "traces"
BACKGROUND_TID = 77  # another thread of the process (a DataLoader worker thread, say)


def compiled_call(built: KinetoTrace, ts: float, frame: int | None, compile_id: int | None, *,
                  eager: tuple[str, ...] = (), resume: tuple[int, int] | None = None,
                  inference: bool = False) -> float:
    """One call of a compiled frame as torch 2.14 records it, from `ts`: Dynamo's cache lookup,
    then its region holding the guard set-up, AOTAutograd's prologue and the graph
    (CompiledFunction around the Inductor call; inference: the Inductor call alone). `eager`:
    operators that run inside the region after the graph (a graph break's code); `resume`: the
    (frame, compile id) of the frame resumed after them, a region nested in this one. Returns
    the end of the call."""
    name = ("Torch-Compiled Region" if frame is None
            else f"Torch-Compiled Region: {frame}/{compile_id}")
    built.op("TorchDynamo Cache Lookup", ts, 5)
    start = ts + 6
    at = start + 1
    built.op("Pregraph bytecode", at, 2)
    built.op("AOTDispatcher Runtime Wrapper Prologue", at + 3, 4)
    built.op("aten::detach", at + 4, 1)  # the prologue's own operator: not eager code
    at += 10
    if not inference:
        built.op("CompiledFunction", at, 40)
    built.op("## Call CompiledFxGraph fabc ##", at + 1, 38)
    built.op("aten::mm", at + 2, 20)  # an extern kernel the graph calls
    at += 45
    for op in eager:
        built.op(op, at, 10)
        built.op("aten::_local_scalar_dense", at + 1, 5)  # inside it: not counted apart
        at += 12
    if resume is not None:
        at = compiled_call(built, at, *resume) + 1
    built.op(name, start, at - start)
    return at + 1


def write(built: KinetoTrace, tmp_path: Path, name: str = "t.json") -> dict:
    return analyze.analyze_trace(built.write(tmp_path / name))


def fired(result: dict) -> set[str]:
    return {found["id"] for found in result["findings"]}


def steps_of(calls_per_step: list[list[dict]], *, compile_in_step: int | None = None,
             compile_id: str = "0/1", backward: bool = True) -> KinetoTrace:
    """A trace of steps, each holding the compiled calls listed for it (keyword arguments of
    compiled_call, at its start), then a backward through CompiledFunctionBackward. With
    `compile_in_step` (0-based), that step first compiles for 200 ms, building `compile_id`."""
    built = KinetoTrace(vocabulary="current")
    ts = START_US
    for k, calls in enumerate(calls_per_step):
        start = ts
        built.region("forward", ts + 1, 1)
        ts += 10
        if compile_in_step == k:
            built.op("entire_frame_compile", ts, 200_000)
            built.op("_compile.compile_inner (dynamo_timed)", ts + 1, 199_990)
            built.op("aten::empty", ts + 5, 1)  # fake tensors while tracing: not eager code
            built.region(f"entire_frame_compile_data: compile_id={compile_id}", ts + 2, 1)
            ts += 200_010
        for call in calls:
            ts = compiled_call(built, ts, **call)
        if backward:
            built.region("backward", ts, 60)
            built.op("CompiledFunctionBackward", ts + 2, 50)
            ts += 70
        built.op("aten::add_", ts, 5)  # the optimizer, eager, outside every region
        built.op("aten::mm", ts + 10, 5, tid=BACKGROUND_TID)
        ts += STEP_US
        built.step(k + 1, start, ts - start)
        ts += 10
    return built


def test_a_graph_break_reads_as_a_region_with_eager_code_and_a_nested_resumed_frame(tmp_path):
    calls = [[dict(frame=0, compile_id=0, eager=("aten::item",), resume=(1, 0))]] * 4
    result = write(steps_of(calls), tmp_path)
    found = result["compiled"]
    assert found["steps_read"] == 4
    assert found["regions_per_step"] == 2.0  # the caller's and the resumed frame's
    assert found["nested_regions_per_step"] == 1.0
    assert found["graph_breaks_per_step"] == 1.0
    assert found["broken_frames"] == ["0"]
    assert found["frames"] == {
        "0": {"compile_ids": [0], "calls_per_step": 1.0, "breaks_per_step": 1.0},
        "1": {"compile_ids": [0], "calls_per_step": 1.0, "breaks_per_step": 0.0}}
    # Only the break's own operator: not the Prologue's aten::detach, not the graph's aten::mm,
    # not aten::_local_scalar_dense inside aten::item, not the optimizer or another thread's.
    assert [op["name"] for op in found["eager_operators"]] == ["aten::item"]
    assert found["eager_operators"][0]["calls_per_step"] == 1.0
    assert found["eager_in_regions_ms_per_step"] == pytest.approx(10 / 1000)
    assert found["compiling_ms"] == 0 and found["compiling_steps"] == []
    assert fired(result) >= {"graph_breaks"}
    assert "recompiles" not in fired(result)
    breaks = next(f for f in result["findings"] if f["id"] == "graph_breaks")
    assert "frame 0" in breaks["evidence"] and "aten::item" in breaks["evidence"]
    assert breaks["demo"] == "recompiles"
    assert "TORCH_LOGS=graph_breaks" in breaks["fix"] and "fullgraph=True" in breaks["fix"]


def test_a_frame_past_its_recompile_limit_runs_eagerly_inside_its_callers_region(tmp_path):
    """Past the limit the resumed frame has no region: its operators run eagerly in the
    caller's region, after the break. Frame 1 reached compile id 7 in an earlier step."""
    eager_rest = ("aten::item", "aten::linear", "aten::gelu", "aten::linear")
    calls = [[dict(frame=0, compile_id=0, eager=("aten::item",), resume=(1, 7))],
             [dict(frame=0, compile_id=0, eager=eager_rest)],
             [dict(frame=0, compile_id=0, eager=eager_rest)]]
    result = write(steps_of(calls), tmp_path)
    found = result["compiled"]
    assert found["frames"]["1"]["compile_ids"] == [7]
    assert found["graph_breaks_per_step"] == 1.0
    names = [op["name"] for op in found["eager_operators"]]
    assert names[0] == "aten::linear" and set(names) <= {"aten::item", "aten::linear",
                                                           "aten::gelu"}
    recompiles = next(f for f in result["findings"] if f["id"] == "recompiles")
    assert recompiles["severity"] == "high"
    assert "recompile_limit (8)" in recompiles["evidence"]
    assert "frame 1 under compile id 7 (up to its 8th compile)" in recompiles["evidence"]


def test_compile_ids_that_change_from_step_to_step_are_recompiles(tmp_path):
    calls = [[dict(frame=0, compile_id=cid)] for cid in (2, 3, 5, 3)]
    result = write(steps_of(calls), tmp_path)
    assert result["compiled"]["frames"]["0"]["compile_ids"] == [2, 3, 5]
    assert result["compiled"]["graph_breaks_per_step"] == 0
    recompiles = next(f for f in result["findings"] if f["id"] == "recompiles")
    assert recompiles["severity"] == "medium"
    assert "frame 0 under compile ids 2, 3, 5 (up to its 6th compile)" in recompiles["evidence"]
    assert "TORCH_LOGS=recompiles" in recompiles["fix"]
    # The analyzer's line says the same frame and ids in words.
    assert analyze.compiled_lines(result["compiled"])[0].startswith(
        "compiled     1.0 regions/step (frame 0: 1.0/step under compile ids 2, 3, 5), ")
    assert "graph_breaks" not in fired(result)


def test_two_graphs_of_one_frame_train_and_eval_are_no_recompiles(tmp_path):
    """A frame called in train() and in eval() mode runs under two compile ids every step, both
    cached: nothing recompiles (the rule wants three)."""
    calls = [[dict(frame=0, compile_id=0), dict(frame=0, compile_id=1, inference=True)]] * 4
    result = write(steps_of(calls), tmp_path)
    assert result["compiled"]["frames"]["0"]["compile_ids"] == [0, 1]
    assert result["compiled"]["regions_per_step"] == 2.0
    assert result["compiled"]["nested_regions_per_step"] == 0
    assert not fired(result) & {"recompiles", "graph_breaks"}
    ids = verdicts.RECOMPILE_DISTINCT_IDS_MIN
    assert ids == 3  # the rule's own constant, stated in its comment: beyond train/eval and dynamic


def test_compiling_inside_a_later_step_is_a_recompile(tmp_path):
    calls = [[dict(frame=0, compile_id=0)], [dict(frame=0, compile_id=0)],
             [dict(frame=0, compile_id=1)], [dict(frame=0, compile_id=1)],
             [dict(frame=0, compile_id=1)], [dict(frame=0, compile_id=1)]]
    result = write(steps_of(calls, compile_in_step=2, compile_id="0/1"), tmp_path)
    found = result["compiled"]
    assert found["compiling_ms"] == pytest.approx(200.0)
    assert found["compiling_steps"] == [2]
    assert found["compiled_in_steps"] == ["0/1"]
    assert found["graph_breaks_per_step"] == 0  # the fake tensors' aten::empty is compiling
    recompiles = next(f for f in result["findings"] if f["id"] == "recompiles")
    assert recompiles["severity"] == "high"
    assert "200.0 ms of compiling inside the steps (step 3; it built compile id 0/1)" in (
        recompiles["evidence"])


def test_compiling_in_the_first_step_is_start_up_and_withholds_the_recompile_verdict(tmp_path):
    """A cold trace compiles in its first step: initialization names it, and recompiles, which
    would read that compile as one, is withheld."""
    calls = [[dict(frame=0, compile_id=0)]] * 4
    result = write(steps_of(calls, compile_in_step=0, compile_id="0/0"), tmp_path)
    assert result["compiled"]["compiling_steps"] == [0]
    ids = fired(result)
    assert "initialization" in ids and "recompiles" not in ids
    start_up = next(f for f in result["findings"] if f["id"] == "initialization")
    assert "torch.compile compiling" in start_up["evidence"]
    assert "recompiles" in start_up["evidence"]  # named among the withheld


def test_a_clean_compiled_step_reads_one_region_and_no_verdict(tmp_path):
    calls = [[dict(frame=0, compile_id=0)]] * 3
    result = write(steps_of(calls), tmp_path)
    found = result["compiled"]
    assert found["regions_per_step"] == 1.0 and found["graph_breaks_per_step"] == 0
    assert found["eager_operators"] == [] and found["eager_in_regions_ms_per_step"] == 0
    assert found["graph_ms_per_step"] > 0
    assert not fired(result) & {"recompiles", "graph_breaks"}
    assert any(line.startswith("compiled ") for line in analyze.format_human(result).splitlines())


def test_regions_of_separately_compiled_modules_side_by_side_are_no_break(tmp_path):
    """Two compiled submodules called from eager code: two regions a step with eager code
    between them, but outside both: no region holds eager code, so no break."""
    calls = [[dict(frame=0, compile_id=0), dict(frame=1, compile_id=0)]] * 3
    result = write(steps_of(calls), tmp_path)
    assert result["compiled"]["regions_per_step"] == 2.0
    assert result["compiled"]["nested_regions_per_step"] == 0
    assert "graph_breaks" not in fired(result)


def test_a_region_without_ids_an_older_torch_still_shows_its_break(tmp_path):
    calls = [[dict(frame=None, compile_id=None, eager=("aten::item",),
                   resume=(None, None))]] * 3
    result = write(steps_of(calls), tmp_path)
    found = result["compiled"]
    assert found["frames"]["?"]["compile_ids"] == []
    assert ("(regions without a frame or compile id in their name: 2.0/step)"
            in analyze.compiled_lines(found)[0])
    assert found["graph_breaks_per_step"] == 1.0
    assert fired(result) >= {"graph_breaks"} and "recompiles" not in fired(result)


def test_a_trace_without_compiled_regions_has_no_compiled_reading(tmp_path):
    built = steps_of([[], [], []])
    result = write(built, tmp_path)
    assert result["compiled"] is None
    assert not any(line.startswith("compiled ")
                   for line in analyze.format_human(result).splitlines())


def test_breaks_below_one_a_step_do_not_fire(tmp_path):
    """One forward in four breaks (a branch taken now and then): 0.25 a step, under the rule."""
    calls = ([[dict(frame=0, compile_id=0, eager=("aten::item",))]]
             + [[dict(frame=0, compile_id=0)]] * 3)
    result = write(steps_of(calls), tmp_path)
    assert result["compiled"]["graph_breaks_per_step"] == 0.25
    assert "graph_breaks" not in fired(result)


def test_outermost_keeps_operators_no_other_contains():
    from common.intervals import Spans
    import numpy as np
    ops = Spans(np.array([0.0, 1.0, 2.0, 10.0, 10.0]), np.array([5.0, 2.0, 3.0, 12.0, 11.0]))
    assert compiled.outermost(np.arange(5), ops).tolist() == [0, 3]


# --- Real traces: the reference runs that compile cleanly, and every shared trace. -------------

CLEAN_COMPILED = ("traces/reference/h100/launch_overhead/fixed",  # mode="reduce-overhead"
                  "traces/reference/cpu/llm_decode/fixed")  # a compiled decode step, 7 a step


@pytest.mark.parametrize("run", CLEAN_COMPILED)
def test_reference_runs_that_compile_cleanly_read_regions_and_no_verdict(run):
    result = analyze.analyze_trace(ROOT / run)
    found = result["compiled"]
    assert found is not None and found["regions_per_step"] >= 1
    assert found["graph_breaks_per_step"] == 0 and found["compiling_ms"] == 0
    assert all(entry["compile_ids"] == [0] for entry in found["frames"].values())
    assert not fired(result) & {"recompiles", "graph_breaks"}


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="the shared real traces are not here")
def test_no_shared_trace_has_compiled_regions_or_a_compile_verdict():
    """The shared traces hold no "Torch-Compiled Region" (three hold CompiledFunction, from
    releases that wrote no regions: a graph break cannot be told there from graphs a DDP or
    TorchRec wrapper compiled apart), so neither rule may fire on any."""
    traces = sorted(SHARED_TRACES.glob("*.json.gz"))
    assert len(traces) >= 10
    for path in traces:
        result = analyze.analyze_trace(path)
        assert result["compiled"] is None, path.name
        assert not fired(result) & {"recompiles", "graph_breaks"}, path.name


def test_what_runs_inside_compiling_is_compiling_and_no_operators_own_time(tmp_path):
    """A CPU step whose first backward compiles (torch 2.14): inside CompiledFunctionBackward,
    entire_backward_compile (no marker) holds a marked range, and inside that an unmarked one
    (inductor_compile) and tracing's operators. None is an operator; CompiledFunctionBackward's
    own time is its 10 µs outside them; an operator on another thread meanwhile stays one. Its
    time in compiled graphs is those 10 µs too, not the compiling it holds; a later graph call's
    100 µs count whole, though another thread compiles meanwhile."""
    built = KinetoTrace(vocabulary="current")
    built.step(1, START_US, 2 * STEP_US)
    built.op("aten::mm", START_US + 10, 100)
    built.op("CompiledFunctionBackward", START_US + 200, 1_010)
    built.op("entire_backward_compile", START_US + 205, 1_000)
    built.op("backward._backward_impl (dynamo_timed)", START_US + 206, 998)
    built.op("inductor_compile", START_US + 207, 900)
    built.op("aten::empty_strided", START_US + 208, 1)
    built.op("aten::mm", START_US + 300, 50, tid=BACKGROUND_TID)
    built.op("CompiledFunction", START_US + 1_300, 100)
    built.op("_compile.compile_inner (dynamo_timed)", START_US + 1_300, 100, tid=BACKGROUND_TID)
    result = write(built, tmp_path)
    assert result["compiled"]["graph_ms_per_step"] == pytest.approx(0.11)
    assert result["compiled"]["compiling_ms"] == pytest.approx(1.1)
    cpu = result["cpu"]
    assert cpu["ops_per_step"] == 4  # two aten::mm and the two graph calls
    assert dict(cpu["top_ops_ms_per_step"]) == {
        "aten::mm": pytest.approx(0.15), "CompiledFunction": pytest.approx(0.1),
        "CompiledFunctionBackward": pytest.approx(0.01)}


def test_compiling_in_a_cpu_step_is_no_operator(tmp_path):
    """A recompile inside a recorded step of a CPU trace: its compiling ranges (torch 2.14 writes
    them as operators) are not operators to the CPU metrics: not among the most self time, not
    counted a step, and their time is not "outside every operator" either (compiling names it).
    Nor are the operators inside them: the fake tensors made while tracing are compiling too."""
    calls = [[dict(frame=0, compile_id=0)]] * 4
    result = write(steps_of(calls, compile_in_step=1), tmp_path)
    cpu = result["cpu"]
    names = [name for name, _ in cpu["top_ops_ms_per_step"]]
    assert not [name for name in names if "compile" in name], names
    quiet = write(steps_of(calls), tmp_path, "quiet.json")["cpu"]
    # the same operators a step: the aten::empty made while tracing is no step's
    assert cpu["ops_per_step"] == pytest.approx(quiet["ops_per_step"])
    # 200 ms of compiling in a window of about 204 ms: none of it outside operators
    assert cpu["outside_ops_pct"] < quiet["outside_ops_pct"]
    assert result["compiled"]["compiling_ms"] == pytest.approx(200.0)  # where it is named
