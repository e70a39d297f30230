"""Initialization as a regime (idle_causes.initialization_regime): the start-up a window recorded
without warm-up holds, in each of its forms, on hand-built traces.

First the five shapes of window that were read as steady state: a cold first inference of a small
CNN (cuDNN's set-up in the first convolution, modules loaded on first launches), a cold
vision-transformer start (context creation), a tensor-parallel cold forward (a long launch and the
first collective's start-up skew), the first call of a torch.compile'd model (compiling fills the
window) and a training trace whose first step holds the caching allocator's first cudaFree. Then
each threshold one step below, at and above it, with the value derived from its constant.
Times are µs; a trace's numbers are worked out in its docstring."""
from __future__ import annotations

import pytest

from common.idle_causes import (
    INIT_FIRST_CALL_MIN_MS,
    INIT_FIRST_CALL_RATIO,
    INIT_FIRST_LAUNCH_MIN_MS,
    INIT_LAUNCH_GPU_BUSY_MAX,
    INIT_LAUNCH_MIN_MS,
    INIT_MOSTLY_MIN_PCT,
    INIT_SETUP_CALL_MIN_MS,
    INIT_STEADY_MIN_PCT,
    initialization_regime,
    initialization_regime_warning,
)
from common.trace_columns import read_trace
from common.trace_steps import extend_steps, host_steps, runtime_step_index
from tests.kineto_builder import BF16_GEMM, ELEMENTWISE, KinetoTrace, simulate_training

T0 = 1_000_000  # µs
MS = 1000  # µs per ms
NCCL_ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
SETUP_US = round(INIT_SETUP_CALL_MIN_MS * MS)
LAUNCH_US = round(INIT_LAUNCH_MIN_MS * MS)
FIRST_LAUNCH_US = round(INIT_FIRST_LAUNCH_MIN_MS * MS)
FIRST_CALL_US = round(INIT_FIRST_CALL_MIN_MS * MS)


def columns_of(tmp_path, built: KinetoTrace):
    columns = read_trace(built.write(tmp_path / "t.pt.trace.json"))
    host = host_steps(columns)
    return columns, host, extend_steps(columns, host, runtime_step_index(columns, host))


def regime(tmp_path, built: KinetoTrace) -> dict | None:
    return initialization_regime(*columns_of(tmp_path, built))


def kinds(found: dict | None) -> list[str]:
    return [] if found is None else sorted({span["kind"] for span in found["spans"]})


def steady_tail(t: KinetoTrace, at: float, launches: int = 20, name: str = ELEMENTWISE) -> float:
    """`launches` operators of 20 µs, each launching a 10 µs kernel: the steady state after
    start-up. Returns where it ends."""
    for _ in range(launches):
        t.op("aten::add", at, 20)
        t.launch(at + 10, 5, at + 18, 10, name=name)
        at += 25
    return at


# --- The five shapes. ---------------------------------------------------------------------------

def cold_cnn() -> KinetoTrace:
    """A cold first inference of a small CNN, recorded by `with profile():` (no ProfilerStep#N):
    ten aten::cudnn_convolution calls, each launching its own kernel (20 µs); the first spends
    158 ms of its own in cuDNN's set-up, the others 40 µs; the launches of layers 1-5 take 3 ms
    each (their kernels' modules load on first launch), the others 5 µs. An operator closes the
    window at 219 ms. Initialization: 158.005 ms + 5 x 3 ms = 173.005 ms, 79.0 % of it; the GPU
    is busy 0.2 ms."""
    t = KinetoTrace()
    t.gpu()
    at = T0
    for layer in range(10):
        own = 158 * MS if layer == 0 else 40
        launch = 3 * MS if 1 <= layer <= 5 else 5
        t.op("aten::cudnn_convolution", at, own + launch)
        t.launch(at + own, launch, at + own + launch + 3, 20, name=f"conv_kernel_{layer}")
        at += own + launch + 100
    t.op("aten::softmax", T0 + 219 * MS - 10, 10)
    return t


