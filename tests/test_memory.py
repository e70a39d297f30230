"""Memory over the recorded steps (common/memory.py) and the memory_growth verdict: hand-built
traces pin each definition to a known answer (allocated at step ends, the growth fit, kept
memory, the outermost operator, the peak and its parts, reserved memory); a real profiler trace
of a leaking loop; and silence on every real trace the project holds but the leak pair's bad run."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from common import analyze, memory, trace, verdicts
from tests.conftest import ROOT
from tests.kineto_builder import H100_MEMORY_BYTES, MB, KinetoTrace

STEP_US = 1000.0
START_US = 1_000_000.0
CPU, CUDA = 0, 1  # "Device Type" (c10::DeviceType)
# The breakdown's parts add up to the peak: the same bytes summed in another order, in MB.
SUM_TOLERANCE_MB = 1e-9


class Allocator:
    """Writes [memory] events as torch's allocators do: each allocation or free with the running
    totals after it (in time order, whatever the order of the calls: write() computes them); an
    address per block."""

    def __init__(self, built: KinetoTrace, device_type: int = CPU, reserved_mb: float = 0.0):
        self.built, self.device_type, self.reserved = built, device_type, reserved_mb * MB
        self.changes, self.size, self.next_addr = [], {}, 0x7F0000000000

    def alloc(self, ts: float, mb: float, tid=None, addr: int | None = None) -> int:
        if addr is None:
            addr, self.next_addr = self.next_addr, self.next_addr + 0x100000
        self.size[addr] = int(mb * MB)
        self.changes.append((ts, self.size[addr], addr, tid))
        return addr

    def free(self, ts: float, addr: int, tid=None) -> None:
        self.changes.append((ts, -self.size[addr], addr, tid))

    def write(self) -> KinetoTrace:
        total = 0
        for ts, nbytes, addr, tid in sorted(self.changes, key=lambda change: change[0]):
            total += nbytes
            self.built.events.append({
                "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                "pid": self.built.cpu_pid, "tid": self.built.cpu_pid if tid is None else tid,
                "ts": ts, "args": {"Total Reserved": self.reserved, "Total Allocated": total,
                                   "Bytes": nbytes, "Device Id": 0 if self.device_type else -1,
                                   "Device Type": self.device_type, "Addr": addr}})
        self.changes = []
        return self.built


# The loop below, per step (µs from the step's start): forward [10, 400] runs aten::linear
# [20, 100] (aten::empty [30, 40] inside it), which allocates an activation at 35 (freed at 700)
# and an output at 36 (freed at 950, after the optimizer, unless the loop keeps it); backward
# [400, 800] runs autograd's evaluate_function [450, 600], allocating a gradient at 500 (freed at
# 850); optimizer [800, 900] runs aten::add_ [810, 890], a temporary at 820 (freed at 880). Before
# the steps, the parameters. The peak is at 500 of the last step.
BASE_MB, ACTIVATION_MB, OUTPUT_MB, GRADIENT_MB, TEMP_MB = 100.0, 30.0, 4.0, 20.0, 5.0


def loop_trace(steps: int = 6, *, keep: bool = True, device_type: int = CPU,
               regions: bool = True, jump: tuple[int, float] | None = None,
               reserved_mb: float = 0.0, vocabulary: str = "current") -> Allocator:
    """The loop's trace and its allocator (write() it). `keep`: the loop appends each step's
    output to a list (a leak of OUTPUT_MB a step). `jump`: (step index, MB) one block allocated
    in that step and kept. `device_type` CUDA: a GPU run (an H100 in deviceProperties, a kernel a
    step)."""
    built = KinetoTrace(vocabulary=vocabulary)
    memory_of = Allocator(built, device_type, reserved_mb)
    if device_type == CUDA:
        built.gpu()
    memory_of.alloc(START_US - 500, BASE_MB)
    for index in range(steps):
        t0 = START_US + index * STEP_US
        built.step(index + 1, t0, STEP_US)
        if device_type == CUDA:
            built.launch(t0 + 50, 5, t0 + 60, 100)
        if regions:
            built.region("forward", t0 + 10, 390)
            built.region("backward", t0 + 400, 400)
            built.region("optimizer", t0 + 800, 100)
        built.op("aten::linear", t0 + 20, 80)
        built.op("aten::empty", t0 + 30, 10)
        activation = memory_of.alloc(t0 + 35, ACTIVATION_MB)
        output = memory_of.alloc(t0 + 36, OUTPUT_MB)
        built.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 450, 150)
        gradient = memory_of.alloc(t0 + 500, GRADIENT_MB)
        memory_of.free(t0 + 700, activation)
        built.op("aten::add_", t0 + 810, 80)
        temp = memory_of.alloc(t0 + 820, TEMP_MB)
        memory_of.free(t0 + 850, gradient)
        memory_of.free(t0 + 880, temp)
        if jump and jump[0] == index:
            memory_of.alloc(t0 + 910, jump[1])  # outside every operator
        if not keep:
            memory_of.free(t0 + 950, output)
    return memory_of


def loop(**options) -> KinetoTrace:
    return loop_trace(**options).write()


def analysed(tmp_path: Path, built: KinetoTrace, name: str = "t") -> dict:
    return analyze.analyze_trace(built.write(tmp_path / f"{name}.pt.trace.json"))


def finding(result: dict, rule_id: str) -> dict | None:
    return next((f for f in result["findings"] if f["id"] == rule_id), None)


@pytest.fixture(scope="module")
def leak(tmp_path_factory) -> dict:
    return analysed(tmp_path_factory.mktemp("leak"), loop())


def test_a_linear_leak_reads_as_its_mb_a_step(leak):
    found = leak["memory"]
    assert found["steps_read"] == 6
    assert found["allocated_mb_at_step_end"] == pytest.approx(
        [BASE_MB + OUTPUT_MB * (k + 1) for k in range(6)])
    assert found["growth_mb_per_step"] == pytest.approx(OUTPUT_MB)
    assert found["growth_fit_r2"] == 1.0
    assert found["kept_mb_per_step"] == pytest.approx(OUTPUT_MB)
    assert found["kept_by_operator"] == [
        {"operator": "aten::linear", "mb_per_step": pytest.approx(OUTPUT_MB),
         "allocations_per_step": 1.0}]
    assert found["reserved_mb_at_step_end"] is None  # a CPU: no caching allocator
    assert [op["operator"] for op in found["allocating_operators"]] == [
        "aten::linear", "autograd::engine::evaluate_function: AddmmBackward0", "aten::add_"]
    assert found["allocating_operators"][0]["mb_per_step"] == pytest.approx(
        ACTIVATION_MB + OUTPUT_MB)


def test_the_leak_fires_with_its_numbers(leak):
    found = finding(leak, "memory_growth")
    peak = BASE_MB + ACTIVATION_MB + OUTPUT_MB * 6 + GRADIENT_MB
    full_in = (verdicts.MEMORY_ASSUMED_CAPACITY_MB - BASE_MB - 6 * OUTPUT_MB) / OUTPUT_MB
    assert found["demo"] == "memory_leak" and found["severity"] == "high"
    for said in (f"{OUTPUT_MB:,.2f} MB a step", f"{100 * OUTPUT_MB / peak:.1f} % of the steps' "
                 f"peak {peak:,.1f} MB", "6 recorded steps", "R^2 1.00",
                 f"in {full_in:,.0f} steps", "(assumed", "aten::linear (4.00 MB"):
        assert said in found["evidence"], said
    assert "loss.detach()" in found["fix"] and ".argmax" in found["fix"]


def test_the_peak_is_read_in_the_steps_and_split_by_where_it_was_allocated(leak):
    found = leak["memory"]
    peak = BASE_MB + OUTPUT_MB * 5 + ACTIVATION_MB + OUTPUT_MB + GRADIENT_MB
    assert found["steps_peak_allocated_mb"] == pytest.approx(peak) == leak["peak_memory_mb"]
    assert found["steps_peak_step"] == 5
    parts = found["peak_breakdown_mb"]
    assert found["peak_phases_from"] == "regions"
    assert parts == pytest.approx({"before_steps": BASE_MB, "kept": OUTPUT_MB * 5,
                                   "forward": ACTIVATION_MB + OUTPUT_MB, "backward": GRADIENT_MB,
                                   "optimizer": 0.0, "other": 0.0})
    assert abs(sum(parts.values()) - peak) <= SUM_TOLERANCE_MB


def test_the_human_output_has_three_memory_lines(leak):
    lines = [line for line in analyze.format_human(leak).splitlines()
             if line.startswith("memory")]
    assert lines[0] == ("memory       allocated at step ends 104.0 -> 124.0 MB (6 steps), "
                        "+4.00 MB/step (R^2 1.00); kept 4.00 MB/step, by aten::linear 4.00")
    assert lines[1].startswith("memory peak  174.0 MB allocated in the steps (step 6): before "
                               "the steps 100.0, kept from earlier steps 20.0, its step's "
                               "forward 34.0, backward 20.0")
    # the operators that allocate most a step, by MB (allocating_operators), largest first
    assert lines[2].startswith("memory ops   allocating most: ")
    shown = [float(mb) for mb in re.findall(r" (\d+\.\d+) MB/step", lines[2])]
    assert shown == sorted(shown, reverse=True) and len(shown) == len(
        leak["memory"]["allocating_operators"])
    assert len(lines) == 3
    json.dumps(leak)  # the --json output holds it as it is


def test_a_flat_loop_is_silent(tmp_path):
    result = analysed(tmp_path, loop(keep=False))
    found = result["memory"]
    assert found["allocated_mb_at_step_end"] == [BASE_MB] * 6
    assert found["growth_mb_per_step"] == 0.0 and found["growth_fit_r2"] == 1.0
    assert found["kept_mb_per_step"] == 0.0 and found["kept_by_operator"] == []
    assert finding(result, "memory_growth") is None


def test_a_one_off_jump_is_no_leak(tmp_path):
    """In the first step: the steps' ends are flat (what it kept shows as kept memory only). In
    the second: a step function, whose line fits R^2 3/(n+1) over n steps."""
    jump_mb = 50.0
    first = analysed(tmp_path, loop(keep=False, jump=(0, jump_mb)), "first")
    assert first["memory"]["growth_mb_per_step"] == 0.0
    assert first["memory"]["kept_mb_per_step"] == pytest.approx(jump_mb / 5)
    assert first["memory"]["kept_by_operator"][0]["operator"] == memory.NO_OPERATOR
    second = analysed(tmp_path, loop(keep=False, jump=(1, jump_mb)), "second")
    assert second["memory"]["growth_fit_r2"] == pytest.approx(3 / 7)
    assert second["memory"]["growth_mb_per_step"] == pytest.approx(jump_mb / 7)
    for result in (first, second):
        assert finding(result, "memory_growth") is None


def test_too_few_steps_give_no_fit(tmp_path):
    result = analysed(tmp_path, loop(steps=memory.GROWTH_FIT_MIN_STEPS - 1))
    assert result["memory"]["growth_mb_per_step"] is None
    assert result["memory"]["growth_fit_r2"] is None
    assert result["memory"]["kept_mb_per_step"] == pytest.approx(OUTPUT_MB)
    assert "no growth fit (it needs 5 recorded steps)" in analyze.format_human(result)
    assert finding(result, "memory_growth") is None
    one = analysed(tmp_path, loop(steps=1), "one")["memory"]
    assert one["kept_mb_per_step"] is None and one["kept_by_operator"] == []


def test_a_trace_without_memory_events_has_none(tmp_path):
    built = KinetoTrace()
    built.step(1, START_US, STEP_US)
    built.op("aten::mm", START_US + 10, 100)
    result = analysed(tmp_path, built)
    assert result["memory"] is None
    text = analyze.format_human(result)
    assert not any(line.startswith("memory") for line in text.splitlines())
    # the peak line says why it has no number (not "n/a"), and, on a GPU, the device's memory
    assert ("peak memory  not in the trace (no [memory] events: profile_memory=True records them)"
            "\n") in text
    built.gpu()
    built.launch(START_US + 50, 5, START_US + 60, 100)
    on_gpu = analyze.format_human(analysed(tmp_path, built, "gpu"))
    assert (f"records them); the device has {H100_MEMORY_BYTES / MB:.0f} MB\n") in on_gpu


def test_freed_blocks_are_not_kept_and_a_reused_address_means_a_free(tmp_path):
    """The output freed in its step is not kept; an address allocated again without a free event
    between (the block reused) was freed."""
    memory_of = loop_trace(keep=False)
    reused = memory_of.alloc(START_US + 2 * STEP_US + 960, 7.0)
    memory_of.alloc(START_US + 3 * STEP_US + 960, 7.0, addr=reused)
    found = analysed(tmp_path, memory_of.write())["memory"]
    # only the second block, of step 4 (of the five that can keep), is never freed
    assert found["kept_mb_per_step"] == pytest.approx(7.0 / 5)


def test_the_outermost_operator_on_the_allocating_thread_is_the_source(tmp_path):
    """aten::linear holds the allocation, not the aten::empty inside it, nor an operator open at
    that time on another thread; the harness's regions written as operators (2021) are none."""
    built = loop(steps=2)
    built.op("aten::mm", START_US, 2 * STEP_US, tid=99)  # another thread, open throughout
    found = analysed(tmp_path, built)["memory"]
    assert found["kept_by_operator"][0]["operator"] == "aten::linear"
    old = analysed(tmp_path, loop(steps=2, vocabulary="2021"), "old")["memory"]
    assert old["kept_by_operator"][0]["operator"] == "aten::linear"
    assert old["peak_phases_from"] == "regions"


