"""The regimes of traces unlike ours, on hand-built traces whose numbers are worked out below:
host overhead (the GPU waits for the host, which is not busy launching), exposed communication
(collectives with no compute beside them), inference (no backward pass: no training advice),
and a window that holds initialization."""
from __future__ import annotations

import pytest

from common import analyze, trace_columns
from common.idle_causes import INIT_LAUNCH_MIN_MS
from common.verdicts import EXPOSED_COMM_MIN_PCT, HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT
from tests.kineto_builder import BF16_GEMM, ELEMENTWISE, KinetoTrace

T0 = 1_000_000.0  # µs
STEP_US = 1000.0
NCCL_ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def analysed(tmp_path, built: KinetoTrace) -> dict:
    return analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))


def ids(result: dict) -> list[str]:
    return [f["id"] for f in result["findings"]]


def serving_step(batch: int, busy_us: float, backward: bool = False) -> KinetoTrace:
    """Three steps of 1000 µs: an aten::linear at `batch` rows (record_shapes), then in each of
    ten slots of 100 µs the host spends 75 µs in an operator whose last 5 µs launch its kernel,
    which runs from 3 µs after the launch returns for d = busy_us / 10 µs (d <= 20: each slot's
    kernel ends in it). Launch calls take 0.05 ms a step. The operators enqueue GPU work, as eager
    operators do: dispatch and host time between launches, not host work of its own
    (host_ops.host_work_ops)."""
    t = KinetoTrace()
    t.gpu()
    for number in range(3):
        at = T0 + number * STEP_US
        t.step(number + 1, at, STEP_US)
        t.op_with_shapes("aten::linear", at, 1, [[batch, 1024], [1024, 1024], [1024]])
        if backward:
            t.op("autograd::engine::evaluate_function: AddmmBackward0", at + 2, 1)
        for k in range(10):
            t.op("aten::index_put_", at + 100 * k, 75)
            t.launch(at + 100 * k + 70, 5, at + 100 * k + 78, busy_us / 10, name=ELEMENTWISE)
    return t


def test_host_overhead_by_hand(tmp_path):
    """Batch 512, 20 µs kernels (d = 20) in a 3000 µs window: utilization 20 %. By hand: before
    the first op 78 µs (2.6 %); 29 gaps of 100 - d = 80 µs between kernels, each the host's until
    the next launch returned (77 µs) and the GPU's for 3 µs: launch 29 x 77 = 2233 µs (74.43 %),
    other 29 x 3 + the tail 22 - d = 89 µs (2.97 %). Launch calls 0.05 ms against 0.2 ms of
    kernels: not launch bound; the host's time is in aten::index_put_ (0.75 ms a step)."""
    result = analysed(tmp_path, serving_step(batch=512, busy_us=200))
    gpu = result["gpu"]
    assert gpu["utilization_pct"] == pytest.approx(20.0)
    assert gpu["idle_by_cause_pct"] == pytest.approx(
        {"dataloader": 0.0, "host_sync": 0.0, "before_first_op": 78 / 30, "launch": 2233 / 30,
         "other": 89 / 30, "unrecorded": 0.0})
    assert gpu["idle_by_cause_pct"]["launch"] >= HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT
    assert ids(result) == ["host_overhead"]
    found = result["findings"][0]
    assert "aten::index_put_ 0.75 ms" in found["evidence"]  # what the host does: by name
    assert "batch 512 at the conv/linear inputs, not small" in found["evidence"]
    assert "CUDA graph" in found["fix"] and "reduce-overhead" in found["fix"]


