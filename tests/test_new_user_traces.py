"""Traces as new users record them: a GPU run whose GPU the profiler did not record, CPU-only runs
read as CPU runs, host work that starves the GPU named by operator, a sync that only ends the
step. Hand-built traces pin each rule at its edges; the committed CPU runs check the CPU rules on
real traces of the pairs that teach them."""
from __future__ import annotations

import gzip
import os

import pytest

from common import analyze
from common.verdicts import CPU_CALLS_MIN_PCT, PYTHON_OUTSIDE_OPS_MIN_PCT
from tests.conftest import ROOT
from tests.kineto_builder import KinetoTrace

STEP_US = 1000.0


# --- One process driving two GPUs (a model split across them). -----------------------------------

def split_model_trace() -> KinetoTrace:
    """Four steps of 1000 µs; in each, the first half of the model on GPU 0 (a kernel 0..400 µs)
    hands its activations to the second on GPU 1 (a device-to-device copy 400..450, then a kernel
    450..850): each GPU waits while the other works, busy 40 % and 45 %, and at least one of them
    85 % of the time."""
    t = KinetoTrace()
    t.gpu()
    t.gpu()
    for step in range(4):
        at = step * STEP_US
        t.step(step + 1, at, STEP_US)
        t.gpu_pid = 0
        t.launch(at, 5, at, 400)
        t.gpu_pid = 1
        t.memcpy(at + 10, 5, at + 400, 50, kind="DtoD")
        t.launch(at + 20, 5, at + 450, 400)
    return t


def test_two_gpus_in_one_trace_give_each_one_s_utilization_and_say_the_rest_is_their_union(
        tmp_path, capsys):
    path = split_model_trace().write(tmp_path / "t.json")
    result = analyze.analyze_trace(path)
    gpu = result["gpu"]
    assert gpu["utilization_pct"] == pytest.approx(85.0)  # the union: one GPU or the other
    assert gpu["utilization_pct_by_device"] == pytest.approx({"0": 40.0, "1": 45.0})
    assert result["warnings"] == [
        "GPU work on 2 devices in one trace: utilization, idle time and every other GPU number "
        "here are of their union (a time when any of them is busy), not of one GPU; each "
        "device's own utilization, by the pid its events are under: 0: 40.0 %, 1: 45.0 %"]
    assert analyze.main([str(path)]) == 0
    assert "warning      GPU work on 2 devices in one trace" in capsys.readouterr().out


def test_one_gpu_at_work_in_the_window_gives_no_utilization_by_device(tmp_path):
    """GPU 0's half alone in the steps; GPU 1 ran one kernel before them (a warm-up, say): in the
    window the union is GPU 0's own, and there is nothing to split or warn of."""
    t = split_model_trace()
    t.events = [event for event in t.events if event["pid"] != 1]
    t.gpu_pid = 1
    t.launch(-500, 5, -490, 100)
    result = analyze.analyze_trace(t.write(tmp_path / "t.json"))
    assert result["gpu"]["utilization_pct"] == pytest.approx(40.0)
    assert result["gpu"]["utilization_pct_by_device"] is None and result["warnings"] == []


# --- A GPU run whose GPU was not recorded. -------------------------------------------------------

def unrecorded_gpu_trace(launches: int, vocabulary: str = "current") -> KinetoTrace:
    """Three steps of CUDA runtime calls (launches, a copy, a sync) and no GPU event: a GPU run
    recorded with ProfilerActivity.CPU alone."""
    t = KinetoTrace(vocabulary=vocabulary)
    for step in range(3):
        at = step * STEP_US
        t.step(step + 1, at, STEP_US)
        t.op("aten::linear", at + 10, 200)
        for k in range(launches):
            t.runtime("cudaLaunchKernel", at + 20 + 10 * k, 5)
        t.runtime("cudaStreamSynchronize", at + 800, 50)
    return t


@pytest.mark.parametrize("vocabulary", ["current", "2021"])
def test_a_gpu_run_without_gpu_events_says_so(tmp_path, vocabulary, capsys):
    path = unrecorded_gpu_trace(launches=4, vocabulary=vocabulary).write(tmp_path / "t.json")
    result = analyze.analyze_trace(path)
    assert result["device"] == "cuda" and result["gpu"] is None
    assert result["gpu_unrecorded_calls"] == 12  # 4 launches a step, 3 steps
    assert len(result["warnings"]) == 1
    assert "12 CUDA runtime calls enqueue GPU work" in result["warnings"][0]
    assert "ProfilerActivity.CUDA" in result["warnings"][0]
    assert analyze.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "device       cuda - the GPU's activity was not recorded (below)" in out
    assert "no GPU activity in the trace" not in out