def test_an_allocation_on_a_thread_without_operators_has_none(tmp_path):
    """A block allocated, and kept, on a thread that runs no operator (a pinning thread's, say):
    its operator is none, not another thread's and not an error."""
    memory_of = loop_trace(steps=3, keep=False)
    memory_of.alloc(START_US + STEP_US + 500, 3.0, tid=55)  # in step 2, never freed
    found = analysed(tmp_path, memory_of.write())["memory"]
    [kept] = found["kept_by_operator"]
    # per step of the two that can keep (all but the last)
    assert kept["operator"] == memory.NO_OPERATOR and kept["mb_per_step"] == pytest.approx(3.0 / 2)


def test_shared_memory_blocks_outside_the_total_count_in_no_part(tmp_path):
    """A DataLoader worker's batch arrives in shared memory, whose allocator (ATen's MapAllocator)
    writes its [memory] events with Total Allocated 0: read as the others, each pulled the curve
    to 0 and its bytes into the step's parts but not into the total, so "before the steps" went
    below what was there. Left out, the parts add up to the peak as before."""
    memory_of = loop_trace(steps=3, keep=False)
    built = memory_of.write()
    batch = int(2.0 * MB)
    for index in range(3):
        t0 = START_US + index * STEP_US
        for at, nbytes, reserved in ((t0 + 5, batch, batch), (t0 + 950, -batch, 0)):
            built.events.append({
                "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                "pid": built.cpu_pid, "tid": built.cpu_pid, "ts": at,
                "args": {"Total Reserved": reserved, "Total Allocated": 0, "Bytes": nbytes,
                         "Device Id": -1, "Device Type": CPU, "Addr": 0x7F0000000000}})
    path = built.write(tmp_path / "shared.json")
    analysis = analyze.analyze(path)
    found = analysis.result["memory"]
    assert found["peak_breakdown_mb"]["before_steps"] == pytest.approx(BASE_MB)
    parts = sum(value or 0.0 for value in found["peak_breakdown_mb"].values())
    assert parts == pytest.approx(found["steps_peak_allocated_mb"])
    assert analysis.memory_mb.min() >= BASE_MB  # never the shared block's 0
    assert analysis.memory_mb.size == len(
        [e for e in built.events if e.get("name") == "[memory]"]) - 6


