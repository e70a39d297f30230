"""Host regions (idle_causes.host_regions): a record_function range that enqueues no GPU work and
spends at least four fifths of its time outside PyTorch operators and collective calls is host
work, a cause of the GPU's idle time by its own name (after the DataLoader, before host syncs),
a share of the window on a trace without a GPU, and the host_region verdict. Hand-built traces whose numbers are worked out in
each test's docstring (µs after T0)."""
from __future__ import annotations

import pytest

from common import analyze, compare, idle_causes
from common.idle_causes import HOST_REGION_OUTSIDE_OPS_MIN, IDLE_CAUSES
from common.verdicts import HOST_REGION_MIN_PCT
from tests.kineto_builder import KinetoTrace

T0 = 1_000_000.0  # µs
STEP_US = 1000.0
# Vocabularies whose record_function ranges are user_annotation spans: Kineto's current one, and
# our rewrite for TensorBoard (which keeps user regions user_annotation).
VOCABULARIES = ("current", "tensorboard")


def analysed(tmp_path, built: KinetoTrace) -> dict:
    return analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))


def ids(result: dict) -> list[str]:
    return [f["id"] for f in result["findings"]]


def assert_idle_adds_up(result: dict) -> None:
    """The causes split the idle time and nothing else: 100 - the GPU's busy share. (The traces
    here have kernels only, so busy = utilization.)"""
    gpu = result["gpu"]
    assert sum(gpu["idle_by_cause_pct"].values()) == pytest.approx(
        100.0 - gpu["utilization_pct"], abs=1e-9)


def tokenize_then_launch(vocabulary: str = "current", kernel_us: float = 30.0,
                         launch_in_region: bool = False) -> KinetoTrace:
    """Three steps of 1000 µs: a "tokenize" region [0, 400) with no operator and no launch (pure
    Python), then ten launches at 400 + 50 j (5 µs each), each kernel running `kernel_us` from 3
    µs after its launch returns (408 + 50 j). `launch_in_region`: one more launch at 200, inside
    the region, its kernel at [208, 208 + kernel_us)."""
    t = KinetoTrace(vocabulary=vocabulary)
    t.gpu()
    for number in range(3):
        at = T0 + number * STEP_US
        t.step(number + 1, at, STEP_US)
        t.region("tokenize", at, 400)
        if launch_in_region:
            t.launch(at + 200, 5, at + 208, kernel_us)
        for j in range(10):
            t.launch(at + 400 + 50 * j, 5, at + 408 + 50 * j, kernel_us)
    return t


@pytest.mark.parametrize("vocabulary", VOCABULARIES)
def test_gpu_idle_in_a_tokenize_region_is_its_own(tmp_path, vocabulary):
    """Window [0, 3000); 30 kernels of 30 µs: busy 900 (30 %). By hand: the opening gap [0, 408)
    is tokenize's for 400 and before_first_op's for 8; in a step, 9 gaps of 20 µs, launch until
    the next launch returns (17) and other 3: 27 x 17 = 459 and 81; between steps the gap
    [888, 1408) holds the next tokenize (400), launch until 1405 less that (117) and other 3,
    twice: 234 and 6; the tail [2888, 3000) is other (112). tokenize 1200 (40 %), before 8,
    launch 693, other 199: 2100 = 3000 - 900."""
    result = analysed(tmp_path, tokenize_then_launch(vocabulary))
    gpu = result["gpu"]
    assert gpu["utilization_pct"] == pytest.approx(30.0)
    assert gpu["idle_by_cause_pct"] == pytest.approx(
        {"dataloader": 0.0, "tokenize": 40.0, "host_sync": 0.0, "before_first_op": 8 / 30,
         "launch": 693 / 30, "other": 199 / 30, "unrecorded": 0.0})
    assert list(gpu["idle_by_cause_pct"])[:2] == ["dataloader", "tokenize"]  # its precedence
    assert_idle_adds_up(result)
    assert result["host_regions"] == {"tokenize": pytest.approx(
        {"pct": 40.0, "ms_per_step": 0.4, "outside_ops_pct": 100.0, "gpu_idle_pct": 40.0})}
    # One region holds 40 % of the window's idle time: twice the rule's 20 %, high.
    assert ids(result) == ["host_region"]
    found = result["findings"][0]
    assert found["severity"] == "high" and found["demo"] == "tokenizer_bound"
    assert "'tokenize'" in found["evidence"] and "40 %" in found["evidence"]
    assert "0.4 ms/step" in found["evidence"] and "encode_batch" in found["fix"]