def test_a_cpu_run_with_only_syncs_is_a_cpu_run(tmp_path):
    """A sync call enqueues nothing: a trace with syncs and no launch or copy call is no GPU run
    the profiler missed (0 launches), and reads as a CPU run."""
    result = analyze.analyze_trace(unrecorded_gpu_trace(launches=0).write(tmp_path / "t.json"))
    assert result["device"] == "cpu" and result["gpu_unrecorded_calls"] == 0
    assert result["warnings"] == []


# --- A sync that ends the step. ------------------------------------------------------------------

def synced_steps(sync_at_end: bool) -> KinetoTrace:
    """Three steps of 1000 µs, each one long kernel (300 µs, launched at +0). With
    `sync_at_end` the host synchronizes right after the launch and then works on its own until
    the next step (the GPU idle from +310 to the next step's kernel at +1010: a gap that outlasts
    the step); else it synchronizes, works 300 µs, launches a second kernel at +600 (running
    +610 .. +900) and the step's gap after the sync lies inside it."""
    t = KinetoTrace()
    t.gpu()
    for step in range(3):
        at = step * STEP_US
        t.step(step + 1, at, STEP_US)
        t.launch(at + 0, 5, at + 10, 300)
        t.runtime("cudaDeviceSynchronize", at + 20, 290)  # returns as the kernel ends (+310)
        if not sync_at_end:
            t.launch(at + 600, 5, at + 610, 290)
    return t


def test_a_sync_that_ends_each_step_reads_host_overhead_not_host_sync(tmp_path):
    result = analyze.analyze_trace(synced_steps(sync_at_end=True).write(tmp_path / "t.json"))
    gpu = result["gpu"]
    # Gaps +310 .. +1010 in steps 1 and 2 (the last one is cut at the window's end, +2310):
    # every gap outlasts its step, so all of the sync idle is the host's work between steps.
    assert sum(gpu["step_end_sync_idle_pct_by_cause"].values()) == pytest.approx(
        gpu["sync_idle_pct"]) and gpu["sync_idle_pct"] > 50
    assert [f["id"] for f in result["findings"]] == ["host_overhead"]
    assert "after the sync that ends each step" in result["findings"][0]["evidence"]


def test_a_sync_inside_the_step_stays_host_syncs(tmp_path):
    result = analyze.analyze_trace(synced_steps(sync_at_end=False).write(tmp_path / "t.json"))
    gpu = result["gpu"]
    assert sum(gpu["step_end_sync_idle_pct_by_cause"].values()) == 0.0
    assert gpu["sync_idle_pct"] > 25  # +310 .. +610 of each step
    assert "host_sync" in [f["id"] for f in result["findings"]]
    assert "host_overhead" not in [f["id"] for f in result["findings"]]


# --- CPU runs read as CPU runs. ------------------------------------------------------------------

def cpu_steps(ops: int, op_us: float, gap_us: float, long_op_us: float) -> KinetoTrace:
    """Three CPU steps of 1000 µs: `ops` operators of op_us each, gap_us apart (nothing open in
    between: Python), then one long operator of long_op_us (arithmetic); the rest of the step
    outside operators too."""
    t = KinetoTrace()
    for step in range(3):
        at = step * STEP_US
        t.step(step + 1, at, STEP_US)
        clock = at
        for _ in range(ops):
            t.op("aten::add", clock, op_us)
            clock += op_us + gap_us
        if long_op_us:
            t.op("aten::mm", clock, long_op_us)
    return t


def cpu_result(tmp_path, **shape) -> dict:
    return analyze.analyze_trace(cpu_steps(**shape).write(tmp_path / "t.json"))


def cpu_ids(result: dict) -> list[str]:
    return [f["id"] for f in result["findings"]]