def test_without_regions_phases_come_from_autograd_and_torch_optim(tmp_path):
    """No forward/backward regions: backward is autograd's operators and its own thread, the
    optimizer torch.optim's spans (step and zero_grad), forward null (it reads as other)."""
    memory_of = loop_trace(steps=1, keep=False, regions=False)
    built, t0 = memory_of.built, START_US
    built.region("Optimizer.zero_grad#SGD.zero_grad", t0 + 300, 20)
    zero_grad = memory_of.alloc(t0 + 310, 1.0)
    built.op("autograd::engine::evaluate_function: MulBackward0", t0 + 400, 200, tid=77)
    on_autograd_thread = memory_of.alloc(t0 + 420, 2.0, tid=77)
    memory_of.free(t0 + 990, zero_grad)
    memory_of.free(t0 + 990, on_autograd_thread, tid=77)
    found = analysed(tmp_path, memory_of.write())["memory"]
    assert found["peak_phases_from"] == "operators"
    assert found["peak_breakdown_mb"] == pytest.approx({
        "before_steps": BASE_MB, "kept": 0.0, "forward": None,
        "backward": GRADIENT_MB + 2.0, "optimizer": 1.0, "other": ACTIVATION_MB + OUTPUT_MB})
    assert "forward" not in analyze.memory_lines(found)[1].split("(phases")[0]


