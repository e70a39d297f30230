"""Kernel-name rules (common/kernel_names.py) for AMD, Triton and Blackwell GEMM families: one
name, what it is (GEMM or not) and where it runs (tensor/matrix cores or not); then the rules on
real traces from other people (../shared/traces, see its README)."""
from __future__ import annotations

import gzip
import json
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from common import kernel_names
from tests.conftest import ROOT

SHARED_TRACES = ROOT.parent / "shared" / "traces"
needs_shared_traces = pytest.mark.skipif(
    not SHARED_TRACES.is_dir(),
    reason=f"{SHARED_TRACES} is missing: the real traces live beside the repository, in the "
           f"shared folder of this workplace")

TENSILE_TAIL = "_SN_LDSB1_AFC1_AFEM1_ASEM1_CLR1_CADS0_GRVWA8_GRVWB8_ISA942_IU1_K1_MIAV0_MIWT8_4"

# (name, is_gemm, uses_tensor_cores)
CASES = [
    # --- Tensile / hipBLASLt: the input type (first token after the layouts) and an MFMA decide.
    ("Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1" + TENSILE_TAIL,
     True, True),  # hipBLASLt bf16 (MI300X Qwen trace)
    ("Cijk_Ailk_Bjlk_BBS_BH_Bias_HAS_SAV_UserArgs_MT128x64x32_MI32x32x1" + TENSILE_TAIL,
     True, True),  # bf16 in and out, FP32 compute (MI210 trace)
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_APM1_GRVW4_ISA90a_MIAV1",
     True, True),  # half, older four-number MFMA token
    ("Cijk_Alik_Bljk_F8F8S_BH_Bias_HA_S_SAV_UserArgs_MT256x256x128_MI16x16x1" + TENSILE_TAIL,
     True, True),  # fp8
    ("Cijk_Alik_Bljk_B8F8S_BH_MT128x128x128_MI32x32x1_SN_ISA942", True, True),  # bf8 x fp8
    ("Cijk_Ailk_Bljk_I8II_BH_MT128x128x64_MI32x32x1_SN_ISA90a", True, True),  # int8
    ("Cijk_Ailk_Bljk_XS_BH_MT128x128x32_MI32x32x1_SN_ISA942", True, True),  # xf32: MI300's TF32
    ("Cijk_Ailk_Bjlk_SB_Bias_AS_SAV_UserArgs_MT64x16x16_MI16x16x1" + TENSILE_TAIL,
     True, False),  # FP32 on the matrix cores is still FP32 math (MI250 trace)
    ("Cijk_Ailk_Bljk_S_B_Bias_HA_S_SAV_UserArgs_MT16x16x128_MI16x16x1" + TENSILE_TAIL,
     True, False),  # hipBLASLt FP32 (MI300X Qwen trace: the rotary embedding's matmul)
    ("Cijk_Ailk_Bljk_DB_MT64x64x8_MI16x16x4x1_SN_ISA90a", True, False),  # FP64
    ("Cijk_Ailk_Bljk_HHS_BH_MT64x64x16_SN_GRVW4_ISA906_K1_MIAV0_MIWT1_1_TT4_4",
     True, False),  # half without an MFMA (MI50): VALU; MIAV/MIWT tokens are no MFMA
    ("Cijk_Ailk_Bljk_SB_MT128x64x8_SN_1LDSB0_APM1_GRVW4_ISA1030_FMA_MIAV0_TT8_8", True, False),
    # --- CUTLASS's tensorop as a word (or inside a cutlass:: C++ name); MIOpen's is no matrix work.
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8", True, True),
    ("cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_bf16_bf16_128x128x64_1x1x1_0_tnn_"
     "align8_warpspecialized_cooperative_epi_tma", True, True),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_"
     "32x4_nhwc_align8>(cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_"
     "align8::Params)", False, True),  # a cuDNN convolution: on tensor cores, not named a GEMM
    ("void cutlass::Kernel<cutlass::gemm::kernel::Gemm<cutlass::gemm::threadblock::MmaPipelined<"
     "cutlass::gemm::GemmShape<128, 128, 32>, cutlass::half_t, cutlass::layout::RowMajor, "
     "cutlass::arch::OpClassTensorOp, cutlass::gemm::threadblock::MmaPolicy<cutlass::gemm::warp"
     "::MmaTensorOp<cutlass::gemm::GemmShape<64, 64, 32>>>>>>(...)", True, True),
    ("SubTensorOpWithCastTensor1d", False, False),
    ("SubTensorOpWithScalar1d", False, False),
    ("SubTensorOpWithSubTensor3d", False, False),
    # --- Triton matmuls: "matmul" in the name; tensor cores by a type tag.
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_128x128x128x1_swiglu", True, True),  # vLLM MoE (MI300X)
    ("_p_matmul_ogs_NNT_bf16xbf16xmxfp4_128x256x64x1", True, True),
    ("_kernel_matmul_fp8_row_tma_persistent", True, True),  # FBGEMM
    ("_matmul_ogs_NNT_mxfp4xmxfp4_128x128x256x1", True, True),  # constructed: the fp4 tag alone
    # The Triton tutorial: no type in the name, so not taken for FP32 math (no fp32_matmul on a
    # guess); one that says f32 is.
    ("matmul_kernel", True, True),
    ("matmul_kernel_persistent", True, True),
    ("matmul_kernel_f32_ieee", True, False),  # constructed
    ("_finalize_matmul_scatter_bf16", False, False),  # scatter and sum after matmul_ogs
    # --- Inductor templates: an mm op as a word of a triton_tem_ name.
    ("triton_tem_fused_mm_0", True, True),
    ("triton_tem_fused_addmm_relu_1", True, True),
    ("triton_tem_fused_bmm_2", True, True),
    ("triton_tem_fused__scaled_mm_3", True, True),
    ("triton_tem_fused_convolution_4", True, True),
    ("triton_poi_fused_addmm_relu_0", False, False),  # the bias and ReLU after a cuBLAS GEMM
    ("triton_tem_fused_comm_summ_0", False, False),  # constructed: "mm" inside words only
    ("void c10d::intra_node_comm::oneShotAllReduceKernel<2u, true>(c10d::intra_node_comm::"
     "AllReduceParams)", False, False),
    ("void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 8, 4>(...)",
     False, False),
    ("triton_red_fused_cumsum_0", False, False),
    # --- Composable Kernel xdl (MFMA) kernels: a 16/8-bit type in the name.
    ("void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemmMultiD_ABScale_xdl_cshuffle_v3<"
     "ck::tensor_layout::gemm::RowMajor, ck::tensor_layout::gemm::ColumnMajor, ck::Tuple<>, "
     "ck::tensor_layout::gemm::RowMajor, ck::f8_fnuz_t, ck::f8_fnuz_t, float, float, ck::Tuple<>, "
     "unsigned short, ck::tensor_operation::element_wise::PassThrough>>(...)", True, True),
    ("void ck::tensor_operation::device::(anonymous namespace)::kernel_grouped_conv_fwd_xdl_"
     "cshuffle<ck::half_t, ck::half_t, float, ck::half_t>(...)", True, True),  # implicit GEMM
    ("device_grouped_conv_fwd_xdl_nhwc_kyxc_nhwk_BF16_256x128x128", True, True),
    ("void ck::kernel_gemm_xdl_cshuffle_v1<ck::GridwiseGemm_k0mk1_k0nk1_mn_xdl_cshuffle_v1<"
     "float, float, float, float>>(...)", True, False),  # CK's FP32 xdl kernels
    # --- MIOpen's implicit-GEMM convolutions (matched by "gemm" before this change too).
    ("igemm_fwd_gtcx2_nhwc_bf16_bx0_ex1_bt32x256x32_wt16x64x4_ws1x1_wr1x2_ta1x4x1x1_1x8x1x32_"
     "tb1x4x8x1_1x8x1x32_gkgs", True, True),
    ("igemm_fwd_gtcx2_nhwc_fp32_bx0_ex1_bt256x128x16_wt64x32x4_ws1x1_wr2x2", True, False),
    # --- TensorRT-LLM trtllm-gen batched GEMMs (Blackwell): types after bmm_.
    ("bmm_E4m3_E4m3E4m3_Fp32_t128x128x128u2_s3_et64x128_m128x128x32_cga1x1x1_16dp256b_TN_"
     "transOut_schedS_sm100a", True, True),
    ("bmm_Bfloat16_E2m1E2m1_Fp32_t128x8x512_s3_et128x8_m128x8x64_cga1x1x1_16dp256b_TN_"
     "transOut_schedS_sm100a", True, True),
    ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_TN_"
     "transOut_schedS_sm100a", True, True),
    ("bmm_Bfloat16_Bfloat16Bfloat16_Fp32_t128x64x128_s5_et128x64_m256x64x16_c2x1x1_rM_BN_"
     "transOut_sm100f", True, True),
    ("bmm_Bfloat16_MxInt4Bfloat16_castBfloat16_Fp32_Ab32_t128x8x256_s4_sm100f", True, True),
    ("bmm_Fp32_Fp32Fp32_Fp32_t128x128x32_s3_et64x128_m128x128x8_cga1x1x1_16dp256b_TN_transOut_"
     "sm100a", True, False),  # constructed: FP32 inputs
    ("bmm_kernel", True, False),  # a Triton bmm (FlagGems): a GEMM, no type in the name
    # --- Attention: never a GEMM; tensor cores only with a 16/8-bit type in the name.
    ("attn_fwd", False, False),  # AOTriton (PyTorch SDPA on ROCm): no type in the name
    ("_attn_fwd", False, False),
    ("_attn_bwd_preprocess", False, False),
    ("kernel_unified_attention_2d", False, False),
    ("kernel_unified_attention_3d", False, False),
    ("fmhaSm100f_QkvE4m3OBfloat16HQk128HV128SeqLen128PersistentContext", False, True),
    ("void paged_attention_ll4mi_QKV_mfma16_kernel<__hip_bfloat16, __hip_bfloat16, "
     "(vllm::Fp8KVCacheDataType)0, 16, 128, 256, false, 4>(...)", False, True),
    ("void vllm::paged_attention_v2_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128, "
     "(vllm::Fp8KVCacheDataType)0, false, 512>(...)", False, False),  # FMAs on the CUDA cores
    ("void paged_attention_ll4mi_reduce_kernel<__hip_bfloat16, __hip_bfloat16, 128, 128, 256, "
     "1>(...)", False, False),
    # --- Plain kernels.
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>"
     ", std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
     "std::array<char*, 3ul>)", False, False),
    ("batched_transpose_16x64_pack_1x4_ediv_1x2_half", False, False),
]