def test_the_region_is_named_in_the_outputs(tmp_path):
    """analyze's text, compare's step parts and still_bounds, the report's label: "tokenize"."""
    result = analysed(tmp_path, tokenize_then_launch())
    text = analyze.format_human(result)
    assert "DataLoader 0.0, region tokenize 40.0, host syncs 0.0" in text
    assert "host regions tokenize 40.0 % of the steps (0.40 ms/step, GPU idle 40.0 %)" in text
    parts = compare.step_parts_ms(result)
    assert parts["GPU idle: tokenize"] == pytest.approx(0.4)  # 40 % of a 1 ms step
    assert compare.still_bounds(result).startswith(
        "the GPU waiting for host work in region tokenize (40 % of the steps)")
    assert analyze.idle_cause_label("tokenize") == "region tokenize"
    assert analyze.idle_cause_label("launch") == "launches"


def test_a_region_that_launches_is_no_cause(tmp_path):
    """The same region with one launch inside it enqueues GPU work: no host region, the five
    fixed causes only, and no host_region verdict."""
    result = analysed(tmp_path, tokenize_then_launch(launch_in_region=True))
    assert result["host_regions"] == {}
    assert list(result["gpu"]["idle_by_cause_pct"]) == list(IDLE_CAUSES)
    assert "host_region" not in ids(result)
    assert_idle_adds_up(result)


def test_a_region_waiting_on_another_threads_launches_is_no_cause(tmp_path):
    """The harness's "backward" region: the main thread holds neither an operator nor a launch
    while autograd's thread launches the kernels. Any thread's launch inside it counts: not host
    work. (In the H100 reference traces every backward region is so.)"""
    t = KinetoTrace()
    t.gpu()
    for number in range(3):
        at = T0 + number * STEP_US
        t.step(number + 1, at, STEP_US)
        t.region("backward", at, 900)
        for j in range(10):
            correlation = t.runtime("cudaLaunchKernel", at + 100 + 50 * j, 5, tid=99)
            t.gpu_event("kernel", "k", at + 108 + 50 * j, 30, correlation, at + 100 + 50 * j)
    result = analysed(tmp_path, t)
    assert result["host_regions"] == {}
    assert list(result["gpu"]["idle_by_cause_pct"]) == list(IDLE_CAUSES)


def test_nested_regions_split_their_time_innermost_first(tmp_path):
    """Per step: "preprocess" [0, 400) holds "tokenize" [100, 300) (pure Python) and "normalize"
    [300, 380), 80 µs of aten ops: normalize is no host region (no time outside operators), so
    its time is preprocess's (innermost qualifying); preprocess is 80 % outside operators.
    Launches as in tokenize_then_launch, kernels 30 µs. By hand: tokenize 200 a step, preprocess
    200 (600 each, 20 %), the rest as there: before 8, launch 693, other 199."""
    t = KinetoTrace()
    t.gpu()
    for number in range(3):
        at = T0 + number * STEP_US
        t.step(number + 1, at, STEP_US)
        t.region("preprocess", at, 400)
        t.region("tokenize", at + 100, 200)
        t.region("normalize", at + 300, 80)
        t.op("aten::sub", at + 300, 80)
        for j in range(10):
            t.launch(at + 400 + 50 * j, 5, at + 408 + 50 * j, 30)
    result = analysed(tmp_path, t)
    idle = result["gpu"]["idle_by_cause_pct"]
    assert idle == pytest.approx({"dataloader": 0.0, "tokenize": 20.0, "preprocess": 20.0,
                                  "host_sync": 0.0, "before_first_op": 8 / 30,
                                  "launch": 693 / 30, "other": 199 / 30, "unrecorded": 0.0})
    assert_idle_adds_up(result)
    regions = result["host_regions"]
    assert set(regions) == {"preprocess", "tokenize"}  # normalize: all operators
    assert regions["preprocess"]["pct"] == pytest.approx(20.0)
    assert regions["preprocess"]["outside_ops_pct"] == pytest.approx(80.0)
    assert regions["tokenize"]["ms_per_step"] == pytest.approx(0.2)