def test_cpu_metrics_by_hand(tmp_path):
    """100 operators of 2 µs, 3 µs apart, and a 300 µs matmul 3 µs after the last: 200 µs of
    short operators' own time (20 %), 100 short gaps of 3 µs (30 %): calls 50 %, the rule's
    share; 1000 - 200 - 300 = 500 µs outside operators (50 %), of it 200 µs one long gap (20 %:
    Python's own work, under python_between_ops' share; the short gaps are each call's cost)."""
    result = cpu_result(tmp_path, ops=100, op_us=2.0, gap_us=3.0, long_op_us=300.0)
    cpu = result["cpu"]
    assert result["device"] == "cpu" and result["gpu"] is None
    assert cpu["ops_per_step"] == 101
    assert cpu["median_op_self_us"] == pytest.approx(2.0)
    assert cpu["short_op_pct"] == pytest.approx(20.0)
    assert cpu["outside_ops_pct"] == pytest.approx(50.0)
    assert cpu["short_gap_pct"] == pytest.approx(30.0)
    assert cpu["call_pct"] == pytest.approx(50.0) == CPU_CALLS_MIN_PCT
    assert cpu["long_gap_pct"] == pytest.approx(20.0)
    assert cpu["top_ops_ms_per_step"][0] == ("aten::mm", pytest.approx(0.3))
    assert cpu_ids(result) == ["cpu_op_overhead"]


@pytest.mark.parametrize("points, fires", [(-1.0, False), (0.0, True), (1.0, True)])
def test_python_between_ops_from_its_share_on(tmp_path, points, fires):
    """One long operator a step and nothing else: python_between_ops alone, from
    PYTHON_OUTSIDE_OPS_MIN_PCT of the window outside operators (a point below, at, above)."""
    outside_us = (PYTHON_OUTSIDE_OPS_MIN_PCT + points) / 100 * STEP_US
    result = cpu_result(tmp_path, ops=0, op_us=0.0, gap_us=0.0, long_op_us=STEP_US - outside_us)
    assert result["cpu"]["outside_ops_pct"] == pytest.approx(outside_us / STEP_US * 100)
    assert result["cpu"]["long_gap_pct"] == pytest.approx(outside_us / STEP_US * 100)
    assert cpu_ids(result) == (["python_between_ops"] if fires else [])


@pytest.mark.parametrize("points, fires", [(-1.0, False), (0.0, True), (1.0, True)])
def test_cpu_op_overhead_from_its_share_of_calls_on(tmp_path, points, fires):
    """Short operators back to back (no Python between them) holding CPU_CALLS_MIN_PCT of the
    window (a point below, at, above), a long one the rest: cpu_op_overhead alone."""
    calls_pct = CPU_CALLS_MIN_PCT + points
    short_us = calls_pct / 100 * STEP_US
    result = cpu_result(tmp_path, ops=1000, op_us=short_us / 1000, gap_us=0.0,
                        long_op_us=STEP_US - short_us)
    assert result["cpu"]["call_pct"] == pytest.approx(calls_pct)
    assert cpu_ids(result) == (["cpu_op_overhead"] if fires else [])


def test_long_operators_read_no_cpu_verdict(tmp_path):
    """A CPU step of arithmetic (one 1000 µs matmul, nothing outside it)."""
    result = cpu_result(tmp_path, ops=0, op_us=0.0, gap_us=0.0, long_op_us=STEP_US)
    assert result["cpu"]["call_pct"] == pytest.approx(0.0) and cpu_ids(result) == []


CPU_REFERENCE = ROOT / "traces" / "reference" / "cpu"


@pytest.mark.parametrize("demo, bad_verdicts", [
    ("host_roundtrip", ["python_between_ops"]),
    ("llm_decode", ["cpu_op_overhead"]),
    ("tokenizer_bound", ["host_region"]),
])
def test_the_committed_cpu_runs_name_bad_and_leave_fixed_silent(demo, bad_verdicts):
    """The CPU runs the pairs' pictures are drawn from: bad gets the verdict its lesson names,
    fixed none."""
    found = {variant: cpu_ids(analyze.analyze_trace(CPU_REFERENCE / demo / variant))
             for variant in ("bad", "fixed")}
    assert found == {"bad": bad_verdicts, "fixed": []}


# --- Host work in operators while the GPU waits. -------------------------------------------------