def test_a_cold_cnn_inference_is_initialization(tmp_path):
    found = regime(tmp_path, cold_cnn())
    assert kinds(found) == ["first_call", "first_launch"]
    first = [span for span in found["spans"] if span["kind"] == "first_call"]
    assert [span["name"] for span in first] == ["aten::cudnn_convolution"]
    assert first[0]["own_ms"] == pytest.approx(158.0)
    assert first[0]["later_median_ms"] == pytest.approx(0.040)  # less their launch calls
    assert len([span for span in found["spans"] if span["kind"] == "first_launch"]) == 5
    assert found["ms"] == pytest.approx(173.005)
    assert found["pct"] == pytest.approx(100 * 173.005 / 219)
    assert found["mostly"] and found["steady_window_us"] is None
    assert found["one_step_capture"] and found["first_steady_step"] is None
    assert any("no ProfilerStep#N" in line for line in found["evidence"])
    assert "schedule(wait=1, warmup=1, active=3)" in found["fix"]
    assert "cudnn.benchmark" in found["fix"] and "first launch" in found["fix"]
    assert "79.0 %" in initialization_regime_warning(found)


def test_a_cold_vision_transformer_start_is_initialization(tmp_path):
    """cudaFree 3 s and cudaStreamCreateWithFlags 0.6 s (context creation, in operators), then a
    5.5 s first launch, all with the GPU idle; then 20 steady launches (0.5 ms). 9.1 s of
    initialization in a window of 9.1005 s."""
    t = KinetoTrace()
    t.gpu()
    t.op("aten::empty", T0, 3_600 * MS + 20)
    t.runtime("cudaFree", T0 + 10, 3_000 * MS)
    t.runtime("cudaStreamCreateWithFlags", T0 + 10 + 3_000 * MS, 600 * MS)
    at = T0 + 3_600 * MS + 20
    t.op("aten::conv2d", at, 5_500 * MS + 10)
    t.launch(at + 5, 5_500 * MS, at + 5_500 * MS + 8, 50, name=BF16_GEMM)
    steady_tail(t, at + 5_500 * MS + 20)
    found = regime(tmp_path, t)
    assert kinds(found) == ["long_launch", "setup_call"]
    assert len([span for span in found["spans"] if span["kind"] == "setup_call"]) == 2
    assert found["ms_by_kind"] == pytest.approx({"setup_call": 3_600, "long_launch": 5_500})
    assert found["mostly"] and found["pct"] > 99


def test_a_tensor_parallel_cold_forward_is_initialization(tmp_path):
    """One step: a 372 ms launch with the GPU idle, then 8 layers of a GEMM and an all-reduce
    (nccl:all_reduce on the CPU, 20 µs each); the first all-reduce kernel runs 60 ms (it waits
    for the other ranks to start up), the later ones 0.1 ms."""
    t = KinetoTrace()
    t.gpu()
    t.launch(T0 + 10, 372 * MS, T0 + 372 * MS + 20, 30, name=BF16_GEMM)
    at, gpu_free = T0 + 372 * MS + 100, T0 + 372 * MS + 50
    for layer in range(8):
        t.launch(at, 5, max(at + 8, gpu_free), 30, name=BF16_GEMM)
        gpu_free = max(at + 8, gpu_free) + 30
        t.span("annotation", "nccl:all_reduce", at + 10, 20)
        nccl_us = 60 * MS if layer == 0 else 100
        t.launch(at + 12, 5, gpu_free, nccl_us, name=NCCL_ALL_REDUCE)
        gpu_free += nccl_us
        at += 100
    t.step(1, T0, at - T0)
    found = regime(tmp_path, t)
    assert kinds(found) == ["first_collective", "long_launch"]
    (collective,) = [span for span in found["spans"] if span["kind"] == "first_collective"]
    assert collective["name"] == NCCL_ALL_REDUCE and collective["ms"] == 60
    assert collective["later_median_ms"] == pytest.approx(0.1)
    assert found["ms"] == pytest.approx(372 + 60)
    assert found["mostly"] and any("one step recorded" in line for line in found["evidence"])


def compiled_first_call(marker: str = " (dynamo_timed)") -> KinetoTrace:
    """One step of 1 s: "Torch-Compiled Region: 0/0" and "TorchDynamo Cache Lookup" (they run
    the compiled code every call), inside them Dynamo compiling for 800 ms ("_compile.
    compile_inner" and, nested, Inductor's "compile_fx_inner" for 500 ms), then a CompiledFunction
    operator launching the graph's kernels (20 operators of 20 µs in its 500 µs)."""
    t = KinetoTrace()
    t.gpu()
    t.step(1, T0, 1_000 * MS)
    t.region("TorchDynamo Cache Lookup", T0 + 5, 3)
    t.region("Torch-Compiled Region: 0/0", T0 + 10, 990 * MS)
    t.region(f"_compile.compile_inner{marker}", T0 + 20, 800 * MS)
    t.region(f"compile_fx_inner{marker}", T0 + 200 * MS, 500 * MS)
    t.op("CompiledFunction", T0 + 900 * MS, 20 * 25)
    steady_tail(t, T0 + 900 * MS)
    return t