def test_reserved_memory_on_a_gpu(tmp_path):
    """Reserved at each step's end, its peak, and what of it stood unallocated at the tightest
    moment (the steps' peak, here); on a GPU the rule reads the GPU's memory."""
    result = analysed(tmp_path, loop(device_type=CUDA, reserved_mb=400.0))
    found = result["memory"]
    assert result["device"] == "cuda"
    assert found["reserved_mb_at_step_end"] == [400.0] * 6
    assert found["steps_peak_reserved_mb"] == 400.0
    assert found["reserved_unallocated_mb"] == pytest.approx(
        400.0 - found["steps_peak_allocated_mb"])
    assert f"the GPU's {H100_MEMORY_BYTES / MB:,.0f} MB" in finding(result, "memory_growth")[
        "evidence"]
    zero = analysed(tmp_path, loop(device_type=CUDA), "zero")["memory"]
    assert zero["reserved_mb_at_step_end"] is None and zero["steps_peak_reserved_mb"] is None
    assert zero["reserved_unallocated_mb"] is None
    # a GPU run reads the GPU's events only: the CPU's are another device
    cpu_events = analysed(tmp_path, loop(device_type=CPU), "cpu")
    assert cpu_events["device"] == "cpu" and cpu_events["memory"]["steps_read"] == 6


