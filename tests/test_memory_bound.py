"""memory_bound_kernels: a GPU busy in eager operators' memory-bound kernels (batch norm,
element-wise ops, layout conversions). Which names count (kernel_names.is_memory_bound_op), what
data they move (data_precision), the share of the window by hand, the rule's edges, and its reading
of real traces: a BF16 convolution net on an MI210 and the H100 reference's FP32 ResNet-50."""
from __future__ import annotations

import json

import pytest

from common import analyze, verdicts
from common.kernel_names import data_precision, is_memory_bound_op
from tests.conftest import ROOT
from tests.kineto_builder import (
    BF16_GEMM,
    ELEMENTWISE,
    FLASH_BF16_FWD,
    FP32_GEMM,
    NVJET_GEMM,
    KinetoTrace,
)

SHARED_TRACES = ROOT.parent / "shared" / "traces"  # real traces from other people's GPUs
H100 = ROOT / "traces" / "reference" / "h100"

# Names as the H100 and MI210 traces hold them (cut after the template arguments that matter).
BN_BACKWARD_BF16 = ("void at::native::batch_norm_backward_kernel<c10::BFloat16, float, float, "
                    "int>(at::GenericPackedTensorAccessor<c10::BFloat16 const, 3ul>)")
CUDNN_BN_FP32 = ("void cudnn::bn_bw_1C11_singleread<float, 512, true, 1, 2, 0>(cudnn::bn_bw_1C11_"
                 "args<float>)")
NCHW_TO_NHWC_BF16 = ("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, "
                     "__nv_bfloat16, float, false, true, (cudnnKernelDataType_t)0>(cudnn::"
                     "engines_precompiled::nchw2nhwc_params_t<float>)")
MIOPEN_TRANSPOSE = "batched_transpose_16x64_pack_1x4_ediv_1x2_half"
MIOPEN_SUBTENSOR = "SubTensorOpWithCastTensor1d"
ADD_BF16 = ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::"
            "BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
            "std::array<char*, 3ul>)")
FILL_FP64 = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<double>, "
             "std::array<char*, 1ul> >(int, at::native::FillFunctor<double>, std::array<char*, "
             "1ul>)")
FOREACH_ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                "(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
                "FusedAdamMathFunctor<float, 4>>(...)")
CAST_TO_BF16 = ("void at::native::unrolled_elementwise_kernel<at::native::bfloat16_copy_kernel_cuda(at"
                "::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda(float)#1}, "
                "std::array<char*, 2ul> >(int, at::native::bfloat16_copy_kernel_cuda)")
BN_STATS_FP32 = ("void at::native::batch_norm_update_stats_and_invert<float, float, long>(at::"
                 "GenericPackedTensorAccessor<float const, 3ul>, double, double, long)")
SOFTMAX_WARP_BF16 = ("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, "
                     "float, 9, false, false>(c10::BFloat16*, c10::BFloat16 const*, int, int, int)")
TRITON_FUSED = "triton_poi_fused__native_batch_norm_legit_functional_relu_0"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@pytest.mark.parametrize("name, counts, precision", [
    (ELEMENTWISE, True, "fp32"),  # float data; its char* array is ATen's untyped pointers
    (BN_BACKWARD_BF16, True, "16-bit"),  # BF16 data, FP32 statistics
    (CUDNN_BN_FP32, True, "fp32"),
    (NCHW_TO_NHWC_BF16, True, "16-bit"),
    (MIOPEN_TRANSPOSE, True, None),  # no signature: no type read
    (MIOPEN_SUBTENSOR, True, None),
    (ADD_BF16, True, "16-bit"),
    (FILL_FP64, True, None),  # FP64: neither of the two
    (CAST_TO_BF16, True, "16-bit"),  # reads float, writes BF16: autocast's own work
    (BN_STATS_FP32, True, "fp32"),  # float data; its doubles are momentum and eps
    (SOFTMAX_WARP_BF16, True, "16-bit"),  # ATen's softmax for short rows, outside at::native
    (FOREACH_ADAM, False, "fp32"),  # the optimizer's update, one launch per group already
    (TRITON_FUSED, False, None),  # Inductor's: fused already
    (BF16_GEMM, False, None), (NVJET_GEMM, False, None),  # matrix math
    (FLASH_BF16_FWD, False, "16-bit"),
    (NCCL, False, None),
])
def test_which_kernels_are_memory_bound_and_what_data_they_move(name, counts, precision):
    assert is_memory_bound_op(name) is counts
    assert data_precision(name) == precision