def test_a_small_batch_with_the_same_timing_is_small_batch(tmp_path):
    """The same host-bound timing at batch 8 with 8 µs kernels (an under-filled GPU, still not
    launch bound: 0.05 ms of launch calls for 0.08 ms of kernels): the shapes say the batch, so
    small_batch, not host_overhead; and without a backward pass its fix is a larger batch per
    call, with no learning-rate or gradient-accumulation advice."""
    result = analysed(tmp_path, serving_step(batch=8, busy_us=80))
    assert result["training"] is False and ids(result) == ["small_batch"]
    fix = result["findings"][0]["fix"]
    assert "larger batch per call" in fix
    assert "learning rate" not in fix and "accumulation" not in fix
    trained = analysed(tmp_path, serving_step(batch=8, busy_us=80, backward=True))
    assert trained["training"] is True
    assert "gradient accumulation" in trained["findings"][0]["fix"]


def comm_step(overlapped_us: float, exposed_us: float) -> KinetoTrace:
    """One step of 1000 µs: a 500 µs compute kernel (0..500 after a 10 µs launch), an NCCL
    all-reduce on a second stream beside it for overlapped_us, then alone for exposed_us."""
    t = KinetoTrace()
    t.gpu()
    t.step(1, T0, STEP_US)
    t.launch(T0, 5, T0 + 10, 500, name=BF16_GEMM)
    t.stream = 13
    t.launch(T0 + 6, 3, T0 + 510 - overlapped_us, overlapped_us + exposed_us,
             name=NCCL_ALL_REDUCE)
    return t


@pytest.mark.parametrize("exposed_us, fires", [
    (10 * EXPOSED_COMM_MIN_PCT - 1, False), (10 * EXPOSED_COMM_MIN_PCT, True)])
def test_exposed_communication_by_hand(tmp_path, exposed_us, fires):
    """Compute 500 µs of the 1000 µs window (50 %); the all-reduce runs 300 µs beside it, which
    costs nothing, and exposed_us alone: exposed_us / 10 % of the window."""
    result = analysed(tmp_path, comm_step(overlapped_us=300, exposed_us=exposed_us))
    gpu = result["gpu"]
    assert gpu["compute_pct"] == pytest.approx(50.0)
    assert gpu["exposed_comm_pct"] == pytest.approx(exposed_us / 10)
    assert gpu["utilization_pct"] == pytest.approx(50.0 + exposed_us / 10)  # counts it as work
    assert ("exposed_communication" in ids(result)) == fires


def cpu_comm_step(compute_us: float, wait_in_op: bool = False,
                  vocabulary: str = "current") -> KinetoTrace:
    """A CPU rank's step of 1000 µs, gloo's way: the training thread's operators 0..compute_us
    (forward and backward), a c10d::allreduce_ call at 300 µs that hands the all-reduce to gloo's
    thread, where its gloo:all_reduce span runs 300..800. With `wait_in_op` the call itself
    lasts until 800 (a blocking collective): still no compute."""
    t = KinetoTrace(vocabulary=vocabulary)
    t.step(1, T0, STEP_US)
    t.op("aten::addmm", T0, compute_us)
    t.op("c10d::allreduce_", T0 + 300, 500 if wait_in_op else 10)
    t.region("gloo:all_reduce", T0 + 300, 500, tid=77)
    return t


@pytest.mark.parametrize("compute_us, wait_in_op, exposed_pct, vocabulary", [
    (400, False, 40.0, "current"), (400, True, 40.0, "current"), (400, False, 40.0, "2021"),
    (300 + 10 * (50 - EXPOSED_COMM_MIN_PCT), False, EXPOSED_COMM_MIN_PCT, "current"),
    (301 + 10 * (50 - EXPOSED_COMM_MIN_PCT), False, EXPOSED_COMM_MIN_PCT - 0.1, "current")])
def test_exposed_communication_on_a_cpu_by_hand(tmp_path, compute_us, wait_in_op, exposed_pct,
                                                vocabulary):
    """On a CPU the all-reduce is exposed where it runs with no operator but its own call: of its
    300..800 µs, what the training thread's operators (0..compute_us) do not cover, out of the
    1000 µs window. The verdict fires from EXPOSED_COMM_MIN_PCT on, as on a GPU. In the 2021
    vocabulary, where every range is an "Operator", the gloo span is still no operator."""
    result = analysed(tmp_path, cpu_comm_step(compute_us, wait_in_op, vocabulary))
    assert result["device"] == "cpu" and result["distributed"]["comm_pct"] == pytest.approx(50.0)
    assert result["cpu"]["exposed_comm_pct"] == pytest.approx(exposed_pct)
    assert ("exposed_communication" in ids(result)) == (exposed_pct >= EXPOSED_COMM_MIN_PCT)