def inputs_on_the_host(randn_us: float) -> KinetoTrace:
    """Three steps of 1000 µs: torch.randn on the CPU (aten::randn holding aten::normal_, no GPU
    work enqueued) for randn_us, then a pageable copy to the GPU and one kernel."""
    t = KinetoTrace()
    t.gpu()
    for step in range(3):
        at = step * STEP_US
        t.step(step + 1, at, STEP_US)
        t.op("aten::randn", at, randn_us)
        t.op("aten::normal_", at + 2, randn_us - 4)
        t.op("aten::copy_", at + randn_us + 5, 30)
        t.memcpy(at + randn_us + 10, 10, at + randn_us + 20, 10, kind="HtoD")
        t.launch(at + randn_us + 40, 5, at + randn_us + 50, STEP_US - randn_us - 60)
    return t


def test_inputs_made_on_the_host_are_named_as_the_gpus_idle_cause(tmp_path, capsys):
    path = inputs_on_the_host(randn_us=720.0).write(tmp_path / "t.json")
    result = analyze.analyze_trace(path)
    idle = result["gpu"]["idle_by_cause_pct"]
    # The GPU idles from the previous kernel's end (or the window's start) to the copy at +740;
    # the host runs aten::randn (the outermost operator) for 720 µs of it in every step.
    assert idle["CPU op aten::randn"] == pytest.approx(100 * 3 * 720 / result["window_ms"] / 1000,
                                                       rel=0.01)
    assert "CPU op aten::normal_" not in idle  # inside aten::randn: its time is randn's
    assert [f["id"] for f in result["findings"]] == ["host_work_ops"]
    found = result["findings"][0]
    assert "aten::randn" in found["evidence"] and "on the device" in found["fix"]
    assert analyze.main([str(path)]) == 0
    assert "CPU op aten::randn" in capsys.readouterr().out


@pytest.mark.parametrize("points, fires", [(-1.0, False), (0.0, True), (1.0, True)])
def test_host_work_ops_from_its_share_on(points, fires):
    """At the verdict: the GPU idle that host operators cause, summed over their names, from
    HOST_REGION_MIN_PCT of the window (a point below, at, above)."""
    from common import verdicts
    share = verdicts.HOST_REGION_MIN_PCT + points
    m = {"gpu": {"idle_by_cause_pct": {"launch": 1.0, "CPU op aten::randn": share / 2,
                                       "CPU op aten::cat": share / 2}}}
    found = verdicts.rule_host_work_ops(m)
    assert (found is not None) == fires
    if fires:
        assert "aten::randn" in found["evidence"] and "aten::cat" in found["evidence"]


# --- Initialization withholds the verdicts that read idle time. ----------------------------------

@pytest.mark.parametrize("points, withheld", [(-0.5, False), (0.0, True), (0.5, True)])
def test_initialization_withholds_the_idle_verdicts_from_its_share_on(tmp_path, points, withheld):
    """A host-synced trace (host_sync fires) whose window holds initialization: from
    INIT_WITHHOLD_MIN_PCT of the window on, the finding `initialization` replaces the verdicts
    that read idle time, and names them; below it, they stand."""
    from common import verdicts
    m = analyze.analyze_trace(synced_steps(sync_at_end=False).write(tmp_path / "t.json"))
    assert "host_sync" in cpu_ids(m) and m["initialization"] is None
    del m["findings"]
    m["initialization"] = {"pct": verdicts.INIT_WITHHOLD_MIN_PCT + points, "mostly": False,
                           "evidence": ["operators' first calls: 12.0 ms"], "fix": "profile later"}
    found = [f["id"] for f in verdicts.findings_for(m)]
    if not withheld:
        assert "host_sync" in found and "initialization" not in found
        return
    assert found[0] == "initialization" and "host_sync" not in found
    assert "withheld, as they would read the start-up's idle time: host_sync" in \
        verdicts.findings_for(m)[0]["evidence"]


def test_a_window_mostly_initialization_is_high(tmp_path):
    from common import verdicts
    m = analyze.analyze_trace(synced_steps(sync_at_end=False).write(tmp_path / "t.json"))
    del m["findings"]
    m["initialization"] = {"pct": 80.0, "mostly": True, "evidence": ["compiling: 80.0 ms"],
                           "fix": "profile later"}
    assert verdicts.findings_for(m)[0]["severity"] == "high"