def test_a_region_after_a_sync_comes_before_host_sync(tmp_path):
    """Per step: a launch at 0 (kernel [8, 308)), cudaStreamSynchronize [10, 310) (returns 2 µs
    after the GPU drained), then "tokenize" [310, 610), then a launch at 610 (kernel [618, 918)).
    The gap [308, 618) is one a sync returns in: tokenize's 300 first, host_sync's the other 10.
    Between steps [918, 1008): launch 87, other 3; opening 8; tail [2918, 3000) other 82. Busy
    1800 of 3000: tokenize 900 (30 %), host_sync 30, before 8, launch 174, other 88."""
    t = KinetoTrace()
    t.gpu()
    for number in range(3):
        at = T0 + number * STEP_US
        t.step(number + 1, at, STEP_US)
        t.launch(at, 5, at + 8, 300)
        t.runtime("cudaStreamSynchronize", at + 10, 300)
        t.region("tokenize", at + 310, 300)
        t.launch(at + 610, 5, at + 618, 300)
    result = analysed(tmp_path, t)
    gpu = result["gpu"]
    assert gpu["idle_by_cause_pct"] == pytest.approx(
        {"dataloader": 0.0, "tokenize": 30.0, "host_sync": 1.0, "before_first_op": 8 / 30,
         "launch": 174 / 30, "other": 88 / 30, "unrecorded": 0.0})
    assert_idle_adds_up(result)
    # The sync's own numbers are unchanged: the whole gap (310 µs, 3 steps) is still the one
    # it returns in.
    assert gpu["sync_idle_pct"] == pytest.approx(930 / 30)
    assert "host_region" in ids(result)


def test_the_dataloader_keeps_its_time_inside_a_region(tmp_path):
    """A DataLoader __next__ span [0, 100) inside "tokenize" [0, 400): its 100 µs stay the
    DataLoader's (idle and share of the window); tokenize holds the other 300 a step."""
    t = tokenize_then_launch()
    for number in range(3):
        t.dataloader(T0 + number * STEP_US, 100)
    result = analysed(tmp_path, t)
    idle = result["gpu"]["idle_by_cause_pct"]
    assert idle["dataloader"] == pytest.approx(10.0) and idle["tokenize"] == pytest.approx(30.0)
    assert result["host_regions"]["tokenize"]["pct"] == pytest.approx(30.0)
    assert result["host_regions"]["tokenize"]["ms_per_step"] == pytest.approx(0.3)
    assert_idle_adds_up(result)


def test_a_region_named_like_a_fixed_cause_gets_its_own_key(tmp_path):
    """A record_function("launch") around pure Python: its idle time is keyed "launch (region)",
    and the fixed "launch" cause keeps its own number (as in the tokenize trace)."""
    t = KinetoTrace()
    t.gpu()
    for number in range(3):
        at = T0 + number * STEP_US
        t.step(number + 1, at, STEP_US)
        t.region("launch", at, 400)
        for j in range(10):
            t.launch(at + 400 + 50 * j, 5, at + 408 + 50 * j, 30)
    result = analysed(tmp_path, t)
    idle = result["gpu"]["idle_by_cause_pct"]
    assert idle["launch (region)"] == pytest.approx(40.0)
    assert idle["launch"] == pytest.approx(693 / 30)
    assert result["host_regions"]["launch"]["gpu_idle_pct"] == pytest.approx(40.0)
    assert idle_causes.region_cause("busy") == "busy (region)"
    assert idle_causes.region_cause("tokenize") == "tokenize"
    assert_idle_adds_up(result)