def test_of_several_gpus_the_one_with_the_highest_peak(tmp_path):
    built = loop(device_type=CUDA)
    for event in list(built.events):
        if event.get("name") == "[memory]":
            other = json.loads(json.dumps(event))
            other["args"].update({"Device Id": 1, "Total Allocated": 1,
                                  "Addr": other["args"]["Addr"] + 1})
            built.events.append(other)
    found = analysed(tmp_path, built)["memory"]
    assert found["growth_mb_per_step"] == pytest.approx(OUTPUT_MB)


def growth_metrics(r2: float, growth: float, peak: float, last: float = 0.0,
                   capacity: float | None = None) -> dict:
    return {"device_memory_mb": capacity, "memory": {
        "growth_fit_r2": r2, "growth_mb_per_step": growth, "steps_peak_allocated_mb": peak,
        "allocated_mb_at_step_end": [0.0] * 4 + [last], "steps_read": 5,
        "kept_mb_per_step": growth, "kept_by_operator": []}}


def test_the_rule_cuts_at_its_thresholds():
    """R^2, the share of the peak, and the steps until full: at each threshold it fires, past it
    not. A growth of 0.16 MB a step fills the 16,000 MB assumed in exactly 100,000 steps."""
    fits = verdicts.MEMORY_ASSUMED_CAPACITY_MB / verdicts.MEMORY_GROWTH_FULL_WITHIN_STEPS
    peak = 100 * fits / verdicts.MEMORY_GROWTH_MIN_PCT  # growth is exactly the minimum share
    rule = verdicts.rule_memory_growth
    assert rule(growth_metrics(verdicts.MEMORY_GROWTH_R2_MIN, fits, peak))
    assert rule(growth_metrics(verdicts.MEMORY_GROWTH_R2_MIN - 1e-6, fits, peak)) is None
    assert rule(growth_metrics(1.0, fits, peak * (1 + 1e-6))) is None  # under 1 % of the peak
    assert rule(growth_metrics(1.0, fits * (1 - 1e-6), peak)) is None  # full in more steps
    assert rule(growth_metrics(1.0, fits, peak))["severity"] == "medium"
    assert rule(growth_metrics(1.0, 2 * fits, peak))["severity"] == "high"  # in half as many
    gpu = 80_000.0  # a GPU's memory, when the trace gives it
    assert rule(growth_metrics(1.0, fits, peak, capacity=gpu)) is None
    assert rule(growth_metrics(1.0, gpu / verdicts.MEMORY_GROWTH_FULL_WITHIN_STEPS,
                               peak * gpu / verdicts.MEMORY_ASSUMED_CAPACITY_MB, capacity=gpu))
    assert rule(growth_metrics(None, None, peak)) is None
    assert rule({"memory": None}) is None