def test_start_up_after_a_step_without_any_is_the_steady_states(tmp_path):
    """A kernel launched for the first time in a late step, slowly, with the GPU idle: the run
    of steps from the first holds no start-up, so it is no initialization."""
    t = KinetoTrace()
    t.gpu()
    for step in range(5):
        at = step * 10 * STEP_US
        t.step(step + 1, at, 10 * STEP_US)
        t.launch(at + 10, 5, at + 20, 9000)
        if step == 3:  # a new kernel's first launch, 3 ms with the GPU idle
            t.launch(at + 9100, 3000, at + 12200, 100, name="void late_kernel<float>()")
    result = analyze.analyze_trace(t.write(tmp_path / "t.json"))
    assert result["initialization"] is None


def test_a_gpu_run_without_gpu_events_gets_no_initialization(tmp_path):
    """Its one long operator is compared with the kernels it launched, which the trace lacks."""
    t = unrecorded_gpu_trace(launches=4)
    t.op("aten::conv2d", 100, 50_000)
    result = analyze.analyze_trace(t.write(tmp_path / "t.json"))
    assert result["device"] == "cuda" and result["initialization"] is None


def test_runtime_calls_inside_a_host_operator_are_not_its_work(tmp_path):
    """A first aten::empty_strided holding a 700 µs runtime call (context creation): the call's
    time is the runtime's, not host work in the operator."""
    t = KinetoTrace()
    t.gpu()
    for step in range(3):
        at = step * STEP_US
        t.step(step + 1, at, STEP_US)
        t.op("aten::empty_strided", at, 720)
        t.runtime("cudaDeviceGetStreamPriorityRange", at + 10, 700)
        t.launch(at + 760, 5, at + 770, 200)
    idle = analyze.analyze_trace(t.write(tmp_path / "t.json"))["gpu"]["idle_by_cause_pct"]
    # Left of the operator: 10 µs before the call and 10 after it, per step.
    assert idle.get("CPU op aten::empty_strided", 0.0) < 100 * 3 * 25 / (3 * STEP_US)


# --- A loop that ends mid-schedule: the profiler's empty trace of the cut cycle. ----------------

