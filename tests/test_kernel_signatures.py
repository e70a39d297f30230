"""Hand-written kernels read by their demangled signature (common/kernel_names.py): a GEMM-like
kernel whose parameters and template arguments name only float operands runs FP32 math on the
CUDA cores unless its name says tensor cores (WMMA, mma); half and bfloat16 operands are 16-bit,
on the CUDA cores without such a marker. Names with no types, or with types these rules leave
alone (double, 8-bit, complex), are read as they were. Then the fp32_matmul verdict on a
hand-built trace of one cold call, and the rule on every kernel name of the real traces."""
from __future__ import annotations

import pytest

from common import analyze, kernel_names
from common.verdicts import FP32_GEMM_MIN_PCT, SEVERITY_HIGH_FACTOR
from tests.kineto_builder import BF16_GEMM, ELEMENTWISE, KinetoTrace
from tests.test_kernel_names import SHARED_TRACES, kernels, needs_shared_traces

T4_NAME = "Tesla T4"  # Turing: FP16 tensor cores, no BF16 or TF32 ones
T4_MEMORY_BYTES = 15_828_320_256
T0 = 1_000_000.0  # µs
EPS = 1e-6  # the relative step either side of a threshold, as in test_verdict_edges

# A custom CUDA matmul, as CUPTI records a plain (untemplated) function.
FP32_MATMUL = "matmul_k(float*, float*, float*, int)"
FP16_MATMUL = "void matmul_k<__half>(__half const*, __half const*, __half*, int)"

