"""CUDA graph replays: one cudaGraphLaunch (cuGraphLaunch, hipGraphLaunch) enqueues every kernel of
a captured graph, and CUPTI gives them all its correlation id. Pinned here: such kernels count as
launched by it (launching_call, kernels_of_steps, the idle "launch" cause), the graph metrics
(gpu.graph_launches_per_step, graph_kernels_per_step), that a replayed step is not read as launch
bound, and that the host fixes of a replayed step do not tell the user to capture it in a graph.
On a hand-built graph-replay trace and its eager twin (worked out below, µs after T0), on the
committed H100 launch_overhead/fixed run (torch.compile mode="reduce-overhead") and on the
shared MI300X vLLM trace (25 hipGraphLaunch), both counted by hand from their JSON."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from common import analyze, trace_steps
from tests.conftest import ROOT
from tests.kineto_builder import KinetoTrace

T0 = 1_000_000.0  # µs
STEP_US = 2000.0
KERNELS = 200  # per step
KERNEL_US = 2.0  # short: < metrics.SHORT_KERNEL_US


def analysed(tmp_path, built: KinetoTrace) -> dict:
    return analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))


def ids(result: dict) -> list[str]:
    return [f["id"] for f in result["findings"]]


def graph_steps(api: str = "cudaGraphLaunch", launch_us: float = 20.0) -> KinetoTrace:
    """Three steps of 2000 µs, each one graph launch [100, 100 + launch_us) replaying 200
    kernels of 2 µs back to back from 125 (to 525)."""
    t = KinetoTrace()
    t.gpu()
    for number in range(3):
        at = T0 + number * STEP_US
        t.step(number + 1, at, STEP_US)
        t.graph_launch(at + 100, launch_us, [(at + 125 + KERNEL_US * k, KERNEL_US)
                                             for k in range(KERNELS)], api=api)
    return t


def eager_steps() -> KinetoTrace:
    """The eager twin: the same 200 kernels a step, each launched by its own cudaLaunchKernel
    (5 µs, one every 6 µs from 100), each kernel from 3 µs after its launch returns."""
    t = KinetoTrace()
    t.gpu()
    for number in range(3):
        at = T0 + number * STEP_US
        t.step(number + 1, at, STEP_US)
        for k in range(KERNELS):
            t.launch(at + 100 + 6 * k, 5, at + 108 + 6 * k, KERNEL_US)
    return t


@pytest.mark.parametrize("api", ["cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"])
def test_a_graph_replay_counts_its_kernels_as_launched(tmp_path, api):
    """1 launch a step, a graph launch, replaying 200 kernels; no "0 launches"."""
    path = graph_steps(api).write(tmp_path / "t.pt.trace.json")
    analysis = analyze.analyze(path)
    gpu = analysis.result["gpu"]
    assert gpu["kernels_per_step"] == KERNELS
    assert gpu["launches_per_step"] == 1 and gpu["graph_launches_per_step"] == 1
    assert gpu["graph_kernels_per_step"] == KERNELS
    assert gpu["graph_launch_ms_per_step"] == pytest.approx(0.02)
    columns = analysis.columns
    call = trace_steps.launching_call(columns, columns.kernel_correlation)
    assert (call >= 0).all() and columns.runtime_is_graph_launch[call].all()
    assert trace_steps.kernels_of_steps(columns, analysis.window, analysis.host_window).sum() == (
        3 * KERNELS)
    assert ("1 launches/step, 1 of them CUDA graph launches replaying 200 kernels/step"
            in analyze.format_human(analysis.result))


def test_the_eager_twin_has_no_graph(tmp_path):
    gpu = analysed(tmp_path, eager_steps())["gpu"]
    assert gpu["kernels_per_step"] == KERNELS and gpu["launches_per_step"] == KERNELS
    assert gpu["graph_launches_per_step"] == 0 and gpu["graph_kernels_per_step"] == 0
    assert "CUDA graph launches" not in analyze.format_human(analysed(tmp_path, eager_steps()))


def test_launch_overhead_fires_on_the_eager_twin_only(tmp_path):
    """Eager: 200 launch calls of 5 µs (1.0 ms) for 0.4 ms of 2 µs kernels, 2.5x: launch bound.
    Replayed: one graph launch for the same kernels, here a slow one of 500 µs (1.25x the
    kernels' time; the H100 launch_overhead/fixed trace's take 213-338 µs for 148 and 243
    kernels), which the rule leaves out (0 ms of launch calls outside graphs): not launch bound.
    The GPU waits for the host's next enqueue 53 % of the window (the first kernel of each step
    enqueued when it started, at 2125, before its graph launch returned: launch [525, 2125)
    twice, 3200 of 6000 µs): host_overhead, whose fix says the kernels are already replayed and
    names what is left, not "capture the step in a CUDA graph"."""
    eager = analysed(tmp_path, eager_steps())
    assert ids(eager) == ["launch_overhead"]
    assert "CUDA graphs" in eager["findings"][0]["fix"]
    replayed = analysed(tmp_path, graph_steps(launch_us=500.0))
    assert replayed["gpu"]["idle_by_cause_pct"]["launch"] == pytest.approx(3200 / 60)
    assert ids(replayed) == ["host_overhead"]
    found = replayed["findings"][0]
    assert found["demo"] is None  # the graphs are in place: no pair shows what is left
    assert "already replayed from 1 CUDA graph launch a step (200 of 200)" in found["fix"]
    assert "between the replays" in found["fix"]
    assert "capture the step" not in found["fix"] and "capture" in eager_host_fix(tmp_path)
    assert "0.50 ms in CUDA graph launches aside" in found["evidence"]


def test_a_host_bound_loop_points_at_the_pair_of_its_kind(tmp_path):
    """The eager twin has no backward pass: inference, whose launch-bound loop is token-by-token
    generation's (llm_decode: a static KV cache, then CUDA graphs). The same numbers from a
    training step point at launch_overhead, and say nothing of a KV cache."""
    from common import verdicts
    m = analysed(tmp_path, eager_steps())
    assert m["training"] is False
    found = verdicts.rule_launch_overhead(m)
    assert found["demo"] == "llm_decode" and "static KV cache" in found["fix"]
    trained = verdicts.rule_launch_overhead({**m, "training": True})
    assert trained["demo"] == "launch_overhead" and "KV cache" not in trained["fix"]
    host_bound = {**m, "gpu": {**m["gpu"], "launch_ms_per_step": 0.0, "idle_by_cause_pct": {
        **m["gpu"]["idle_by_cause_pct"], "launch": 60.0}}}
    assert verdicts.rule_host_overhead(host_bound)["demo"] == "llm_decode"
    assert verdicts.rule_host_overhead({**host_bound, "training": True})["demo"] == (
        "launch_overhead")


def eager_host_fix(tmp_path) -> str:
    """host_overhead's fix where no kernel is replayed from a graph: the eager twin's metrics,
    made host bound without being launch bound (no launch-call time, the GPU waiting 60 % of the
    window for an enqueue), read by the rule itself."""
    from common import verdicts
    m = analysed(tmp_path, eager_steps())
    m["gpu"].update(launch_ms_per_step=0.0,
                    idle_by_cause_pct={**m["gpu"]["idle_by_cause_pct"], "launch": 60.0})
    return verdicts.rule_host_overhead(m)["fix"]


def test_the_idle_causes_of_a_replay(tmp_path):
    """Window [0, 6000) (the steps; the GPU ends each at 525). Busy: 3 x 400 µs. The opening gap
    [0, 125) is before_first_op's; between steps, [525, 2125): its first kernel was enqueued
    when the graph launch returned (2120): launch 1595, other 5, twice; the tail [4525, 6000)
    other 1475. The 199 kernels after each graph's first were enqueued when it started: no gap
    between them is the host's. before 125, launch 3190, other 1485."""
    gpu = analysed(tmp_path, graph_steps())["gpu"]
    assert gpu["utilization_pct"] == pytest.approx(20.0)
    assert gpu["idle_by_cause_pct"] == pytest.approx(
        {"dataloader": 0.0, "host_sync": 0.0, "before_first_op": 125 / 60, "launch": 3190 / 60,
         "other": 1485 / 60, "unrecorded": 0.0})