@pytest.mark.parametrize("name, gemm, tensor_cores", CASES, ids=[c[0][:60] for c in CASES])
def test_kernel_name(name, gemm, tensor_cores):
    assert kernel_names.is_gemm(name.lower()) == gemm
    assert kernel_names.uses_tensor_cores(name) == tensor_cores


# --- Real traces. -------------------------------------------------------------------------------

@cache
def kernels(trace: str) -> tuple[Counter, Counter]:
    """Kernel time (µs) and launches by name: ph "X" events of cat "kernel"."""
    with gzip.open(SHARED_TRACES / trace, "rt") as file:
        events = json.load(file)["traceEvents"]
    time, launches = Counter(), Counter()
    for event in events:
        if event.get("ph") == "X" and event.get("cat") == "kernel":
            time[event["name"]] += event["dur"]
            launches[event["name"]] += 1
    return time, launches


def gemm_shares(trace: str) -> tuple[float, float | None, int]:
    """GEMM % of kernel time, tensor-core % of GEMM time, GEMM launches."""
    time, launches = kernels(trace)
    gemms = [name for name in time if kernel_names.is_gemm(name.lower())]
    gemm_time = sum(time[name] for name in gemms)
    tensor_core_time = sum(time[name] for name in gemms if kernel_names.uses_tensor_cores(name))
    return (100 * gemm_time / sum(time.values()),
            100 * tensor_core_time / gemm_time if gemm_time else None,
            sum(launches[name] for name in gemms))