# (name, is_gemm, uses_tensor_cores, uses_tf32, signature_precision)
CASES = [
    # --- Float operands only, no tensor-core marker: FP32 on the CUDA cores.
    (FP32_MATMUL, True, False, False, "fp32"),
    ("gemm_kernel<float>", True, False, False, "fp32"),  # template arguments, no parameters
    ("void sgemm_naive(int, int, int, float, float const*, float const*, float, float*)",
     True, False, False, "fp32"),
    ("void matmul_tiled<32>(float const* __restrict__, float const* __restrict__, float*, int, "
     "int, int)", True, False, False, "fp32"),
    ("void matmul_vec4(float4 const*, float4 const*, float4*, int)", True, False, False, "fp32"),
    # Newly GEMMs, by a word of the function's own name, only with readable types: the CUDA
    # samples' matrixMul, "mm" and "bmm" as words.
    ("void matrixMulCUDA<32>(float*, float*, float*, int, int)", True, False, False, "fp32"),
    ("mm_kernel(float const*, float const*, float*, int, int, int)", True, False, False, "fp32"),
    ("void batched::bmm<float>(float const*, float const*, float*, long)", True, False, False,
     "fp32"),
    # --- 16-bit operands (a float accumulator or scale beside them does not change that).
    (FP16_MATMUL, True, False, False, "fp16"),
    ("void foo_gemm<__half, 128>(__half const*, __half const*, float*, int)", True, False, False,
     "fp16"),
    ("matmul_k(half*, half*, half*, int)", True, False, False, "fp16"),
    ("void matmul_h2(__half2 const*, __half2 const*, __half2*, int)", True, False, False, "fp16"),
    ("void matmul_k<c10::Half>(c10::Half const*, c10::Half const*, c10::Half*, int)",
     True, False, False, "fp16"),
    ("void matmul_k<__nv_bfloat16>(__nv_bfloat16 const*, __nv_bfloat16 const*, float*, int)",
     True, False, False, "bf16"),
    ("void at::native::(anonymous namespace)::tiled_mm<c10::BFloat16>(c10::BFloat16 const*, "
     "c10::BFloat16 const*, float*, int)", True, False, False, "bf16"),
    ("matmul_k(bf16*, bf16*, float*, int)", True, False, False, "bf16"),
    ("void gemm_mixed<__half, __nv_bfloat16>(__half const*, __nv_bfloat16 const*, float*)",
     True, False, False, "16-bit"),
    # vLLM's GPTQ (exllama) kernel: half2 FMAs on the CUDA cores.
    ("void vllm::gptq::gemm_half_q_half_gptq_4bit_kernel<true, 1>(__half const*, unsigned int "
     "const*, unsigned int const*, __half const*, __half*, int, int, int, int, int const*)",
     True, False, False, "fp16"),
    # --- A tensor-core marker in the name: WMMA, "mma" as a word, a PTX MMA shape.
    ("void simple_wmma_gemm(__half*, __half*, float*, float*, int, int, int, float, float)",
     True, True, False, "fp16"),  # the CUDA samples' WMMA GEMM
    ("void gemm_mma_sync<__nv_bfloat16>(__nv_bfloat16 const*, __nv_bfloat16 const*, float*, int)",
     True, True, False, "bf16"),
    ("void vllm::awq::gemm_forward_4bit_cuda_m16nXk32<128>(int, int, __half*, int*, __half*, "
     "int*, int, int, int, __half*)", True, True, False, "fp16"),  # AWQ: mma.sync m16n8k16
    ("void mfma_gemm<_Float16>(_Float16 const*, _Float16 const*, float*, int)", True, True, False,
     "fp16"),  # HIP: AMD's MFMA intrinsics
    ("void hip_gemm<_Float16>(_Float16 const*, _Float16 const*, float*, int)", True, False, False,
     "fp16"),  # HIP without MFMA: vector ALU math
    ("void matmul_tensor_core(float const*, float const*, float*, int)", True, True, True,
     "fp32"),  # float operands on the tensor cores: TF32 is the only way
    ("void wmma_matmul_k<float>(float const*, float const*, float*, int)", True, True, True,
     "fp32"),
    # --- No type, or types left alone: read as before (see test_left_alone_reads_as_before).
    ("matmul_k", True, True, False, None),  # no types: the typeless (Triton) rule, no guess
    ("matmul_k(double*, double*, double*, int)", True, True, False, None),
    ("matmul_k(signed char const*, signed char const*, int*, int)", True, True, False, None),
    ("matmul_k(c10::complex<float> const*, c10::complex<float>*, int)", True, True, False, None),
    ("matmul_k(float const*, unsigned char const*, float*, int)", True, True, False, None),
    ("void matmul_k<__nv_fp8_e4m3>(__nv_fp8_e4m3 const*, __nv_fp8_e4m3 const*, float*)",
     True, True, False, None),
    ("mm_kernel", False, False, False, None),  # "mm" words count only with readable types
    ("mm_kernel(int const*, int const*, int*, int)", False, False, False, None),
    # --- Not GEMMs, whatever their types.
    (ELEMENTWISE, False, False, False, None),  # its Array<char*, 3>: a byte type, left alone
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::"
     "func_wrapper_t<float, at::native::sum_functor<float, float, float>>>>(...)", False, False,
     False, "bf16"),
    ("void comm_summ_kernel(float*, int)", False, False, False, "fp32"),  # "mm" inside words
    # --- Library names keep their rules: cuBLAS's small-N FP32 kernel (CUDA cores, as before);
    # CUTLASS's SIMT GEMM, whose cutlass::arch::Mma (FMA, shape 1x1x1) is no tensor-core marker.
    ("void gemmSN_TN_kernel<float, 128, 16, 2, 4, 8, 9, false, cublasGemvTensorStridedBatched"
     "<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched"
     "<float> >(cublasGemmSmallNParams<cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float>)",
     True, False, False, "fp32"),
    ("void cutlass::Kernel<cutlass::gemm::kernel::Gemm<cutlass::gemm::threadblock::MmaPipelined<"
     "cutlass::gemm::GemmShape<128, 128, 8>, cutlass::half_t, cutlass::layout::RowMajor, "
     "cutlass::arch::Mma<cutlass::gemm::GemmShape<1, 1, 1>, 1, cutlass::half_t, "
     "cutlass::layout::RowMajor, cutlass::half_t, cutlass::layout::ColumnMajor, float, "
     "cutlass::layout::RowMajor, cutlass::arch::OpMultiplyAdd>>>>(...)", True, False, False,
     "fp16"),
]


@pytest.mark.parametrize("name, gemm, tensor_cores, tf32, precision", CASES,
                         ids=[case[0][:70] for case in CASES])