def busy_gpu(tmp_path, kernels: list[tuple[str, float]], steps: int = 3,
             idle_us: float = 0.0) -> dict:
    """A trace of `steps` steps, each the `kernels` ((name, µs)) back to back on one stream, each
    launched 10 µs before the GPU reaches it, then `idle_us` with nothing on the GPU; analysed."""
    built = KinetoTrace()
    built.gpu()
    at = 1_000_000.0
    for number in range(1, steps + 1):
        start = at
        gpu_at = at + 20.0
        for name, us in kernels:
            built.launch(gpu_at - 10.0, 5.0, gpu_at, us, name=name)
            gpu_at += us
        at = gpu_at + idle_us
        built.step(number, start, at - start)
    return analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))


def finding(result: dict) -> dict | None:
    return next((f for f in result["findings"] if f["id"] == "memory_bound_kernels"), None)


def test_the_share_is_of_the_window_by_hand(tmp_path):
    """Per step: 20 µs before the first kernel, 600 µs of FP32 batch norm, 380 µs of an FP32 GEMM,
    0 after: the window is 1,000 µs a step, 600 of them memory bound (60 %), all FP32, and the
    matmuls FP32 too (no autocast): BF16 first."""
    result = busy_gpu(tmp_path, [(CUDNN_BN_FP32, 600.0), (FP32_GEMM, 380.0)])
    assert result["gpu"]["memory_bound_pct"] == pytest.approx(60.0, abs=0.01)
    assert result["gpu"]["memory_bound_fp32_pct"] == pytest.approx(60.0, abs=0.01)
    found = finding(result)
    assert found["severity"] == "medium" and found["demo"] == "mixed_precision"
    assert found["fix"].startswith("BF16 first") and "torch.compile" in found["fix"]
    assert found["share_pct"] == pytest.approx(60.0, abs=0.01)
    assert "channels_last" not in found["fix"]  # no layout conversion in this trace


def test_fp32_data_beside_16_bit_matmuls_is_autocasts_own_and_is_fused_not_cast(tmp_path):
    """The same FP32 batch norm beside BF16 GEMMs: autocast is on already, its FP32 ops (a
    softmax, the casts) stay FP32 under it, so the advice is to fuse them."""
    result = busy_gpu(tmp_path, [(CUDNN_BN_FP32, 600.0), (BF16_GEMM, 380.0)])
    found = finding(result)
    assert result["gpu"]["memory_bound_fp32_pct"] == pytest.approx(60.0, abs=0.01)
    assert found["demo"] == "launch_overhead" and found["fix"].startswith("fuse them")


def test_overlapping_streams_count_once(tmp_path):
    """Per step a 500 µs batch norm on one stream with a 300 µs element-wise kernel under it on
    another (their union: 500 µs), then a layout conversion of 200 µs that runs 100 µs past the
    step's end. Three steps of 1,000 µs, each extended to the end of its GPU work (the next
    starts no earlier): a window of 3,300 µs holding 3 x 700 µs of memory-bound kernels."""
    built = KinetoTrace()
    built.gpu()
    compute_stream = built.stream
    at = 1_000_000.0
    for number in range(1, 4):
        built.launch(at + 1, 5, at + 100, 500, name=CUDNN_BN_FP32)
        built.stream = compute_stream + 1  # a side stream
        built.launch(at + 2, 5, at + 150, 300, name=ELEMENTWISE)
        built.stream = compute_stream
        built.launch(at + 3, 5, at + 900, 200, name=NCHW_TO_NHWC_BF16)
        built.step(number, at, 1_000.0)
        at += 1_100.0
    gpu = analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))["gpu"]
    window = 3 * 1_100.0
    assert gpu["memory_bound_pct"] == pytest.approx(100 * 3 * 700.0 / window, abs=0.01)
    assert gpu["memory_bound_fp32_pct"] == pytest.approx(100 * 3 * 500.0 / window, abs=0.01)
    assert gpu["layout_conversion_pct"] == pytest.approx(100 * 3 * 200.0 / window, abs=0.01)