def test_a_graphs_kernels_are_enqueued_when_its_first_one_starts(tmp_path):
    """Steps of 1000 µs, each a graph launch [100, 300) whose first kernel starts at 110, before
    the call returns, and whose second starts at 200, after a dependency gap [112, 200). That
    gap is the graph's (other), not the host's: the second kernel was enqueued at 110, when the
    first started. By hand, window [0, 3000): the opening gap [0, 110) is before_first_op's;
    each step's [112, 200) other (88); [202, 1110) launch (908), the next step's first kernel
    being enqueued when it started (its graph launch returns later, at 1300), twice; the tail
    [2202, 3000) other (798). before 110, launch 1816, other 3 x 88 + 798."""
    t = KinetoTrace()
    t.gpu()
    for number in range(3):
        at = T0 + number * 1000.0
        t.step(number + 1, at, 1000.0)
        t.graph_launch(at + 100, 200, [(at + 110, 2), (at + 200, 2)])
    gpu = analysed(tmp_path, t)["gpu"]
    assert gpu["idle_by_cause_pct"] == pytest.approx(
        {"dataloader": 0.0, "host_sync": 0.0, "before_first_op": 110 / 30,
         "launch": 1816 / 30, "other": (3 * 88 + 798) / 30, "unrecorded": 0.0})