def test_the_first_call_of_a_compiled_model_is_initialization(tmp_path):
    found = regime(tmp_path, compiled_first_call())
    assert [(span["kind"], span["name"]) for span in found["spans"]] == [
        ("compile", "_compile.compile_inner (dynamo_timed)")]  # the outermost range only
    assert found["pct"] == pytest.approx(80.0, abs=0.01) and found["mostly"]
    assert "Dynamo/Inductor time in the window is initialization" in found["fix"]
    # The ranges that run compiled code each call are no initialization.
    assert regime(tmp_path, compiled_first_call(marker="")) is None


def allocator_release(release_us: float = 981 * MS) -> KinetoTrace:
    """40 steps of 25 ms (a GEMM launched each ms); the first also holds a cudaFree of
    `release_us` with the GPU idle, at its start (the caching allocator's first release). Each
    step's kernels end inside it: the window is the steps', 1,981 ms."""
    t = KinetoTrace()
    t.gpu()
    at = T0
    for number in range(1, 41):
        start = at
        if number == 1:
            t.runtime("cudaFree", at, release_us)
            at += release_us
        for _ in range(25):
            t.launch(at, 5, at + 8, 500, name=BF16_GEMM)
            at += MS
        t.step(number, start, at - start)
    return t


def test_the_allocators_first_release_in_a_training_window(tmp_path):
    """981 ms of a 1,981 ms window (49.5 %): not mostly initialization; the steady state follows
    it, from step 2 (index 1) on, 50.5 % of the window: the verdicts can read that part."""
    found = regime(tmp_path, allocator_release())
    assert kinds(found) == ["setup_call"]
    assert found["pct"] == pytest.approx(100 * 981 / 1_981)
    assert not found["mostly"] and found["first_steady_step"] == 1
    assert found["ends_at_us"] == T0 + 981 * MS
    assert found["steady_window_us"] == [T0 + 981 * MS, T0 + 1_981 * MS]
    assert not found["one_step_capture"]


@pytest.mark.parametrize("vocabulary", ["current", "2021", "tensorboard"])
def test_a_steady_state_window_holds_no_initialization(tmp_path, vocabulary):
    t = KinetoTrace(vocabulary=vocabulary)
    t.gpu()
    simulate_training(t, steps=5, backward=True)
    assert regime(tmp_path, t) is None


# --- Set-up calls. ------------------------------------------------------------------------------

def one_call(name: str, dur: float, gpu_busy_us: float = 0.0) -> KinetoTrace:
    """One step: runtime call `name` of `dur` µs, with a kernel running `gpu_busy_us` of it
    (launched before it), then the steady tail."""
    t = KinetoTrace()
    t.gpu()
    t.launch(T0, 5, T0 + 10, max(gpu_busy_us, 1))
    t.runtime(name, T0 + 10, dur)
    end = steady_tail(t, T0 + 10 + dur + 10)
    t.step(1, T0, end - T0)
    return t


@pytest.mark.parametrize("dur, found", [(SETUP_US - 1, False), (SETUP_US, True),
                                        (SETUP_US + 1, True)])
def test_set_up_call_threshold(tmp_path, dur, found):
    result = regime(tmp_path, one_call("cudaMalloc", dur))
    assert kinds(result) == (["setup_call"] if found else [])


@pytest.mark.parametrize("busy_share, found", [
    (INIT_LAUNCH_GPU_BUSY_MAX - 0.01, True), (INIT_LAUNCH_GPU_BUSY_MAX, False),
    (INIT_LAUNCH_GPU_BUSY_MAX + 0.01, False)])
def test_a_set_up_call_waits_for_nothing_on_the_gpu(tmp_path, busy_share, found):
    """With the GPU busy half the call or more, it may wait for the GPU (cudaFree does): no
    start-up then."""
    dur = 10 * SETUP_US
    result = regime(tmp_path, one_call("cudaFree", dur, gpu_busy_us=busy_share * dur))
    assert kinds(result) == (["setup_call"] if found else [])


