"""Small batch or launch overhead: on a GPU both show short kernels on an idle GPU, and a small
batch is launch bound too. The batch dimension of the forward conv/linear inputs (record_shapes'
"Input Dims") tells them apart; without shapes the launch-overhead finding names both fixes."""
from __future__ import annotations

import pytest

from common import analyze, trace_columns, verdicts
from tests.conftest import ROOT
from tests.kineto_builder import BF16_GEMM, ELEMENTWISE, KinetoTrace, simulate_training

SHARED_TRACES = ROOT.parent / "shared" / "traces"  # real traces from other people's GPUs

# The timing of small_batch/bad on a GPU: 300 kernels of 5 µs per step, each behind a 7 µs launch
# call, one launch every 20 µs. By hand: each kernel ends (launch + 3 + 5 µs) before the next
# launch, so the GPU is busy 5 of every 20 µs (25 %); launch time / kernel time = 7 / 5 = 1.4x;
# every kernel is short (< 10 µs): launch bound and under-filled at once.
UNDERFILLED_LAUNCH_BOUND = dict(kernels_per_step=300, kernel_us=5, launch_us=7, launch_gap_us=20)

# "Input Dims" as Kineto writes them: one list per argument, [] for a non-tensor.
RESNET_CONV_BATCH_8 = [[8, 3, 128, 128], [64, 3, 7, 7], [], [], [], [], []]
RESNET_FC_BATCH_8 = [[8, 512], [1000, 512], [1000]]
MLP_LINEAR_BATCH_64 = [[64, 256], [256, 256], [256]]  # the launch_overhead demo's GPU preset


def gpu_run(layers: list[tuple[str, list]], **timing) -> KinetoTrace:
    """simulate_training with `layers` ((op name, Input Dims) each) called in every step, as the
    forward pass of a model profiled with record_shapes=True calls them."""
    built = KinetoTrace()
    built.gpu()
    simulate_training(built, **timing)
    step_starts = [e["ts"] for e in list(built.events)
                   if e.get("ph") == "X" and e["pid"] == built.cpu_pid
                   and e["name"].startswith("ProfilerStep#")]
    for step_start in step_starts:
        for index, (name, dims) in enumerate(layers):
            built.span("op", name, step_start + 1 + index, 1, **{"Input Dims": dims})
    return built


def analysed(tmp_path, built: KinetoTrace) -> dict:
    return analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))


def by_id(result: dict) -> dict[str, dict]:
    return {found["id"]: found for found in result["findings"]}


def test_the_timing_alone_is_both_underfilled_and_launch_bound(tmp_path):
    """The premise of the cases below, by hand (UNDERFILLED_LAUNCH_BOUND)."""
    gpu = analysed(tmp_path, gpu_run([], **UNDERFILLED_LAUNCH_BOUND))["gpu"]
    assert gpu["utilization_pct"] == pytest.approx(25.0)
    assert gpu["median_kernel_us"] == pytest.approx(5.0)
    assert gpu["short_kernel_pct"] == pytest.approx(100.0)
    assert gpu["launch_ms_per_step"] / gpu["kernel_ms_per_step"] == pytest.approx(1.4)


def test_a_small_batch_is_named_small_batch_and_points_to_launch_overhead(tmp_path):
    """small_batch/bad on a GPU: ResNet at batch 8, launch bound. demos/small_batch/README.md
    promises the small_batch verdict; the launch-overhead fix is the one for a batch that cannot
    grow."""
    result = analysed(tmp_path, gpu_run([("aten::conv2d", RESNET_CONV_BATCH_8)] * 3
                                        + [("aten::linear", RESNET_FC_BATCH_8)],
                                        **UNDERFILLED_LAUNCH_BOUND))
    assert result["input_batch"] == 8
    assert [f["id"] for f in result["findings"]] == ["small_batch"]
    found = by_id(result)["small_batch"]
    assert found["demo"] == "small_batch"
    assert "batch 8 at the conv/linear inputs (< 64)" in found["evidence"]
    assert "1.4x" in found["evidence"]  # and says it is launch bound, with the numbers
    assert "larger batch" in found["fix"] and "demos/launch_overhead/" in found["fix"]