def test_steps_without_an_operator_or_gpu_work_give_no_verdict_and_say_so(tmp_path):
    """A step that holds no operator and no GPU work records nothing to judge: no verdicts (the
    CPU rules would read all of it as Python between operators) and a warning; one operator in
    it and the rules read it again."""
    empty = KinetoTrace()
    empty.step(5, 0.0, 32.0)
    result = analyze.analyze_trace(empty.write(tmp_path / "empty.json"))
    assert result["recorded_nothing"] and result["findings"] == []
    assert result["warnings"] == [analyze.RECORDED_NOTHING_WARNING]
    empty.op("aten::add", 2.0, 1.0)
    result = analyze.analyze_trace(empty.write(tmp_path / "one_op.json"))
    assert not result["recorded_nothing"] and result["warnings"] == []
    assert [found["id"] for found in result["findings"]] == ["python_between_ops"]


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")
def test_a_loop_that_ends_mid_schedule_is_read_from_its_full_trace(tmp_path, capsys):
    """torch.profiler with schedule(warmup=1, active=3) over 5 steps writes the cycle's trace and,
    at exit, one of the cut second cycle, whose step holds nothing. The folder's newest trace is
    that one: the analyzer reads the full trace and names both files."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path))) as profiler:
        for _ in range(5):
            model(torch.randn(8, 64)).sum().backward()
            profiler.step()
    full, cut = sorted(tmp_path.iterdir(), key=lambda path: path.stat().st_size, reverse=True)
    os.utime(cut, (full.stat().st_mtime + 1,) * 2)  # written last, as it is: no tie to break
    alone = analyze.analyze_trace(cut)
    assert alone["recorded_nothing"] and alone["findings"] == []
    result = analyze.analyze_trace(tmp_path)
    assert result["trace"] == str(full) and result["steps"] == 3
    assert not result["recorded_nothing"] and result["traces_in_folder"] == 2
    assert full.name in result["warnings"][0] and cut.name in result["warnings"][0]
    assert analyze.main([str(tmp_path)]) == 0
    assert f"read {full.name}, not the folder's newest trace" in capsys.readouterr().out


def loader_steps_trace(last: str, gpu: bool = False) -> KinetoTrace:
    """Three steps of 1000 µs, each a 100 µs DataLoader call, then the model's operator (on a GPU
    one launch whose kernel runs until 1100 µs into the step: the GPU lags), then a 70 µs fourth
    step whose DataLoader call holds its collate (a loop that breaks after fetching) and, with
    `last` "operator", an operator after it."""
    t = KinetoTrace()
    if gpu:
        t.gpu()
    for step in range(3):
        at = step * STEP_US
        t.step(step + 1, at, STEP_US)
        t.dataloader(at, 100)
        if gpu:
            t.op("aten::mm", at + 150, 40)
            t.launch(at + 160, 20, at + 200, 900)
        else:
            t.op("aten::mm", at + 150, 800)
    at = 3 * STEP_US
    t.step(4, at, 70)
    t.dataloader(at, 40)
    t.op("aten::stack", at + 10, 20)
    if last == "operator":
        t.op("aten::add", at + 50, 10)
    return t


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_a_last_step_of_only_dataloader_calls_is_the_loops_end_and_left_out(tmp_path, gpu):
    """The loop's end (its last DataLoader call, in a step of its own) is no step of the model's:
    left out of the steps, with a warning; one operator outside the call keeps the step. On a
    GPU the third step's kernel, still running in the fourth, stays the third's."""
    result = analyze.analyze_trace(loader_steps_trace("loader", gpu).write(tmp_path / "end.json"))
    assert result["steps"] == 3 and not result["recorded_nothing"]
    assert result["warnings"][0].startswith("the last step (0.07 ms) is left out of the steps")
    # On a GPU the window runs on to the third kernel's end, past the loop's end: its DataLoader
    # call, left out with it, is no share of the window.
    assert result["dataloader_pct"] == pytest.approx(100 * 300 / (3 * STEP_US + 100 * gpu))
    if gpu:  # each step extended to its kernel's end (1100 µs in), the next starting there
        assert result["window_ms"] == pytest.approx(3.1)
        assert result["gpu"]["utilization_pct"] == pytest.approx(100 * 3 * 900 / 3100)
    else:
        assert result["step_ms"]["p50"] == pytest.approx(STEP_US / 1000)
    kept = analyze.analyze_trace(loader_steps_trace("operator", gpu).write(tmp_path / "op.json"))
    assert kept["steps"] == 4 and kept["warnings"] == []


def test_a_loader_timed_alone_keeps_its_steps(tmp_path):
    """Steps of DataLoader calls alone (a loop that times the loader, collating in the training
    process): no step of the model's work comes before the last, so it is no loop's end; and one
    such step alone made a batch (its collate), so it records something."""
    t = KinetoTrace()
    for step in range(3):
        t.step(step + 1, step * STEP_US, STEP_US)
        t.dataloader(step * STEP_US, 900)
        t.op("aten::stack", step * STEP_US + 10, 800)
    result = analyze.analyze_trace(t.write(tmp_path / "loader.json"))
    assert result["steps"] == 3 and result["warnings"] == []
    assert "dataloader" in {found["id"] for found in result["findings"]}
    one = KinetoTrace()
    one.step(1, 0.0, STEP_US)
    one.dataloader(0.0, 900)
    one.op("aten::stack", 10, 800)
    alone = analyze.analyze_trace(one.write(tmp_path / "one.json"))
    assert alone["steps"] == 1 and not alone["recorded_nothing"]


def test_a_middle_step_of_only_dataloader_calls_stays(tmp_path):
    """Only the last step can be the loop's end: one in the middle (a loader that gave a batch
    the step skipped) is a step like the others."""
    t = loader_steps_trace("loader")
    t.step(5, 4 * STEP_US, STEP_US)
    t.dataloader(4 * STEP_US, 100)
    t.op("aten::mm", 4 * STEP_US + 150, 800)
    assert analyze.analyze_trace(t.write(tmp_path / "t.json"))["steps"] == 5


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")
@pytest.mark.parametrize("batches", [5, 6])
def test_a_loop_over_a_dataloader_that_ends_mid_schedule_reads_its_steps(tmp_path, capsys,
                                                                         batches):
    """torch.profiler with schedule(warmup=1, active=3) over a DataLoader of 5 or 6 batches: the
    cycle's trace, then at exit a cut one whose last step is the loop's end (the call that found
    the loader empty). Of 6 batches the cut trace holds step 5 and the loop's end: read as one
    step, its own. Of 5 it holds the loop's end alone: no verdicts (they would read its 0.1 ms as
    DataLoader and Python time), and the folder reads the full trace."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    loader = DataLoader(TensorDataset(torch.randn(8 * batches, 64)), batch_size=8)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path))) as profiler:
        for (x,) in loader:
            model(x).sum().backward()
            profiler.step()
    full, cut = sorted(tmp_path.iterdir(), key=lambda path: path.stat().st_size, reverse=True)
    os.utime(cut, (full.stat().st_mtime + 1,) * 2)  # written last, as it is: no tie to break
    alone = analyze.analyze_trace(cut)
    columns = analyze.read_trace(cut)
    assert columns.steps.size == batches - 4  # the cut cycle's steps, the loop's end last
    if batches == 6:
        assert alone["steps"] == 1
        step_ms = float(columns.steps.end[0] - columns.steps.start[0]) / 1000
        assert alone["step_ms"]["p50"] == pytest.approx(step_ms)
        assert alone["warnings"][0].startswith("the last step (")
    else:
        assert alone["recorded_nothing"] and alone["findings"] == []
        assert alone["warnings"] == [analyze.LOOP_END_ALONE_WARNING]
        result = analyze.analyze_trace(tmp_path)
        assert result["trace"] == str(full) and result["steps"] == 3