# --- Real traces, counted by hand from their JSON. ------------------------------------------

REFERENCE_RUN = ROOT / "traces" / "reference" / "h100" / "launch_overhead" / "fixed"
VLLM_TRACE = (ROOT.parent / "shared" / "traces"
              / "mi300x_vllm_prefill_decode_piecewise_graphs.json.gz")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver", "runtime")  # "Runtime" after our rewrite


def raw_events(path: Path) -> list[dict]:
    with gzip.open(path) as stream:
        return [e for e in json.load(stream)["traceEvents"] if e.get("ph") == "X"]


def graph_counts_by_hand(events: list[dict], graph_api: str) -> tuple[int, int, int, int]:
    """(steps, graph launches, kernels sharing their correlation ids, all launch calls) inside
    the ProfilerStep#N spans on the CPU (none: the whole trace, one step)."""
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e["name"].startswith("ProfilerStep#") and e["cat"] == "user_annotation"]
    runtime = [e for e in events if e["cat"].lower() in RUNTIME_CATEGORIES]
    if steps:
        runtime = [e for e in runtime if any(low <= e["ts"] and e["ts"] + e["dur"] <= high
                                             for low, high in steps)]
    graphs = {e["args"]["correlation"] for e in runtime if e["name"] == graph_api}
    kernels = sum(1 for e in events
                  if e["cat"] == "kernel" and e["args"].get("correlation") in graphs)
    launches = sum(1 for e in runtime if e["name"] in (
        graph_api, "cudaLaunchKernel", "hipLaunchKernel", "hipModuleLaunchKernel",
        "hipExtModuleLaunchKernel"))
    return max(len(steps), 1), len(graphs), kernels, launches


@pytest.mark.skipif(not REFERENCE_RUN.is_dir(), reason="no committed H100 reference run")
def test_torch_compile_reduce_overhead_on_an_h100():
    """launch_overhead/fixed: 2 cudaGraphLaunch a step (forward and backward, 391 kernels
    between them) and 11 cudaLaunchKernel (the optimizer), by hand; not launch bound, and its
    host_overhead fix speaks of the replays, not of capturing the step."""
    trace_path = analyze.trace.newest_trace(REFERENCE_RUN)
    steps, graphs, kernels, launches = graph_counts_by_hand(raw_events(trace_path),
                                                            "cudaGraphLaunch")
    assert (steps, graphs, kernels, launches) == (3, 6, 1173, 39)  # read off the JSON once
    analysis = analyze.analyze(REFERENCE_RUN)
    gpu = analysis.result["gpu"]
    assert gpu["graph_launches_per_step"] == graphs / steps
    assert gpu["graph_kernels_per_step"] == kernels / steps
    assert gpu["launches_per_step"] == launches / steps
    assert 100 * gpu["graph_kernels_per_step"] / gpu["kernels_per_step"] > 95
    columns = analysis.columns
    ours = trace_steps.kernels_of_steps(columns, analysis.window, analysis.host_window)
    call = trace_steps.launching_call(columns, columns.kernel_correlation)
    replayed = (call >= 0) & columns.runtime_is_graph_launch[np.maximum(call, 0)]
    assert int((ours & replayed).sum()) == kernels  # every replayed kernel is the steps'
    found = {f["id"]: f for f in analysis.result["findings"]}
    assert "launch_overhead" not in found
    fix = found["host_overhead"]["fix"]
    assert "already replayed from 2 CUDA graph launches a step (391 of 402)" in fix
    assert "capture the step" not in fix


@pytest.mark.skipif(not VLLM_TRACE.is_file(), reason="the shared real traces are missing")
def test_vllm_piecewise_hip_graphs_on_an_mi300x():
    """25 hipGraphLaunch replaying 361 of its 413 kernels (the other 52 launched one by one),
    no ProfilerStep: one step."""
    steps, graphs, kernels, launches = graph_counts_by_hand(raw_events(VLLM_TRACE),
                                                            "hipGraphLaunch")
    assert (steps, graphs, kernels, launches) == (1, 25, 361, 77)
    result = analyze.analyze_trace(VLLM_TRACE)
    gpu = result["gpu"]
    assert gpu["graph_launches_per_step"] == graphs
    assert gpu["graph_kernels_per_step"] == kernels
    assert gpu["launches_per_step"] == launches and gpu["kernels_per_step"] == 413
    assert "launch_overhead" not in ids(result)