# --- Without a GPU: the share of the window. ------------------------------------------------

def cpu_steps(tokenize_us: float, forward_op_us: float = 540.0) -> KinetoTrace:
    """Three CPU steps of 1000 µs: "tokenize" [0, tokenize_us) with no operator (pure Python),
    then "forward" [tokenize_us, 1000) whose aten ops cover `forward_op_us` of it."""
    t = KinetoTrace()
    for number in range(3):
        at = T0 + number * STEP_US
        t.step(number + 1, at, STEP_US)
        t.region("tokenize", at, tokenize_us)
        t.region("forward", at + tokenize_us, STEP_US - tokenize_us)
        t.op("aten::linear", at + tokenize_us, forward_op_us)
    return t


def test_a_python_region_fires_on_a_cpu_trace(tmp_path):
    """tokenize [0, 400) a step: 40 % of the window, 0.4 ms a step; forward [400, 1000) is 90 %
    aten::linear, no host work. The verdict reads the window share: high at twice 20 %."""
    result = analysed(tmp_path, cpu_steps(400.0))
    assert result["gpu"] is None
    assert result["host_regions"] == {"tokenize": pytest.approx(
        {"pct": 40.0, "ms_per_step": 0.4, "outside_ops_pct": 100.0, "gpu_idle_pct": None})}
    assert ids(result) == ["host_region"]
    found = result["findings"][0]
    assert found["severity"] == "high" and "holds 40 % of the window" in found["evidence"]
    assert "host regions tokenize 40.0 % of the steps (0.40 ms/step)" in analyze.format_human(
        result)
    assert compare.step_parts_ms(result)["host region: tokenize"] == pytest.approx(0.4)
    assert "host region tokenize holds 40 % of the steps" in compare.still_bounds(result)


def test_a_region_full_of_operators_is_no_host_work(tmp_path):
    """forward with 810 of its 900 µs in operators (10 % outside): not a host region; a
    forward with 180 of 900 (exactly four fifths outside) is one (the rule is at least 80 %);
    one with 181 is not: a region that mixes operators and Python is the model's."""
    busy = analysed(tmp_path, cpu_steps(100.0, forward_op_us=810.0))  # 900 µs: 10 % outside
    assert set(busy["host_regions"]) == {"tokenize"}
    edge = 900.0 * (1 - HOST_REGION_OUTSIDE_OPS_MIN)
    at_edge = analysed(tmp_path, cpu_steps(100.0, forward_op_us=edge))
    assert at_edge["host_regions"]["forward"]["outside_ops_pct"] == pytest.approx(80.0)
    over_edge = analysed(tmp_path, cpu_steps(100.0, forward_op_us=edge + 1))
    assert set(over_edge["host_regions"]) == {"tokenize"}


def test_a_region_waiting_in_a_collective_is_no_host_work(tmp_path):
    """DDP's backward on a CPU waits for the other rank inside gloo's all-reduce, with no
    operator open: communication, not host work (a gloo:all_reduce span over 800 of its 900 µs)."""
    t = KinetoTrace()
    for number in range(3):
        at = T0 + number * STEP_US
        t.step(number + 1, at, STEP_US)
        t.region("backward", at + 50, 900)
        t.span("annotation", "gloo:all_reduce", at + 100, 800)
    assert "backward" not in (analysed(tmp_path, t)["host_regions"] or {})


@pytest.mark.parametrize("tokenize_us, fires", [
    (10 * HOST_REGION_MIN_PCT - 1, False), (10 * HOST_REGION_MIN_PCT, True)])
def test_the_verdict_fires_from_a_fifth_of_the_window(tmp_path, tokenize_us, fires):
    """tokenize holds tokenize_us of each 1000 µs step: 19.9 % is silent, 20 % fires."""
    result = analysed(tmp_path, cpu_steps(tokenize_us, forward_op_us=1000.0 - tokenize_us))
    assert result["host_regions"]["tokenize"]["pct"] == pytest.approx(tokenize_us / 10)
    assert ("host_region" in ids(result)) == fires