def test_initialization_withholds_memory_growth(leak):
    start_up = {**leak, "initialization": {"pct": 50.0, "mostly": True, "evidence": ["start-up"],
                                           "fix": "record later"}}
    ids = [f["id"] for f in verdicts.findings_for(start_up)]
    assert "memory_growth" in [f["id"] for f in leak["findings"]]
    assert "memory_growth" not in ids and ids[0] == "initialization"
    assert "memory_growth (its memory)" in verdicts.findings_for(start_up)[0]["evidence"]


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")
def test_a_real_profiler_trace_of_a_leaking_loop(tmp_path):
    """torch.profiler's own trace of a loop that keeps each step's output (64 x 4096 floats,
    1.048576 MB): the growth and what keeps it, read back."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 4096)
    outputs = []

    def step() -> None:
        logits = model(torch.randn(64, 64))
        logits.logsumexp(-1).mean().backward()
        outputs.append(logits)  # the leak: each step's output, and its graph

    path = tmp_path / "leak.pt.trace.json"
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                 schedule=schedule(wait=0, warmup=1, active=6),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(str(path))) as prof:
        for _ in range(7):
            step()
            prof.step()
    result = analyze.analyze_trace(path)
    found = result["memory"]
    output_mb = 64 * 4096 * 4 / MB
    assert found["steps_read"] == 6
    assert found["growth_mb_per_step"] == pytest.approx(output_mb, rel=1e-6)
    assert found["growth_fit_r2"] == pytest.approx(1.0)
    assert found["kept_by_operator"][0]["operator"] == "aten::linear"
    assert found["kept_by_operator"][0]["mb_per_step"] == pytest.approx(output_mb, rel=1e-6)
    parts = found["peak_breakdown_mb"]
    assert found["peak_phases_from"] == "operators" and parts["forward"] is None  # no regions
    assert abs(sum(v for v in parts.values() if v is not None)
               - found["steps_peak_allocated_mb"]) <= SUM_TOLERANCE_MB
    assert parts["backward"] > 0  # the weight's gradient and the output's, in autograd's ops
    assert finding(result, "memory_growth")


# --- Silent on the real traces: every shared trace and committed run, but the leak pair's bad. --
SHARED = ROOT.parent / "shared" / "traces"
REAL_TRACES = sorted([*SHARED.glob("*.json.gz"),
                      *(ROOT / "traces" / "reference").glob("*/*/*/*.pt.trace.json.gz")])
LEAKING = ("memory_leak", "bad")  # traces/reference/<device>/memory_leak/bad: its lesson


def shown(path: Path) -> str:
    return path.name if path.parent == SHARED else "/".join(path.parts[-4:-1])


@pytest.mark.skipif(not REAL_TRACES, reason="no shared traces or committed reference runs")
@pytest.mark.parametrize("path", REAL_TRACES, ids=shown)
def test_memory_growth_is_silent_on_real_traces(path):
    """Read only where the trace holds [memory] events (without them there is nothing to read,
    and no analysis to spend the suite's time on)."""
    if b'"[memory]"' not in trace.read_bytes(path):
        return
    result = analyze.analyze_trace(path)
    found = result["memory"]
    leaking = path.parts[-3:-1] == LEAKING
    assert bool(finding(result, "memory_growth")) == leaking
    if found is None:  # memory events of another device only
        return
    assert abs(sum(v for v in found["peak_breakdown_mb"].values() if v is not None)
               - found["steps_peak_allocated_mb"]) <= 1e-6 * max(1.0, found[
                   "steps_peak_allocated_mb"])
    assert found["steps_peak_allocated_mb"] <= result["peak_memory_mb"]
    if found["growth_mb_per_step"] is not None and not leaking:
        assert (found["growth_fit_r2"] < verdicts.MEMORY_GROWTH_R2_MIN
                or abs(found["growth_mb_per_step"]) < 1e-9
                or 100 * found["growth_mb_per_step"] / found["steps_peak_allocated_mb"]
                < verdicts.MEMORY_GROWTH_MIN_PCT)


def test_the_growth_fit_by_hand():
    """The slope and R^2 of a least-squares line, against numpy's polyfit."""
    series = np.array([3.0, 5.0, 4.0, 8.0, 9.0, 12.0])
    slope, r2 = memory.growth_fit(series)
    fitted = np.polyval(np.polyfit(np.arange(6), series, 1), np.arange(6))
    assert slope == pytest.approx(np.polyfit(np.arange(6), series, 1)[0])
    assert r2 == pytest.approx(1 - ((series - fitted) ** 2).sum()
                               / ((series - series.mean()) ** 2).sum())
    assert memory.growth_fit(np.full(5, 7.0)) == (0.0, 1.0)
    assert memory.growth_fit(np.arange(4.0)) == (None, None)


@pytest.mark.parametrize("order", [("aten::softmax", "aten::mul"), ("aten::mul", "aten::softmax")])
def test_operators_allocating_as_much_are_listed_in_the_order_the_trace_names_them(order):
    """A tie (naive_attention's softmax and its backward, 17,179.87 MB a step each) listed by
    object id came out in another order in each process; the trace's own order is the same
    every time."""
    names = np.array([sys.intern(order[0]), sys.intern(order[1]), sys.intern("aten::add")],
                     dtype=object)
    found = memory.by_operator(names, np.array([2e6, 2e6, 1e6]), steps=1)
    assert [row["operator"] for row in found] == [*order, "aten::add"]
    assert [row["mb_per_step"] for row in found] == [2.0, 2.0, 1.0]