def test_kernel_signature(name, gemm, tensor_cores, tf32, precision):
    assert kernel_names.signature_precision(name) == precision
    assert kernel_names.is_gemm(name.lower()) is gemm
    assert kernel_names.uses_tensor_cores(name) is tensor_cores
    assert kernel_names.uses_tf32(name) is tf32


@pytest.mark.parametrize("name", [
    "matmul_k(double*, double*, double*, int)",
    "matmul_k(signed char const*, signed char const*, int*, int)",
    "matmul_k(c10::complex<float> const*, c10::complex<float>*, int)",
    "matmul_k(float const*, unsigned char const*, float*, int)",  # int8 weights, float scales
    "void gemm_fp16_kernel(__half*, __half*, __half*, int)",  # its name's tag decides, as before
])
def test_left_alone_reads_as_before(name):
    """A signature whose types the rule leaves alone, or a name whose own tags decide: the
    kernel is read as the same name without its signature (as before signatures were read)."""
    bare = name.removeprefix("void ").split("(")[0].split("<")[0]
    assert kernel_names.is_gemm(name.lower()) == kernel_names.is_gemm(bare.lower())
    assert kernel_names.uses_tensor_cores(name) == kernel_names.uses_tensor_cores(bare)


@pytest.mark.parametrize("name, precision", [
    (FP32_MATMUL, "fp32"),
    (FP16_MATMUL, "fp16"),
    ("void matrixMulCUDA<32>(float*, float*, float*, int, int)", "fp32"),
    ("void at::native::(anonymous namespace)::tiled_mm<c10::BFloat16>(c10::BFloat16 const*, "
     "float*, int)", "bf16"),
    ("matmul_k", None),  # no signature: a Triton kernel, not one's own C++
    # Library kernels with signatures, named gemm: autocast reaches them (real trace names).
    ("void sgemm_largek_lds64<true, false, 5, 5, 4, 4, 4, 34>(float*, float const*, float const*, "
     "int, int, int, int, int, int, float const*, float const*, float, float, int, int, int*, "
     "int*)", None),
    ("void sgemm_naive(int, int, int, float, float const*, float const*, float, float*)", None),
    ("void cutlass::matmul_kernel<float>(float const*, float*)", None),  # a library's name
    ("void _finalize_matmul_scatter<float>(float const*, float*)", None),  # no GEMM
])
def test_handwritten_gemm_precision(name, precision):
    """Which GEMMs are one's own (what fp32_matmul's fix would say autocast does not reach)."""
    assert kernel_names.handwritten_gemm_precision(name) == precision


def test_signature_is_read_case_blind_and_whole_words():
    """c10::Half and C10::HALF read alike; "half" inside a word (behalf, halfway) is no type."""
    assert kernel_names.signature_precision("MATMUL_K(C10::HALF*, FLOAT*)") == "fp16"
    assert kernel_names.signature_precision("matmul_k(behalf_t*, halfway*, float*)") == "fp32"
    assert kernel_names.signature_precision("matmul_k(floatish*, int)") is None


# --- The verdict: one cold call, no schedule, on a T4. -----------------------------------------

def cold_call(kernel_name: str, kernel_us: float, rest_name: str = ELEMENTWISE,
              rest_us: float = 30.0) -> KinetoTrace:
    """profile() around one call: one step, the kernel and then `rest_name` back to back, and a
    synchronize that waits for both (the GPU stays busy: no other rule in play)."""
    built = KinetoTrace()
    built.gpu(name=T4_NAME, total_memory_bytes=T4_MEMORY_BYTES)
    built.step(1, T0, kernel_us + rest_us + 20)
    built.launch(T0 + 1, 1, T0 + 5, kernel_us, name=kernel_name)
    built.launch(T0 + 2, 1, T0 + 5 + kernel_us, rest_us, name=rest_name)
    built.runtime("cudaDeviceSynchronize", T0 + 3, kernel_us + rest_us + 5)
    return built


def analysed(tmp_path, built: KinetoTrace) -> dict:
    return analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))