def test_a_broken_older_trace_in_the_folder_does_not_stop_the_newest(tmp_path, capsys):
    """A killed run's truncated trace beside the newest: the folder reads as its newest trace
    (not as two ranks, one unreadable)."""
    good = unrecorded_gpu_trace(launches=0).write(tmp_path / "new.pt.trace.json")
    broken = tmp_path / "old.pt.trace.json.gz"
    broken.write_bytes(gzip.compress(good.read_bytes())[:200])
    os.utime(broken, (good.stat().st_mtime - 60,) * 2)
    assert analyze.main([str(tmp_path)]) == 0
    assert f"trace        {good}" in capsys.readouterr().out
    assert analyze.main([str(broken)]) == 2  # alone, it is still the one-line error


# --- No schedule: no ProfilerStep#N, the steps the optimizer's calls end. ----------------------

def unscheduled_trace(iterations: int = 3, optimizers: int = 1, micro_batches: int = 1,
                      gpu: bool = False) -> KinetoTrace:
    """A loop recorded under `with profile():` with no schedule, hence no ProfilerStep#N: each
    1000 µs iteration a DataLoader call (0..100 µs, its collate from 10 µs), `micro_batches`
    forward and backward operators, then `optimizers` optimizer steps (the last ending at 900 µs),
    each with its operator, on a GPU each backward with a kernel and a sync; after the loop, its
    end (a DataLoader call at 3000 µs)."""
    t = KinetoTrace()
    if gpu:
        t.gpu()
    for i in range(iterations):
        at = i * STEP_US
        t.dataloader(at, 100)
        t.op("aten::stack", at + 10, 80)
        for k in range(micro_batches):
            begins = at + 100 + k * 600 / micro_batches
            t.op("aten::linear", begins, 100 / micro_batches)
            t.op("autograd::engine::evaluate_function: AddmmBackward0",
                 begins + 200 / micro_batches, 200 / micro_batches)
            if gpu:
                t.launch(begins + 210 / micro_batches, 5, begins + 220 / micro_batches, 50)
                t.runtime("cudaStreamSynchronize", begins + 300 / micro_batches, 10)
        for k in range(optimizers):
            begins = at + 910 - (optimizers - k) * 100  # 10 µs apart
            t.region("Optimizer.step#SGD.step", begins, 90)
            t.op("aten::add_", begins + 10, 70)
    t.dataloader(iterations * STEP_US, 40)
    return t


def test_without_a_schedule_each_optimizer_step_ends_a_step(tmp_path, capsys):
    """Three iterations read as three steps: the first from the trace's start (its first span,
    the first DataLoader call at 0 µs, before any operator) to its optimizer step's end (900 µs),
    each later one from there to its own (1000 µs); the loop's end after the last is in none. Read as one step, every per-step count
    was three times too high."""
    path = unscheduled_trace(gpu=True).write(tmp_path / "t.json")
    result = analyze.analyze_trace(path)
    assert result["steps"] == 3 and result["steps_from"] == "optimizer_step"
    assert not result["steps_named"]
    assert result["window_ms"] == pytest.approx(2.9)
    assert result["step_ms"]["p50"] == pytest.approx(1.0)
    assert result["gpu"]["syncs_per_step"] == pytest.approx(1.0)
    assert result["dataloader_pct"] == pytest.approx(100 * 300 / 2900)  # not the loop's end
    assert analyze.main([str(path)]) == 0
    assert ("steps        3 (no ProfilerStep#N: each ends where an optimizer.step() does)"
            in capsys.readouterr().out)