@pytest.mark.parametrize("keep_call", [False, True])
def test_collectives_with_no_operator_in_the_steps_fire_nothing_on_a_cpu(tmp_path, keep_call):
    """A rank's trace of its all-reduces alone (no operator of its own recorded, its c10d call
    or not): nothing shows what could have hidden them, so nothing is read as exposed."""
    built = cpu_comm_step(400)
    built.events = [event for event in built.events
                    if event["cat"] != "cpu_op" or (keep_call and event["name"].startswith("c10d"))]
    result = analysed(tmp_path, built)
    assert result["cpu"]["exposed_comm_pct"] is None
    assert "exposed_communication" not in ids(result)


@pytest.mark.parametrize("name, collective", [
    (NCCL_ALL_REDUCE, True),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", True),
    ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 8>(...)", True),
    ("void deep_ep::intranode::dispatch<8, 768>(...)", True),
    ("void vllm::cross_device_reduce_1stage<c10::BFloat16, 8>(...)", True),
    ("void cub::DeviceReduceKernel<...>", False),  # a reduction inside one GPU
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ...>>", False),
    (BF16_GEMM, False),
])
def test_collective_kernels_by_name(name, collective):
    assert trace_columns.is_collective_kernel(name) is collective


@pytest.mark.parametrize("gpu_busy_during, is_initialization", [(False, True), (True, False)])
def test_a_long_launch_on_an_idle_gpu_is_initialization(tmp_path, gpu_busy_during,
                                                         is_initialization):
    """The fifth of ten launch calls takes INIT_LAUNCH_MIN_MS. With the GPU idle meanwhile it
    waited for nothing on the GPU: start-up (module loading, context creation), said in a
    warning. With a long kernel running through it, it waited for a full launch queue: steady
    state, no warning."""
    long_us = INIT_LAUNCH_MIN_MS * 1000
    t = KinetoTrace()
    t.gpu()
    t.step(1, T0, 2 * long_us)
    at = T0
    for k in range(10):
        dur = long_us if k == 4 else 5
        kernel_us = long_us if gpu_busy_during and k == 3 else 10
        t.launch(at, dur, at + (dur if k == 4 else 8), kernel_us)
        at += dur + 20
    result = analysed(tmp_path, t)
    if not is_initialization:
        assert result["initialization"] is None and result["warnings"] == []
        return
    found = result["initialization"]
    assert [span["kind"] for span in found["spans"]] == ["long_launch"]
    assert found["spans"][0]["ms"] == pytest.approx(INIT_LAUNCH_MIN_MS)
    assert len(result["warnings"]) == 1 and "initialization" in result["warnings"][0]


def test_memory_advice_follows_training_or_inference(tmp_path):
    """At 90 % of the GPU's memory: in training the fix is activation checkpointing (its demo);
    without a backward pass nothing keeps activations for one, so the fix is another."""
    from tests.kineto_builder import H100_MEMORY_BYTES, simulate_training

    def run(backward: bool) -> dict:
        t = KinetoTrace()
        t.gpu()
        simulate_training(t, peak_memory_bytes=int(0.9 * H100_MEMORY_BYTES), backward=backward)
        return next(f for f in analysed(tmp_path, t)["findings"] if f["id"] == "activation_memory")

    trained, served = run(backward=True), run(backward=False)
    assert "checkpoint" in trained["fix"] and trained["demo"] == "activation_checkpointing"
    assert "checkpoint" not in served["fix"] and "inference" in served["fix"]
    assert served["demo"] is None
