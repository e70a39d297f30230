"""A GPU-bound trace, where the CPU runs steps ahead of the GPU (as on the H100 reference run of
naive_attention): the steps the analyzer times follow the GPU and can start after the last host
step has ended. What the CPU did in its steps (softmax shapes, the optimizer's operators) must
still be read from the host steps, and the optimizer's time from its copy on the GPU timeline."""
from __future__ import annotations

import pytest

from common import analyze, idle_causes, trace_steps
from tests.kineto_builder import KinetoTrace

T0 = 1_000_000.0  # µs: the first host step
HOST_STEP_US = 1_000.0  # the CPU only enqueues: a millisecond a step
GPU_START_US = T0 + 50_000.0  # the GPU is still busy with earlier steps' kernels
MODEL_US, OPTIMIZER_US = 18_000.0, 2_000.0  # per step, on the GPU
GPU_STEP_US = MODEL_US + OPTIMIZER_US
SIDE = 2048  # tokens: a [batch, heads, s, s] softmax
OPTIMIZER_OPS = 40


def gpu_bound_trace() -> KinetoTrace:
    t = KinetoTrace()
    t.gpu()
    # The earlier steps' kernels (launched before the first recorded step) keep the GPU busy
    # until just before GPU_START_US.
    t.launch(T0 - 500, 10, T0 - 400, GPU_START_US - 10 - (T0 - 400))
    for index in range(3):
        host, gpu = T0 + index * HOST_STEP_US, GPU_START_US + index * GPU_STEP_US
        t.step(index + 1, host, HOST_STEP_US)
        t.span("op", "aten::softmax", host + 50, 20, **{"Input Dims": [[1, 2, SIDE, SIDE], [], []]})
        t.launch(host + 100, 10, gpu, MODEL_US)
        t.annotation("Optimizer.step#AdamW.step", host + 600, 300)  # the CPU's span: 0.3 ms
        for k in range(OPTIMIZER_OPS):
            t.op("aten::mul_", host + 600 + k * 7, 5)
        t.launch(host + 700, 10, gpu + MODEL_US, OPTIMIZER_US)
        t.span("gpu_annotation", "Optimizer.step#AdamW.step", gpu + MODEL_US, OPTIMIZER_US,
               pid=t.gpu_pid, tid=t.stream)
    return t


def test_cpu_side_metrics_come_from_the_host_steps(tmp_path):
    analysis = analyze.analyze(gpu_bound_trace().write(tmp_path / "t.pt.trace.json"))
    result = analysis.result
    assert analysis.window[0] == GPU_START_US - 10  # the timed steps follow the GPU
    assert result["step_ms"]["mean"] == pytest.approx(GPU_STEP_US / 1000, rel=1e-3)
    assert result["attention"] == {"square_softmax_max": SIDE, "sdpa_ops_per_step": 0.0}
    assert "naive_attention" in [f["id"] for f in result["findings"]]
    optimizer = result["optimizer"]
    assert optimizer["ops_per_step"] == OPTIMIZER_OPS
    # Its time is the GPU copy's (2 ms of the 20 ms step), longer than the CPU's 0.3 ms span less
    # the 10 µs launch call inside it.
    assert optimizer["gpu_ms_per_step"] == pytest.approx(OPTIMIZER_US / 1000)
    assert optimizer["cpu_ms_per_step"] == pytest.approx(0.29)
    assert optimizer["ms_per_step"] == pytest.approx(OPTIMIZER_US / 1000)
    assert optimizer["pct"] == pytest.approx(100 * OPTIMIZER_US / GPU_STEP_US, rel=1e-3)


def test_without_a_gpu_copy_the_cpu_span_times_the_optimizer(tmp_path):
    built = gpu_bound_trace()
    built.events = [e for e in built.events if e["cat"] != "gpu_user_annotation"]
    result = analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))
    optimizer = result["optimizer"]
    assert optimizer["gpu_ms_per_step"] is None
    assert optimizer["ms_per_step"] == pytest.approx(0.29)
    # A share of the window, as every share: 0.29 of each ~20 ms step, not of the CPU's 1 ms step
    # (30 %, which would pass the unfused_optimizer rule's 15 %).
    assert optimizer["pct"] == pytest.approx(100 * 0.29 / (GPU_STEP_US / 1000), rel=1e-3)
    assert "unfused_optimizer" not in [f["id"] for f in result["findings"]]


def test_a_cpu_bound_optimizer_is_timed_on_the_cpu(tmp_path):
    """A fused update (one short kernel) after a long CPU-side preparation: the GPU copy holds
    the kernel, the CPU's span outside runtime calls what the step pays."""
    t = KinetoTrace()
    t.gpu()
    for index in range(2):
        host = T0 + index * 10_000
        t.step(index + 1, host, 10_000)
        t.launch(host + 100, 10, host + 120, 1_000)  # the model
        t.annotation("Optimizer.step#AdamW.step", host + 2_000, 3_000)  # 3 ms on the CPU
        t.op("aten::_fused_adamw_", host + 2_000, 3_000)
        t.launch(host + 4_900, 50, host + 4_960, 30)  # one 30 µs kernel after a 50 µs launch
        t.span("gpu_annotation", "Optimizer.step#AdamW.step", host + 4_960, 30, pid=t.gpu_pid,
               tid=t.stream)
    optimizer = analyze.analyze_trace(t.write(tmp_path / "t.pt.trace.json"))["optimizer"]
    assert optimizer["gpu_ms_per_step"] == pytest.approx(0.030)
    assert optimizer["cpu_ms_per_step"] == pytest.approx(2.950)
    assert optimizer["ms_per_step"] == pytest.approx(2.950)
    assert optimizer["multi_tensor_ops_per_step"] == 1


def test_what_changed_reads_operators_in_the_host_steps(tmp_path):
    """compare's operator list: each operator's self time where the CPU ran it; kernels where the
    GPU did."""
    analysis = analyze.analyze(gpu_bound_trace().write(tmp_path / "t.pt.trace.json"))
    n_steps = analysis.steps.size
    by_name = trace_steps.time_by_name(analysis.columns, analysis.window, n_steps,
                                   host_window=analysis.host_window,
                                   compiling=idle_causes.compiling_operators(analysis.columns))
    assert by_name.operators["aten::softmax"] == pytest.approx((0.020, 1.0))
    assert by_name.operators["aten::mul_"] == pytest.approx((OPTIMIZER_OPS * 0.005,
                                                             OPTIMIZER_OPS))
    # The same operators, looked for in the window that follows the GPU: none are there.
    in_window = trace_steps.time_by_name(analysis.columns, analysis.window, n_steps,
                                     host_window=analysis.window,
                                     compiling=idle_causes.compiling_operators(analysis.columns))
    assert "aten::softmax" not in in_window.operators
    # Each step launched its two kernels (the model's, then the optimizer's) inside the window.
    assert sum(calls for _, calls in by_name.kernels.values()) == pytest.approx(2.0)