@pytest.mark.parametrize("name", ["cudaDeviceSynchronize", "cudaStreamSynchronize",
                                  "cudaMemcpyAsync", "cudaMemsetAsync", "cudaLaunchKernel",
                                  "hipDeviceSynchronize"])
def test_calls_that_wait_or_enqueue_are_no_set_up(tmp_path, name):
    """A sync waits for the GPU, a copy, memset or launch enqueues (a launch has rules of its
    own): however long, with the GPU idle, none is a set-up call."""
    assert "setup_call" not in kinds(regime(tmp_path, one_call(name, 10 * SETUP_US)))


@pytest.mark.parametrize("steps_with_call, found", [(1, True), (2, True), (3, False)])
def test_set_up_calls_in_every_step_are_the_steady_state(tmp_path, steps_with_call, found):
    """Three steps; a cudaMalloc of INIT_SETUP_CALL_MIN_MS in the first `steps_with_call` of
    them: in every step it is the allocator's churn, not start-up."""
    t = KinetoTrace()
    t.gpu()
    at = T0
    for number in range(1, 4):
        start = at
        if number <= steps_with_call:
            t.runtime("cudaMalloc", at, SETUP_US)
            at += SETUP_US
        at = steady_tail(t, at + 10)
        t.step(number, start, at - start)
    assert kinds(regime(tmp_path, t)) == (["setup_call"] if found else [])


def test_set_up_calls_are_named(tmp_path):
    """The reader keeps each runtime call's name (TraceColumns.runtime_name_id and
    runtime_name_table, as for kernels): the evidence names the call."""
    columns, host, steps = columns_of(tmp_path, one_call("cudaFree", 3 * SETUP_US))
    found = initialization_regime(columns, host, steps)
    assert found["spans"][0]["name"] == "cudaFree"
    assert "the longest cudaFree" in found["evidence"][0]


# --- Launches. ----------------------------------------------------------------------------------

def launch_of(dur: float, first: bool, gpu_busy: bool = False) -> KinetoTrace:
    """One step: a kernel's launch call of `dur` µs, its first run in the trace if `first` (else
    the same kernel ran once before it); with `gpu_busy` a long kernel runs through the call."""
    t = KinetoTrace()
    t.gpu()
    at = T0
    if not first:
        t.launch(at, 5, at + 8, 10, name=BF16_GEMM)
        at += 30
    if gpu_busy:
        t.launch(at, 5, at + 8, dur + 100, name=ELEMENTWISE)
        at += 10
    t.launch(at, dur, at + dur + 3, 10, name=BF16_GEMM)
    end = steady_tail(t, at + dur + 200 + (dur if gpu_busy else 0))
    t.step(1, T0, end - T0)
    return t


@pytest.mark.parametrize("dur, found", [(FIRST_LAUNCH_US - 1, []),
                                        (FIRST_LAUNCH_US, ["first_launch"]),
                                        (FIRST_LAUNCH_US + 1, ["first_launch"])])
def test_first_launch_threshold(tmp_path, dur, found):
    assert kinds(regime(tmp_path, launch_of(dur, first=True))) == found


@pytest.mark.parametrize("dur, found", [(LAUNCH_US - 1, []), (LAUNCH_US, ["long_launch"]),
                                        (LAUNCH_US + 1, ["long_launch"])])
def test_long_launch_threshold_for_a_kernel_that_ran_before(tmp_path, dur, found):
    """Not a kernel's first run: only a launch of INIT_LAUNCH_MIN_MS is start-up (a full launch
    queue holds a launch tens of ms, a busy GPU behind it)."""
    assert kinds(regime(tmp_path, launch_of(dur, first=False))) == found


def test_a_long_first_launch_is_one_long_launch(tmp_path):
    found = regime(tmp_path, launch_of(LAUNCH_US, first=True))
    assert [span["kind"] for span in found["spans"]] == ["long_launch"]
    assert "launch calls take 5.0 us at the median" in found["evidence"][0]


@pytest.mark.parametrize("first", [True, False])
def test_a_launch_held_by_a_busy_gpu_is_no_start_up(tmp_path, first):
    assert regime(tmp_path, launch_of(LAUNCH_US, first=first, gpu_busy=True)) is None