def test_many_small_ops_at_a_large_batch_are_launch_overhead(tmp_path):
    """The same timing from an MLP of tiny elementwise kernels at batch 64 (the launch_overhead
    demo): the batch is not what leaves the kernels empty."""
    # A backward region in each step: a training step, whose fix the launch_overhead pair shows
    # (the same trace without one is inference, pointed at llm_decode: test_cuda_graphs.py).
    result = analysed(tmp_path, gpu_run([("aten::linear", MLP_LINEAR_BATCH_64)] * 4
                                        + [("backward", [])],
                                        kernel_name=ELEMENTWISE, **UNDERFILLED_LAUNCH_BOUND))
    assert result["input_batch"] == 64 and result["training"] is True
    assert [f["id"] for f in result["findings"]] == ["launch_overhead"]
    found = by_id(result)["launch_overhead"]
    assert found["demo"] == "launch_overhead" and "torch.compile" in found["fix"]
    assert "batch 64" in found["evidence"] and "small_batch" not in found["fix"]


def test_a_linear_layers_batch_is_its_rows(tmp_path):
    """A transformer's linear layers see batch x positions rows: 4 sequences of 128 tokens are
    512 rows, not a batch of 4."""
    result = analysed(tmp_path, gpu_run([("aten::linear", [[4, 128, 256], [256, 256], [256]])],
                                        kernel_name=ELEMENTWISE, **UNDERFILLED_LAUNCH_BOUND))
    assert result["input_batch"] == 4 * 128
    assert [f["id"] for f in result["findings"]] == ["launch_overhead"]


@pytest.mark.parametrize("rows, verdict", [(63, "small_batch"), (64, "launch_overhead")])
def test_the_batch_threshold_is_the_boundary(tmp_path, rows, verdict):
    assert verdicts.SMALL_BATCH_INPUT_BATCH_BELOW == 64
    result = analysed(tmp_path, gpu_run([("aten::linear", [[rows, 256], [256, 256], [256]])],
                                        **UNDERFILLED_LAUNCH_BOUND))
    assert [f["id"] for f in result["findings"]] == [verdict]


def test_without_shapes_the_launch_finding_names_both_fixes(tmp_path):
    """A trace recorded without record_shapes cannot tell the two apart: one finding, launch
    overhead, whose fix also points to the small_batch demo."""
    result = analysed(tmp_path, gpu_run([], **UNDERFILLED_LAUNCH_BOUND))
    assert result["input_batch"] is None
    assert [f["id"] for f in result["findings"]] == ["launch_overhead"]
    fix = by_id(result)["launch_overhead"]["fix"]
    assert "torch.compile" in fix and "demos/small_batch/" in fix and "record_shapes" in fix


@pytest.mark.parametrize("layers", [[], [("aten::conv2d", RESNET_CONV_BATCH_8)]])
def test_a_launch_bound_run_with_a_busy_gpu_is_launch_overhead(tmp_path, layers):
    """4 µs kernels launched every 8 µs keep the GPU 50 % busy: not under-filled, so the timing
    does not fit a small batch and the fix names launch overhead alone, whatever the batch (and
    a batch of 8 is not called "not small")."""
    result = analysed(tmp_path, gpu_run(layers, kernel_us=4, launch_us=6, launch_gap_us=8,
                                        kernels_per_step=200))
    assert result["gpu"]["utilization_pct"] == pytest.approx(50.0)
    assert [f["id"] for f in result["findings"]] == ["launch_overhead"]
    found = by_id(result)["launch_overhead"]
    assert "small_batch" not in found["fix"] and "not small" not in found["evidence"]


@pytest.mark.parametrize("layers", [[("aten::conv2d", [[256, 3, 128, 128], [64, 3, 7, 7], [],
                                                       [], [], [], []])],
                                    [("aten::conv2d", RESNET_CONV_BATCH_8)]])
def test_a_busy_gpu_gets_neither_verdict_whatever_the_batch(tmp_path, layers):
    """200 µs bf16 GEMMs back to back: a healthy run at batch 256, and at batch 8 too (the shapes
    alone never make a verdict)."""
    result = analysed(tmp_path, gpu_run(layers, kernel_name=BF16_GEMM))
    assert result["gpu"]["utilization_pct"] > 95
    assert result["findings"] == []


def test_input_batch_is_the_median_over_the_window(tmp_path):
    """Calls outside the profiled steps do not count; the median of 8, 8, 8 and 512 is 8."""
    built = gpu_run([("aten::conv2d", RESNET_CONV_BATCH_8)] * 3
                    + [("aten::linear", [[512, 10], [10, 10], [10]])], steps=2)
    first_step = min(e["ts"] for e in built.events if e["name"] == "ProfilerStep#1")
    built.span("op", "aten::linear", first_step - 500, 1,
               **{"Input Dims": [[4096, 10], [10, 10], [10]]})  # before the steps: not counted
    assert analysed(tmp_path, built)["input_batch"] == 8