def test_a_hand_written_fp32_matmul_on_a_t4_fires_fp32_matmul(tmp_path):
    """matmul_k(float*, float*, float*, int) holds 99.7 % of kernel time on a T4: FP32 math on
    the CUDA cores, read from its signature. Before, the typeless-name rule for Triton counted it
    on tensor cores (tensor cores 99.7 %) and no verdict fired."""
    result = analysed(tmp_path, cold_call(FP32_MATMUL, 9970.0))
    gpu = result["gpu"]
    assert result["gpu_name"] == T4_NAME
    assert gpu["gemm_pct"] == pytest.approx(99.7)
    assert gpu["non_tensor_core_gemm_pct"] == pytest.approx(99.7)
    assert gpu["tensor_core_pct"] == 0.0 and gpu["tf32_pct"] == 0.0
    [finding] = [f for f in result["findings"] if f["id"] == "fp32_matmul"]
    assert finding["severity"] == "high"  # 99.7 >= SEVERITY_HIGH_FACTOR x 20
    assert 99.7 >= SEVERITY_HIGH_FACTOR * FP32_GEMM_MIN_PCT


@pytest.mark.parametrize("pct, fires", [
    pytest.param(FP32_GEMM_MIN_PCT * (1 - EPS), False, id="below"),
    pytest.param(FP32_GEMM_MIN_PCT, True, id="at"),
    pytest.param(FP32_GEMM_MIN_PCT * (1 + EPS), True, id="above")])
def test_hand_written_fp32_share_edges(tmp_path, pct, fires):
    """The hand-written FP32 matmul at pct % of 1000 µs of kernel time, a bf16 cuBLAS GEMM the
    rest: fp32_matmul from FP32_GEMM_MIN_PCT on, as for a library's FP32 GEMM."""
    kernel_us = 1000.0
    fp32_us = kernel_us * pct / 100  # at the threshold: a whole µs, so the share is exact
    result = analysed(tmp_path, cold_call(FP32_MATMUL, fp32_us, BF16_GEMM, kernel_us - fp32_us))
    share = result["gpu"]["non_tensor_core_gemm_pct"]
    assert share == pytest.approx(pct, rel=EPS / 100)
    assert (share >= FP32_GEMM_MIN_PCT) is fires  # the approximation did not cross the edge
    assert [f["id"] for f in result["findings"]] == (["fp32_matmul"] if fires else [])


def test_hand_written_fp16_matmul_counts_off_the_tensor_cores(tmp_path):
    """The same call in half: a GEMM, 16-bit, not on the tensor cores (no WMMA or MMA in its
    name), so the tensor-core share stays 0 instead of 99.7."""
    gpu = analysed(tmp_path, cold_call(FP16_MATMUL, 9970.0))["gpu"]
    assert gpu["gemm_pct"] == pytest.approx(99.7)
    assert gpu["tensor_core_pct"] == 0.0


def test_hand_written_fp16_matmul_is_no_fp32_math(tmp_path):
    """A 16-bit GEMM on the CUDA cores is no FP32 math: autocast has nothing to cast down, so
    fp32_matmul must not fire on it."""
    result = analysed(tmp_path, cold_call(FP16_MATMUL, 9970.0))
    assert "fp32_matmul" not in [f["id"] for f in result["findings"]]


# --- Real traces. -------------------------------------------------------------------------------

@needs_shared_traces
def test_real_gemms_with_a_signature_are_fp32_off_the_tensor_cores():
    """On the real traces, every GEMM whose signature gives its types is an FP32 kernel that was
    already read as off the tensor cores (cuBLAS's gemmSN, gemmk1, magma_sgemmEx, sgemm_largek;
    cuDNN's implicit_convolve_sgemm; and FBGEMM's kernels, GEMMs by their namespace's "gemm"),
    and no kernel is one's own GEMM (matmul, mm, bmm, matrixMul with a signature)."""
    signed = set()
    for trace in sorted(path.name for path in SHARED_TRACES.glob("*.json.gz")):
        for name in kernels(trace)[0]:
            assert kernel_names.handwritten_gemm_precision(name) is None, name
            if kernel_names.is_gemm(name.lower()) and kernel_names.signature_precision(name):
                signed.add(name)
                assert kernel_names.signature_precision(name) == "fp32", name
                assert not kernel_names.uses_tensor_cores(name), name
                assert "gemm" in name.lower(), name
    assert len(signed) >= 10  # the names above, seen on the A100 and V100 traces