# --- Operators' first calls. ----------------------------------------------------------------

def first_call(own: float, later_own: float = 40, later_calls: int = 5, *, steps: int = 1,
               launches: bool = True, later_in_step: int | None = None) -> KinetoTrace:
    """`steps` steps; in the first, aten::cudnn_convolution's first call spends `own` µs of its
    own and launches a 10 µs kernel (a 10 µs launch call, not its own time); then `later_calls`
    calls of `later_own` µs each (their launch calls besides), all in the first step, or one in
    step `later_in_step`. Without `launches` the operator enqueues nothing (a CPU operator)."""
    t = KinetoTrace()
    t.gpu()
    at = T0
    bounds = []
    for number in range(1, steps + 1):
        start = at
        calls = [own] if number == 1 else []
        if later_in_step is None and number == 1:
            calls += [later_own] * later_calls
        elif later_in_step == number:
            calls += [later_own]
        for call_own in calls:
            t.op("aten::cudnn_convolution", at, call_own + (10 if launches else 0))
            if launches:
                t.launch(at + call_own, 10, at + call_own + 13, 10, name=BF16_GEMM)
            at += call_own + 100
        at = steady_tail(t, at)
        bounds.append((start, at))
    for number, (start, end) in enumerate(bounds, 1):
        t.step(number, start, end - start)
    return t


@pytest.mark.parametrize("own, found", [(FIRST_CALL_US - 1, False), (FIRST_CALL_US, True),
                                        (FIRST_CALL_US + 1, True)])
def test_first_call_threshold(tmp_path, own, found):
    assert kinds(regime(tmp_path, first_call(own))) == (["first_call"] if found else [])


@pytest.mark.parametrize("later_own, found", [
    (FIRST_CALL_US * 2 / INIT_FIRST_CALL_RATIO + 1, False),
    (FIRST_CALL_US * 2 / INIT_FIRST_CALL_RATIO, True),
    (FIRST_CALL_US * 2 / INIT_FIRST_CALL_RATIO - 1, True)])
def test_first_call_ratio_to_the_later_calls(tmp_path, later_own, found):
    """A first call of twice the minimum against later calls whose median own time puts it
    just under, at and over INIT_FIRST_CALL_RATIO times it."""
    result = regime(tmp_path, first_call(FIRST_CALL_US * 2, later_own=later_own))
    assert kinds(result) == (["first_call"] if found else [])


@pytest.mark.parametrize("later_own, found", [
    (FIRST_CALL_US * 2 / INIT_FIRST_CALL_RATIO - 1, True),
    (FIRST_CALL_US * 2 / INIT_FIRST_CALL_RATIO, False),
    (FIRST_CALL_US * 2 / INIT_FIRST_CALL_RATIO + 1, False)])
def test_a_first_call_that_later_steps_repeat_is_the_steady_state(tmp_path, later_own, found):
    """Three steps; the first call in step 1 and one call of `later_own` in step 3: within
    INIT_FIRST_CALL_RATIO of the first, every step may pay it (the DataLoader's torch.cat of a
    batch, say): steady state. No other later call: the single call's rule does not apply."""
    t = first_call(FIRST_CALL_US * 2, later_own=later_own, steps=3, later_in_step=3)
    assert kinds(regime(tmp_path, t)) == (["first_call"] if found else [])


def test_only_a_first_call_stands_out(tmp_path):
    """A short call of the operator before the long one: the long one is no first call (a new
    shape's set-up, say), and no initialization by this rule."""
    t = first_call(FIRST_CALL_US * 2)
    t.op("aten::cudnn_convolution", T0 - 200, 50)
    t.launch(T0 - 160, 10, T0 - 140, 10, name=BF16_GEMM)
    t.step(0, T0 - 300, 300)
    assert regime(tmp_path, t) is None


def test_a_cpu_operators_long_first_call_is_no_initialization(tmp_path):
    assert regime(tmp_path, first_call(FIRST_CALL_US * 10, launches=False)) is None


@pytest.mark.parametrize("kernel_us, found", [
    (FIRST_CALL_US * 2 / INIT_FIRST_CALL_RATIO - 1, True),
    (FIRST_CALL_US * 2 / INIT_FIRST_CALL_RATIO, True),
    (FIRST_CALL_US * 2 / INIT_FIRST_CALL_RATIO + 1, False)])