@pytest.mark.parametrize("name, dims, batch", [
    ("aten::conv2d", RESNET_CONV_BATCH_8, 8),
    ("aten::conv2d", [[3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []], 1),  # unbatched input
    ("aten::conv1d", [[16, 80, 3000], [512, 80, 3], [512], [], [], [], []], 16),
    ("aten::linear", [[4, 128, 256], [256, 256], [256]], 512),
    ("aten::linear", [[256], [10, 256], [10]], 1),  # one sample, no batch dimension
    ("aten::linear", [[], [10, 256], [10]], None),  # no shape recorded for the input
    ("aten::linear", None, None),  # record_shapes=False: no "Input Dims"
    ("aten::conv2d", [["8", 3, 32, 32]], None),  # not a shape
])
def test_input_batch_of_one_call(name, dims, batch):
    assert trace_columns.input_batch_of(name, dims) == batch


def test_layer_ops_still_count_as_cpu_exec(tmp_path):
    """Reading their shapes must not drop conv/linear calls from the plugin-style CPU Exec."""
    built = KinetoTrace()
    built.step(1, 1_000_000, 1000)
    built.span("op", "aten::conv2d", 1_000_100, 400, **{"Input Dims": RESNET_CONV_BATCH_8})
    built.op("aten::relu", 1_000_600, 100)
    result = analysed(tmp_path, built)
    assert result["step_breakdown_ms"]["cpu_exec"] == pytest.approx(0.5)
    assert result["input_batch"] == 8 and result["gpu"] is None
    # Half the step outside its two operators: Python between them, on a CPU run.
    assert [f["id"] for f in result["findings"]] == ["python_between_ops"]


def test_a_linear_layer_s_batch_reads_as_its_rows_and_says_so(tmp_path):
    """A transformer's linear layers see 16 sequences of 64 tokens as 1024 rows (what its GEMMs
    fill, so what the small-batch rule reads); the line that prints it says they are rows."""
    built = KinetoTrace()
    built.step(1, 1_000_000, 1000)
    built.span("op", "aten::linear", 1_000_100, 400,
               **{"Input Dims": [[16, 64, 256], [1024, 256], [1024]]})
    result = analysed(tmp_path, built)
    assert result["input_batch"] == 16 * 64
    assert ("batch        1024 (median of the forward conv/linear inputs from record_shapes: a "
            "convolution's samples, a linear layer's rows, samples x positions)"
            in analyze.format_human(result).splitlines())


@pytest.mark.parametrize("name, batch, says, findings", [
    # one aten::linear in the steps, Input Dims [[5, 128], [128, 128], [128]]; GPU 1 % busy. Its
    # two input copies are blocking hipMemcpyWithStream calls (syncs inside aten::copy_): the GPU
    # idles 5.1 % of the window after them, so h2d_copy fires too (tests/test_real_traces.py);
    # its GEMMs (Tensile Cijk_..._SB_...: FP32 inputs) are 27 % of kernel time: fp32_matmul
    # The window is mostly initialization (its first add kernel's 6.5 ms launch: lazy loading),
    # so the verdicts that read idle time, small_batch and h2d_copy among them, are withheld.
    ("mi250_rocm_3steps.json.gz", 5, "batch 5 at the conv/linear inputs (< 64)",
     ["initialization", "fp32_matmul"]),
    # ten aten::linear calls, all [[4096, 100], ...] or [[4096, 2798], ...]; GPU 32 % busy with
    # 4 µs kernels, not launch bound: the timing says under-filled, the evidence says the shapes
    # disagree
    ("a100_80gb_rank0_5steps.json.gz", 4096, "but batch 4096 at the conv/linear inputs is not "
                                             "small", ["small_batch"]),
])
def test_input_batch_of_real_traces(name, batch, says, findings):
    path = SHARED_TRACES / name
    if not path.is_file():
        pytest.skip(f"{path} is not in this checkout")
    result = analyze.analyze_trace(path)
    assert result["input_batch"] == batch
    assert [f["id"] for f in result["findings"]] == findings
    assert says in verdicts.rule_small_batch(result)["evidence"]  # the rule, withheld or not