@needs_shared_traces
def test_same_workload_has_a_like_gemm_share_on_h100_and_mi300x():
    """The same Qwen1.5-0.5B inference step: same model, same GEMM shapes, so the same GEMM
    launches (242 on the H100, 243 on the MI300X) and a GEMM share of kernel time of the same
    order. Not equal: a share of time depends on how fast each GPU runs the GEMMs and everything
    else (28 % on the H100, 39 % on the MI300X); tolerance 15 points, 2 % in launches. Before
    hipBLASLt's Cijk_ names were read as GEMMs, the MI300X read 0 %."""
    h100_pct, h100_tensor_pct, h100_launches = gemm_shares(
        "h100_qwen05b_hf_inference_1step.json.gz")
    mi300_pct, mi300_tensor_pct, mi300_launches = gemm_shares(
        "mi300x_qwen05b_hf_inference_1step.json.gz")
    assert h100_pct > 20 and mi300_pct > 20
    assert abs(h100_pct - mi300_pct) <= 15, (h100_pct, mi300_pct)
    assert abs(h100_launches - mi300_launches) <= 0.02 * h100_launches
    # bf16 GEMMs on matrix cores; all but the rotary embedding's small FP32 matmul (0.1 %)
    assert mi300_tensor_pct >= 99 and h100_tensor_pct >= 99