def test_a_single_call_against_the_kernels_it_launched(tmp_path, kernel_us, found):
    """Called once (no later call to compare with): its own time against the GPU time of the
    kernels it launched."""
    own = FIRST_CALL_US * 2
    t = KinetoTrace()
    t.gpu()
    t.op("aten::addmm", T0, own + 10)
    t.launch(T0 + own, 10, T0 + own + 13, kernel_us, name=BF16_GEMM)
    end = steady_tail(t, T0 + own + kernel_us + 100)
    t.step(1, T0, end - T0)
    result = regime(tmp_path, t)
    assert kinds(result) == (["first_call"] if found else [])
    if found:
        assert result["spans"][0]["kernel_ms"] == pytest.approx(kernel_us / MS)


def test_a_first_call_waiting_in_runtime_calls_is_not_its_own_time(tmp_path):
    """The first aten::copy_ holds a 100 ms cudaStreamSynchronize (the GPU busy: a sync, not
    set-up) and spends 40 µs of its own: waiting is no initialization."""
    t = KinetoTrace()
    t.gpu()
    t.launch(T0, 5, T0 + 10, 100 * MS)
    t.op("aten::copy_", T0 + 20, 100 * MS + 60)
    t.launch(T0 + 30, 10, T0 + 100 * MS + 20, 10)
    t.runtime("cudaStreamSynchronize", T0 + 50, 100 * MS)
    at = T0 + 100 * MS + 100
    for _ in range(5):
        t.op("aten::copy_", at, 50)
        t.launch(at + 20, 10, at + 33, 10)
        at += 100
    t.step(1, T0, at - T0)
    assert regime(tmp_path, t) is None


def test_a_chain_of_operators_with_one_span_is_one_first_call(tmp_path):
    """aten::conv2d > aten::convolution > aten::cudnn_convolution with the very same span (a
    trace of whole µs): one call, listed once."""
    t = first_call(FIRST_CALL_US * 2)
    t.op("aten::conv2d", T0, FIRST_CALL_US * 2 + 10)
    found = regime(tmp_path, t)
    assert [span["kind"] for span in found["spans"]] == ["first_call"]


# --- The first collective. ----------------------------------------------------------------------

def collectives(first_us: float, later_us: float = 100, later: int = 7, steps: int = 1,
                later_step_first_us: float | None = None) -> KinetoTrace:
    """`steps` steps of collectives (NCCL all-reduce kernels, each launched by a 5 µs call and
    run after the one before): the first `first_us`, the others `later_us`, `later` a step; the
    first of each later step `later_step_first_us` where given."""
    t = KinetoTrace()
    t.gpu()
    at = gpu_free = T0
    for number in range(1, steps + 1):
        start = at
        for k in range(later + 1):
            if k == 0:
                dur = first_us if number == 1 else (later_step_first_us or later_us)
            else:
                dur = later_us
            t.launch(at, 5, max(at + 8, gpu_free), dur, name=NCCL_ALL_REDUCE)
            gpu_free = max(at + 8, gpu_free) + dur
            at += 20
        at = max(at, gpu_free) + 10
        t.step(number, start, at - start)
    return t


@pytest.mark.parametrize("first_us, found", [(FIRST_CALL_US - 1, False), (FIRST_CALL_US, True),
                                             (FIRST_CALL_US + 1, True)])
def test_first_collective_threshold(tmp_path, first_us, found):
    result = regime(tmp_path, collectives(first_us))
    assert kinds(result) == (["first_collective"] if found else [])


@pytest.mark.parametrize("later_us, found", [
    (FIRST_CALL_US * 2 / INIT_FIRST_CALL_RATIO + 1, False),
    (FIRST_CALL_US * 2 / INIT_FIRST_CALL_RATIO, True),
    (FIRST_CALL_US * 2 / INIT_FIRST_CALL_RATIO - 1, True)])
def test_first_collective_ratio(tmp_path, later_us, found):
    result = regime(tmp_path, collectives(FIRST_CALL_US * 2, later_us=later_us))
    assert kinds(result) == (["first_collective"] if found else [])


@pytest.mark.parametrize("again_us, found", [
    (FIRST_CALL_US * 3 / INIT_FIRST_CALL_RATIO - 1, True),
    (FIRST_CALL_US * 3 / INIT_FIRST_CALL_RATIO, False),
    (FIRST_CALL_US * 3 / INIT_FIRST_CALL_RATIO + 1, False)])