def test_optimizer_calls_with_no_backward_between_end_one_step(tmp_path):
    """Two optimizers stepped one after the other end one iteration, not two."""
    built = unscheduled_trace(optimizers=2)
    result = analyze.analyze_trace(built.write(tmp_path / "t.json"))
    assert result["steps"] == 3 and result["step_ms"]["p50"] == pytest.approx(1.0)


def test_an_optimizer_whose_backward_runs_inside_its_call_ends_a_step_each_call(tmp_path):
    """LBFGS evaluates its closure (forward and backward) inside optimizer.step(): no backward
    between two calls, one inside each, so each call still ends an iteration."""
    t = KinetoTrace()
    for i in range(3):
        at = i * STEP_US
        t.region("Optimizer.step#LBFGS.step", at + 10, 900)
        t.op("aten::linear", at + 20, 100)
        t.op("autograd::engine::evaluate_function: AddmmBackward0", at + 200, 200)
    result = analyze.analyze_trace(t.write(tmp_path / "t.json"))
    assert result["steps"] == 3 and result["steps_from"] == "optimizer_step"


@pytest.mark.parametrize("iterations", [0, 1])
def test_fewer_than_two_optimizer_steps_leave_the_whole_trace_one_step(tmp_path, iterations):
    """One optimizer step (or none: inference) cuts nothing: the whole trace is the step."""
    built = unscheduled_trace(iterations=max(iterations, 1))
    if not iterations:
        built.events = [event for event in built.events
                        if not event["name"].startswith("Optimizer.step#")]
    result = analyze.analyze_trace(built.write(tmp_path / "t.json"))
    assert result["steps"] == 1 and result["steps_from"] == "whole_trace"
    assert result["window_ms"] == pytest.approx(0.88)  # its operators' extent, as before


def test_a_profile_without_a_schedule_is_read_by_its_optimizer_steps(tmp_path):
    """torch.profiler records no ProfilerStep#N without a schedule, prof.step() or not: three
    iterations of a training loop read as three steps, each ending with its Optimizer.step#."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(3):
            model(torch.randn(8, 64)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            profiler.step()
    path = tmp_path / "t.json"
    profiler.export_chrome_trace(str(path))
    columns = analyze.read_trace(path)
    assert columns.steps.size == 0
    result = analyze.analyze_trace(path)
    assert result["steps"] == 3 and result["steps_from"] == "optimizer_step"
    calls = columns.regions["optimizer"]
    assert calls.size == 3
    first = columns.cpu_extent[0]
    assert result["window_ms"] == pytest.approx((float(calls.end[-1]) - first) / 1000)


def test_a_model_run_on_other_threads_records_nothing_and_the_warning_says_how_to_record_it(
        tmp_path):
    """The profiler's operator callbacks are thread-local: a model served from a thread pool's
    threads under profile() leaves no operator in the trace. The warning names the threads and
    the profiler's option that records them, not a schedule (there is none); with that option
    the same run records its operators, on the pool's threads."""
    torch = pytest.importorskip("torch")
    from concurrent.futures import ThreadPoolExecutor

    from torch.profiler import ProfilerActivity, profile
    model = torch.nn.Linear(64, 64)

    def serve(_):
        with torch.inference_mode():
            return model(torch.randn(8, 64))

    def record(path, **options):
        with profile(activities=[ProfilerActivity.CPU], **options) as profiler:
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(serve, range(4)))
        profiler.export_chrome_trace(str(path))
        return analyze.analyze_trace(path)

    alone = record(tmp_path / "pool.json")
    assert alone["recorded_nothing"] and alone["findings"] == []
    assert alone["warnings"] == [analyze.RECORDED_NOTHING_UNSCHEDULED_WARNING]
    every = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    recorded = record(tmp_path / "all.json", experimental_config=every)
    assert not recorded["recorded_nothing"] and recorded["warnings"] == []
    assert recorded["cpu"]["ops_per_step"] >= 4  # a linear layer's call, 4 times