@needs_shared_traces
def test_fp32_training_on_mi250_has_gemms_off_the_matrix_cores():
    """A toy FP32 training run: Tensile's Cijk_..._SB_..._MI16x16x1 GEMMs use MFMA, in FP32."""
    gemm_pct, tensor_pct, launches = gemm_shares("mi250_rocm_3steps.json.gz")
    assert gemm_pct > 10 and launches > 0
    assert tensor_pct == 0


@needs_shared_traces
def test_miopen_sub_tensor_ops_on_mi210_are_no_matrix_work():
    time, _ = kernels("mi210_gpu_only_no_cpu_ops.json.gz")
    sub_tensor_ops = [name for name in time if name.startswith("SubTensorOp")]
    assert len(sub_tensor_ops) >= 2
    for name in sub_tensor_ops:
        assert not kernel_names.uses_tensor_cores(name), name
        assert not kernel_names.is_gemm(name.lower()), name


@needs_shared_traces
def test_vllm_on_mi300x_reads_triton_and_hipblaslt_gemms():
    """vLLM prefill and decode: Triton's bf16 x mxfp4 matmul_ogs and hipBLASLt bf16 GEMMs, all
    on matrix cores; its Triton attention is no GEMM."""
    gemm_pct, tensor_pct, _ = gemm_shares("mi300x_vllm_prefill_decode_piecewise_graphs.json.gz")
    assert gemm_pct > 80 and tensor_pct == pytest.approx(100)
    assert not kernel_names.is_gemm("kernel_unified_attention_2d")


# (name, uses_tf32): FP32 math on the tensor cores in TF32, from the name.
TF32_CASES = [
    ("sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32",
     True),  # cuDNN's convolution, cuDNN's TF32 default (H100 dataloader_workers trace)
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_warpgroupsize1x1x1", True),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nt_align4>(Params)",
     True),  # CUTLASS's FP32 GEMM on the TF32 instruction, m16n8k8
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x128_32x3_nn_align8", False),  # bf16 in
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_bf16_128x128_32x3_nt>(Params)", False),
    ("nvjet_sss_tf32_64x8_64x16_2x1_v_bz_TNN", True),
    ("nvjet_sss_64x8_64x16_2x1_v_bz_TNN", False),  # FP32 on the CUDA cores
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", False),  # bf16
    ("ampere_sgemm_128x64_nn", False),
    ("Cijk_Ailk_Bljk_XS_BH_MT128x128x32_MI32x32x1_SN_ISA942", True),  # xf32: MI300's TF32
    ("Cijk_Ailk_Bjlk_SB_Bias_AS_SAV_UserArgs_MT64x16x16_MI16x16x1" + TENSILE_TAIL, False),
    ("void at::native::vectorized_elementwise_kernel<4, tf32_like_functor>", False),  # no GEMM
]


@pytest.mark.parametrize("name, tf32", TF32_CASES)
def test_uses_tf32(name, tf32):
    assert kernel_names.uses_tf32(name) is tf32