@pytest.mark.parametrize("memory_bound_us, fires", [(490.0, False), (510.0, True)])
def test_the_rule_fires_from_half_the_window(tmp_path, memory_bound_us, fires):
    """49 % and 51 % of a 1,000 µs window (20 µs lead, the GEMM fills the rest)."""
    result = busy_gpu(tmp_path, [(ADD_BF16, memory_bound_us), (BF16_GEMM, 980.0 - memory_bound_us)])
    assert (finding(result) is not None) is fires
    assert verdicts.MEMORY_BOUND_MIN_PCT == 50.0  # the edge these two straddle


def test_an_idle_gpu_is_not_memory_bound_however_its_kernels_are_named(tmp_path):
    """Only memory-bound kernels, but 300 µs of them in each 1,000 µs window: the idle time is
    the step's problem, and the rules that read it speak."""
    result = busy_gpu(tmp_path, [(ADD_BF16, 300.0)], idle_us=680.0)
    assert result["gpu"]["memory_bound_pct"] == pytest.approx(30.0, abs=0.01)
    assert finding(result) is None


def test_16_bit_data_is_fused_not_cast_and_the_severity_rises_at_three_quarters(tmp_path):
    """BF16 data: no BF16 advice, torch.compile, launch_overhead's pair; 80 % of the window: high.
    FP32 on less than half the memory-bound time: still the 16-bit advice."""
    result = busy_gpu(tmp_path, [(BN_BACKWARD_BF16, 400.0), (ELEMENTWISE, 300.0),
                                 (NCHW_TO_NHWC_BF16, 100.0), (FP32_GEMM, 180.0)])
    found = finding(result)
    assert result["gpu"]["memory_bound_fp32_pct"] == pytest.approx(30.0, abs=0.01)
    assert found["severity"] == "high" and found["demo"] == "launch_overhead"
    assert "BF16" not in found["fix"] and found["fix"].startswith("fuse them: torch.compile")
    assert "conversions around the convolutions take 10.0 % of the window" in found["fix"]


@pytest.mark.parametrize("name", sorted(p.name for p in SHARED_TRACES.glob("*.json.gz")))
def test_real_traces_hold_the_share_inside_utilization(name):
    """On every real trace: the memory-bound kernels are part of the GPU's work (their share at
    most utilization), and their FP32 part of them."""
    gpu = analyze.analyze_trace(SHARED_TRACES / name)["gpu"]
    if not gpu:
        pytest.skip("no GPU in this trace")
    assert 0.0 <= gpu["memory_bound_fp32_pct"] <= gpu["memory_bound_pct"] + 1e-9
    assert gpu["memory_bound_pct"] <= gpu["utilization_pct"] + 1e-9


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="the shared real traces are not here")
def test_a_bf16_convolution_net_on_an_mi210_is_memory_bound():
    """mi210_gpu_only_no_cpu_ops: a BF16 training step of a convolution net; ATen's batch norm
    and element-wise kernels and MIOpen's transposes and sub-tensor ops beside its igemm
    convolutions. BF16 already: the fix is to fuse them."""
    result = analyze.analyze_trace(SHARED_TRACES / "mi210_gpu_only_no_cpu_ops.json.gz")
    found = finding(result)
    assert found is not None and found["demo"] == "launch_overhead"
    assert result["gpu"]["memory_bound_fp32_pct"] == pytest.approx(0.0, abs=0.5)


def test_the_h100_resnet50_in_fp32_names_bf16_first():
    """dataloader_workers/fixed in the H100 reference: ResNet-50 at batch 256 in FP32 (TF32
    convolutions), the GPU busy. Its batch norm and element-wise kernels move FP32 data most of
    the window: the verdict names BF16 first, as the ladder's BF16 rung follows its batch rung."""
    run = H100 / "dataloader_workers" / "fixed"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["batch_size"] == 256 and summary["config"]["autocast_dtype"] is None
    result = analyze.analyze_trace(run)
    found = finding(result)
    assert found is not None and found["demo"] == "mixed_precision"
    assert result["gpu"]["memory_bound_fp32_pct"] >= (
        verdicts.MEMORY_BOUND_FP32_MIN_SHARE * result["gpu"]["memory_bound_pct"])