def test_a_first_collective_that_later_steps_repeat(tmp_path, again_us, found):
    """Three steps whose later steps open with a collective of `again_us`: within
    INIT_FIRST_CALL_RATIO of the first, each step may wait so (a straggler): steady state."""
    t = collectives(FIRST_CALL_US * 3, steps=3, later_step_first_us=again_us)
    assert kinds(regime(tmp_path, t)) == (["first_collective"] if found else [])


def test_a_collective_alone_or_slow_every_step_is_no_start_up(tmp_path):
    """One collective has none to stand out from; a first collective as slow in every step is a
    straggler's wait each step (the shared V100 NCCL trace: 10.7 ms first, 12.5 ms later)."""
    assert regime(tmp_path, collectives(FIRST_CALL_US * 3, later=0)) is None
    assert regime(tmp_path, collectives(FIRST_CALL_US * 3, steps=3,
                                        later_step_first_us=FIRST_CALL_US * 3)) is None
    assert kinds(regime(tmp_path, collectives(FIRST_CALL_US * 3, steps=3))) == [
        "first_collective"]


# --- The regime: mostly initialization, and where the steady state begins. ----------------------

@pytest.mark.parametrize("share, mostly", [(INIT_MOSTLY_MIN_PCT - 0.5, False),
                                           (INIT_MOSTLY_MIN_PCT, True),
                                           (INIT_MOSTLY_MIN_PCT + 0.5, True)])
def test_mostly_initialization(tmp_path, share, mostly):
    """A cudaFree at the start of a 1 s step holding `share` % of the window (the step's GPU work
    ends within it)."""
    t = KinetoTrace()
    t.gpu()
    t.step(1, T0, 1_000 * MS)
    t.runtime("cudaFree", T0, share * 10 * MS)
    steady_tail(t, T0 + share * 10 * MS + 10)
    found = regime(tmp_path, t)
    assert found["pct"] == pytest.approx(share) and found["mostly"] is mostly
    assert (found["steady_window_us"] is None) is mostly


@pytest.mark.parametrize("steady, window", [(INIT_STEADY_MIN_PCT - 0.5, False),
                                            (INIT_STEADY_MIN_PCT, True),
                                            (INIT_STEADY_MIN_PCT + 0.5, True)])
def test_the_steady_state_after_initialization(tmp_path, steady, window):
    """A 10 ms cudaMalloc (1 % of the window) ending where `steady` % of a 1 s step remains: the
    verdicts read that part where it holds at least INIT_STEADY_MIN_PCT of the window."""
    t = KinetoTrace()
    t.gpu()
    t.step(1, T0, 1_000 * MS)
    end = T0 + (100 - steady) * 10 * MS
    t.runtime("cudaMalloc", end - SETUP_US, SETUP_US)
    steady_tail(t, end + 10)
    found = regime(tmp_path, t)
    assert found["ends_at_us"] == pytest.approx(end)
    assert found["steady_pct"] == pytest.approx(steady) and not found["mostly"]
    assert found["steady_window_us"] == (
        [pytest.approx(end), T0 + 1_000 * MS] if window else None)


def test_a_gpu_the_profiler_did_not_record_is_not_known_idle(tmp_path):
    """Runtime calls and no GPU event (ProfilerActivity.CPU alone): a long cudaFree or launch
    may have waited for the GPU; nothing says it was idle."""
    t = KinetoTrace()
    t.step(1, T0, 1_000 * MS)
    t.runtime("cudaFree", T0 + 10, 100 * SETUP_US)
    t.runtime("cudaLaunchKernel", T0 + 100 * SETUP_US + 20, 2 * LAUNCH_US)
    assert regime(tmp_path, t) is None


def test_initialization_in_a_trace_without_gpu_work(tmp_path):
    """A CPU run's torch.compile: compiling is initialization on any device; nothing else needs
    a GPU to be read."""
    t = KinetoTrace()
    t.step(1, T0, 1_000 * MS)
    t.region("_compile.compile_inner (dynamo_timed)", T0 + 10, 600 * MS)
    t.op("aten::mm", T0 + 700 * MS, 100 * MS)
    assert kinds(regime(tmp_path, t)) == ["compile"]
