"""Why the GPU is idle (gpu.idle_by_cause_pct) and what changed between bad and fixed
(compare's what_changed), on hand-built traces whose answers are worked out below."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from common import analyze, compare, report
from common.intervals import Spans, covered_length
from common.trace_steps import self_time_us
from tests.kineto_builder import BF16_GEMM, ELEMENTWISE, KinetoTrace, write_demo_run

T0 = 1_000_000.0  # µs
WINDOW_US = 1000.0

# One step of 1000 µs (T0 .. T0+1000), by hand (times after T0):
#   DataLoader 0..200, then kernel A launched 200..205, runs 210..400: the gap 0..210 opens the
#     window: 200 µs of DataLoader and 10 µs before the first GPU op.
#   B launched 250..255, runs 400..500 (right after A: no gap).
#   C launched 300..305, runs 520..600: the gap 500..520 is other (C was enqueued at 305, long
#     before the GPU went idle: it starts late for a reason on the GPU's side).
#   cudaStreamSynchronize 310..601 returns in the gap 600..700 (D launched 690..695, runs
#     700..800): 100 µs host_sync.
#   E launched 850..855, runs 860..900: the gap 800..860 is launch until E was enqueued (855),
#     55 µs, and other after it (the GPU's own 5 µs to start E).
#   The tail 900..1000 has no GPU op after it: 100 µs other.
# Busy 190+100+80+100+40 = 510 µs; idle 490 = 200 + 100 + 10 + 55 + 125.
EXPECTED_PCT = {"dataloader": 20.0, "host_sync": 10.0, "before_first_op": 1.0, "launch": 5.5,
                "other": 12.5, "unrecorded": 0.0}


def idle_trace(vocabulary: str = "current", loader_in_sync_gap: bool = False,
               tied_copy: bool = False) -> KinetoTrace:
    t = KinetoTrace(vocabulary=vocabulary)
    t.gpu()
    t.step(1, T0, WINDOW_US)
    t.dataloader(T0, 200)
    t.launch(T0 + 200, 5, T0 + 210, 190)
    t.launch(T0 + 250, 5, T0 + 400, 100)
    t.launch(T0 + 300, 5, T0 + 520, 80)
    t.runtime("cudaStreamSynchronize", T0 + 310, 291)
    if tied_copy:  # a copy enqueued at 510, after the gap began, starting with C at 520
        t.memcpy(T0 + 505, 5, T0 + 520, 10)
    t.launch(T0 + 690, 5, T0 + 700, 100)
    t.launch(T0 + 850, 5, T0 + 860, 40)
    if loader_in_sync_gap:  # 60 µs of the sync's gap go to the DataLoader, which comes first
        t.dataloader(T0 + 620, 60)
    return t


@pytest.mark.parametrize("vocabulary", ["2021", "current", "tensorboard"])
def test_idle_by_cause_by_hand(tmp_path, vocabulary):
    gpu = analyze.analyze_trace(idle_trace(vocabulary).write(tmp_path / "t.json"))["gpu"]
    assert gpu["idle_by_cause_pct"] == pytest.approx(EXPECTED_PCT, abs=1e-9)
    assert gpu["utilization_pct"] == pytest.approx(51.0)  # the causes and the busy time: 100 %
    assert gpu["sync_idle_pct"] == pytest.approx(10.0)  # the same gap, counted the same way


def test_dataloader_comes_before_the_sync_in_its_gap(tmp_path):
    gpu = analyze.analyze_trace(idle_trace(loader_in_sync_gap=True).write(tmp_path / "t.json"))
    assert gpu["gpu"]["idle_by_cause_pct"] == pytest.approx(
        {**EXPECTED_PCT, "dataloader": 26.0, "host_sync": 4.0}, abs=1e-9)


def test_of_ops_that_start_together_the_first_enqueued_decides(tmp_path):
    """C (enqueued at 305) and a copy enqueued at 510 both open the busy time at 520: the GPU
    had C long before the gap began, so the gap stays other."""
    gpu = analyze.analyze_trace(idle_trace(tied_copy=True).write(tmp_path / "t.json"))["gpu"]
    assert gpu["idle_by_cause_pct"] == pytest.approx(EXPECTED_PCT, abs=1e-9)


def test_a_graph_replay_without_steps_is_not_charged_to_launches(tmp_path):
    """A serving trace without ProfilerStep (the window is the CPU operators' extent, 0..1000)
    replaying a CUDA graph: the host sets up for 400 µs, then one cudaGraphLaunch (400..700, the
    call returns late) enqueues three kernels (correlation shared) that run 450..500, 550..600
    and 650..700, waiting on each other inside the graph. By hand: 0..450 is before the first
    GPU op (45 %); the gaps 500..550 and 600..650 come after the graph's first kernel started,
    so the graph was enqueued by then: other (10 %); the tail 700..1000 other (30 %); no launch."""
    t = KinetoTrace()
    t.gpu()
    t.op("vllm::forward", T0, 1000)
    correlation = t.runtime("cudaGraphLaunch", T0 + 400, 300)
    for start in (450, 550, 650):
        t.gpu_event("kernel", BF16_GEMM, T0 + start, 50, correlation, T0 + 400)
    gpu = analyze.analyze_trace(t.write(tmp_path / "t.json"))["gpu"]
    assert gpu["idle_by_cause_pct"] == pytest.approx(
        {"dataloader": 0.0, "host_sync": 0.0, "before_first_op": 45.0, "launch": 0.0,
         "other": 40.0, "unrecorded": 0.0}, abs=1e-9)


def test_a_gap_is_the_launchs_only_until_its_op_is_enqueued(tmp_path):
    """One step 0..1000: kernel A launched 0..5 runs 10..100; B's launch call 100..300 returns
    at 300 and B runs 400..500 (the GPU's own delay after it); the tail is other. By hand: before
    the first op 10 µs; the gap 100..400 is launch until 300 (20 %), other after (10 %)."""
    t = KinetoTrace()
    t.gpu()
    t.step(1, T0, WINDOW_US)
    t.launch(T0, 5, T0 + 10, 90)
    t.launch(T0 + 100, 200, T0 + 400, 100)
    gpu = analyze.analyze_trace(t.write(tmp_path / "t.json"))["gpu"]
    assert gpu["idle_by_cause_pct"] == pytest.approx(
        {"dataloader": 0.0, "host_sync": 0.0, "before_first_op": 1.0, "launch": 20.0,
         "other": 10.0 + 50.0, "unrecorded": 0.0}, abs=1e-9)


def backlog_trace(queued_correlation: int) -> KinetoTrace:
    """One step 0..1000. A side stream's copy kernel, launched at 1, runs 2..10. The main stream
    runs kernel Q at 300..500, whose launch call is not in the trace, then the step's kernel,
    launched at 50..55, at 500..900. The builder's ids start at 1000, as a real trace's count
    every API call since the process began."""
    t = KinetoTrace()
    t.gpu()
    t.step(1, T0, WINDOW_US)
    t.stream = 8
    t.launch(T0 + 1, 0.5, T0 + 2, 8)
    t.stream = 7
    t.gpu_event("kernel", BF16_GEMM, T0 + 300, 200, correlation=queued_correlation,
                launch_ts=T0 - 400)
    t.launch(T0 + 50, 5, T0 + 500, 400, name=BF16_GEMM)
    return t


def test_work_launched_before_the_recording_is_not_idle(tmp_path, capsys):
    """Q's id (900) is below the trace's first call's (1000): it was launched before the
    recording, and the main stream held it from the window's start, running what the trace lacks
    (the step before's backward, on a GPU-bound loop ahead of its host). By hand: the GPU is busy
    8 + 200 + 400 = 608 µs; 0..300 less the copy's 8 µs is unrecorded (29.2 %); the tail
    900..1000 other (10 %). Utilization 60.8 % of the window, 608 / 708 = 85.9 % of the time the
    trace accounts for, and that is the one the small-batch rule reads."""
    gpu = analyze.analyze_trace(backlog_trace(900).write(tmp_path / "t.json"))["gpu"]
    assert gpu["idle_by_cause_pct"] == pytest.approx(
        {"dataloader": 0.0, "host_sync": 0.0, "before_first_op": 0.0, "launch": 0.0,
         "other": 10.0, "unrecorded": 29.2}, abs=1e-9)
    assert gpu["utilization_pct"] == pytest.approx(60.8)
    assert gpu["recorded_utilization_pct"] == pytest.approx(100 * 608 / 708)
    assert analyze.main([str(tmp_path / "t.json")]) == 0
    assert ("utilization 60.8 % of the steps (compute kernels 60.8 %, collectives with no compute "
            "beside them 0.0 %, copies and memsets alone 0.0 %), H2D copies 0.0 %; 85.9 % of the time the trace accounts for (for "
            "29.2 % of the steps the GPU ran work launched before the recording)"
            ) in capsys.readouterr().out


def test_a_kernel_without_its_launch_inside_the_recording_is_no_backlog(tmp_path, capsys):
    """The same trace with Q's id (2000) above the first call's: launched during the recording
    from somewhere the trace does not show, not before it, so nothing says its stream was busy.
    By hand: 0..2 before the first GPU op (0.2 %), 10..300 and the tail other (29 + 10 %)."""
    gpu = analyze.analyze_trace(backlog_trace(2000).write(tmp_path / "t.json"))["gpu"]
    assert gpu["idle_by_cause_pct"] == pytest.approx(
        {"dataloader": 0.0, "host_sync": 0.0, "before_first_op": 0.2, "launch": 0.0,
         "other": 39.0, "unrecorded": 0.0}, abs=1e-9)
    assert gpu["recorded_utilization_pct"] == gpu["utilization_pct"] == pytest.approx(60.8)
    assert analyze.main([str(tmp_path / "t.json")]) == 0
    assert "time the trace accounts for" not in capsys.readouterr().out


def test_idle_by_cause_in_the_human_output(tmp_path, capsys):
    assert analyze.main([str(idle_trace().write(tmp_path / "t.json"))]) == 0
    out = capsys.readouterr().out
    assert ("GPU idle     49.0 % of the steps: DataLoader 20.0, host syncs 10.0, before the first "
            "GPU op 1.0, launches 5.5, other 12.5 (HTA's idle, from the first to the last GPU op "
            "of the trace: 26.1 %)") in out  # 1 - 510 busy / (900 - 210) µs


def test_covered_length_of_ranges_by_hand():
    merged = Spans(np.array([10.0, 40.0]), np.array([20.0, 70.0]))  # sorted, disjoint
    start = np.array([0, 0, 15, 20, 25, 45, 80, 0], float)
    end = np.array([5, 100, 45, 40, 30, 60, 90, 10], float)
    assert covered_length(merged, start, end).tolist() == [0, 40, 10, 0, 0, 15, 0, 0]
    assert covered_length(Spans.empty(), start, end).tolist() == [0] * 8


def test_self_time_takes_off_direct_children_per_thread():
    # thread 1: a 0..100 holds b 10..60 (which holds c 20..30) and d 70..90; e 95..120 overlaps
    # a's end (malformed): not its child. Thread 2: f 10..50 inside a's time, but its own.
    start = np.array([0, 10, 20, 70, 95, 10], float)
    end = np.array([100, 60, 30, 90, 120, 50], float)
    thread = np.array([1, 1, 1, 1, 1, 2])
    assert self_time_us(Spans(start, end), thread).tolist() == [
        100 - 50 - 20, 50 - 10, 10, 20, 25, 40]


def changed_trace(steps: int, gemm_us: float, item: bool) -> KinetoTrace:
    """Each 1000 µs step: aten::linear 0..100 holding aten::addmm 10..90 (self 20 and 80 µs), a
    GEMM kernel of gemm_us and an elementwise kernel of 10 µs, and, with `item`, aten::item
    200..260 (60 µs)."""
    t = KinetoTrace()
    t.gpu()
    for index in range(steps):
        at = T0 + index * 1000
        t.op("aten::linear", at, 100)
        t.op("aten::addmm", at + 10, 80)
        t.launch(at + 20, 5, at + 30, gemm_us, name=BF16_GEMM)
        t.launch(at + 40, 5, at + 30 + gemm_us, 10, name=ELEMENTWISE)
        if item:
            t.op("aten::item", at + 200, 60)
        t.step(index + 1, at, 1000)
    return t


@pytest.fixture
def changed_pair(tmp_path):
    """bad: 2 steps, a 400 µs GEMM and an .item() per step; fixed: 3 steps, a 100 µs GEMM."""
    write_demo_run(tmp_path, "item_sync", "bad", changed_trace(2, 400, item=True),
                   samples_per_s=100.0, peak_memory_mb=10.0)
    write_demo_run(tmp_path, "item_sync", "fixed", changed_trace(3, 100, item=False),
                   samples_per_s=150.0, peak_memory_mb=10.0)
    return tmp_path / "item_sync"


def test_what_changed_per_step_by_hand(changed_pair, capsys):
    assert compare.main([str(changed_pair), "--json"]) == 0
    changed = json.loads(capsys.readouterr().out)["what_changed"]
    # Per step: aten::item 0.06 ms -> gone; linear (self 0.02) and addmm (0.08) unchanged, in
    # name order after it. The GEMM 0.4 -> 0.1 ms; the elementwise kernel unchanged.
    assert changed["operators"] == [
        {"name": "aten::item", "bad_ms_per_step": pytest.approx(0.06),
         "fixed_ms_per_step": 0.0, "bad_calls_per_step": 1.0, "fixed_calls_per_step": 0.0},
        {"name": "aten::addmm", "bad_ms_per_step": pytest.approx(0.08),
         "fixed_ms_per_step": pytest.approx(0.08), "bad_calls_per_step": 1.0,
         "fixed_calls_per_step": 1.0},
        {"name": "aten::linear", "bad_ms_per_step": pytest.approx(0.02),
         "fixed_ms_per_step": pytest.approx(0.02), "bad_calls_per_step": 1.0,
         "fixed_calls_per_step": 1.0}]
    assert [(row["name"], row["bad_ms_per_step"], row["fixed_ms_per_step"])
            for row in changed["kernels"]] == [
        (BF16_GEMM, pytest.approx(0.4), pytest.approx(0.1)),
        (ELEMENTWISE, pytest.approx(0.01), pytest.approx(0.01))]


def test_what_changed_in_text_and_report(changed_pair, capsys):
    assert compare.main([str(changed_pair)]) == 0
    out = capsys.readouterr().out
    assert "what changed most (time per step)" in out
    assert any(line.split()[:5] == ["operator", "aten::item", "0.06", "0.00", "1.0"]
               for line in out.splitlines())
    assert compare.short_name(BF16_GEMM) in out and BF16_GEMM not in out  # long names cut
    markdown, page = report.write_report(changed_pair.parent, ["item_sync"])
    text = markdown.read_text()
    assert "| operator | `aten::item` | 0.06 | 0.00 | 1.0 -> 0.0 |" in text
    assert "GPU busy and idle by cause" in text or "Why the GPU is idle" in text
    assert "<code>aten::item</code>" in page.read_text()


SIDE_COPY = "void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>"


def queued_trace(backlog: bool, nccl: bool = False) -> KinetoTrace:
    """changed_trace's 2 steps (a bf16 GEMM of 400 µs), no .item(), and a copy kernel on a side
    stream at the start of each step (launched at +1 µs, run at +2..+5). With `backlog`, the GPU
    opens the window still running the step before the recording on the main stream: a GEMM and
    an elementwise kernel at +5..+25 whose launches the trace does not hold (the profiler's
    warm-up dropped them). With `nccl`, a kernel with no launch in the trace on a stream of its
    own, mid-step, once a step."""
    t = changed_trace(2, 400, item=False)
    main_stream = t.stream
    t.stream = 8
    for index in range(2):
        at = T0 + index * 1000
        t.launch(at + 1, 0.5, at + 2, 3, name=SIDE_COPY)
    t.stream = main_stream
    if backlog:
        t.gpu_event("kernel", BF16_GEMM, T0 + 5, 15, correlation=500, launch_ts=T0 - 500)
        t.gpu_event("kernel", ELEMENTWISE, T0 + 20, 5, correlation=501, launch_ts=T0 - 490)
    if nccl:
        t.stream = 21
        for index in range(2):  # mid-step, on a stream the steps launched nothing on
            t.gpu_event("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                        T0 + index * 1000 + 500, 5, correlation=20_000 + index, launch_ts=T0)
    return t


def test_kernels_left_from_before_the_recording_are_not_the_steps(tmp_path, capsys):
    """The same two steps, once with the GPU's backlog from before the recording in the window:
    the kernels the steps launched are the same, so nothing changed (counted by the window, the
    GEMM read 1.5 calls a step against 1.0). A kernel with no launch in the trace on a stream the
    steps launched nothing on (NCCL from an untraced thread) still counts, in both."""
    write_demo_run(tmp_path, "item_sync", "bad", queued_trace(backlog=False, nccl=True),
                   samples_per_s=100.0, peak_memory_mb=10.0)
    write_demo_run(tmp_path, "item_sync", "fixed", queued_trace(backlog=True, nccl=True),
                   samples_per_s=100.0, peak_memory_mb=10.0)
    assert compare.main([str(tmp_path / "item_sync"), "--json"]) == 0
    kernels = {row["name"]: row for row in json.loads(capsys.readouterr().out)
               ["what_changed"]["kernels"]}
    for name, ms, calls in ((BF16_GEMM, 0.4, 1.0), (ELEMENTWISE, 0.01, 1.0),
                            (SIDE_COPY, 0.003, 1.0),
                            ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0.005, 1.0)):
        row = kernels[name]
        assert (row["bad_ms_per_step"], row["fixed_ms_per_step"]) == (
            pytest.approx(ms), pytest.approx(ms)), name
        assert row["bad_calls_per_step"] == row["fixed_calls_per_step"] == calls, name


def test_compiling_changes_apart_from_the_operators(tmp_path, capsys):
    """A compiled step's first run against a warm one. The cold first step compiles on its
    thread: Dynamo's `dynamo` range (500 µs) holds `inductor_compile` (300 µs, unmarked, as
    torch 2.14 writes it), which holds the fake-tensor aten::mm it traces (100 µs). What changed
    lists them under their own kind by self time (200, 200 and 100 µs over 2 steps), none as an
    operator: the CPU line counts none of them either."""
    def compiled_steps(cold: bool) -> KinetoTrace:
        t = KinetoTrace()
        for index in range(2):
            at = T0 + index * 1000
            t.step(index + 1, at, 1000)
            t.op("aten::addmm", at + 10, 80)
            if cold and index == 0:
                t.op("dynamo", at + 100, 500)
                t.op("inductor_compile", at + 150, 300)
                t.op("aten::mm", at + 200, 100)
        return t
    cold, warm = (compiled_steps(cold).write(tmp_path / f"{name}.json")
                  for cold, name in ((True, "cold"), (False, "warm")))
    assert compare.main([str(cold), str(warm), "--json"]) == 0
    changed = json.loads(capsys.readouterr().out)["what_changed"]
    assert [row["name"] for row in changed["operators"]] == ["aten::addmm"]
    assert [(row["name"], row["before_ms_per_step"], row["after_ms_per_step"])
            for row in changed["compiling"]] == [("dynamo", pytest.approx(0.1), 0.0),
                                                 ("inductor_compile", pytest.approx(0.1), 0.0),
                                                 ("aten::mm", pytest.approx(0.05), 0.0)]
    assert compare.main([str(cold), str(warm)]) == 0
    assert re.search(r"^  compiling +inductor_compile +0\.10 +0\.00", capsys.readouterr().out,
                     re.MULTILINE)
