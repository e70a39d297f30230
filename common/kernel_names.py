"""What a GPU kernel's name says: whether it is a GEMM, and whether it runs on tensor cores
(NVIDIA) or matrix cores (AMD). Names are all a trace gives; there is no counter for tensor-core
instructions in it. Imports no torch."""
from __future__ import annotations

import re

# --- Tensor cores, from kernel names (lowercased substrings). ---------------------------------
# Names are all a trace gives; there is no counter for tensor-core instructions in it. Markers:
# 884 (Volta HMMA), 1688 (Turing), 16816 (Ampere and later, also i8816), hmma/imma, CUTLASS's
# "tensorop", Hopper's warpgroup MMA (gmma, wgmma), and tensor16x8 (cuBLAS/cuDNN tile names). The
# TensorBoard plugin's list (from NVIDIA PyProf) has the first few and "xmma", which we do not
# take alone: xmma kernels also run plain FP32 FFMA math.
TENSOR_CORE_MARKERS = ("884", "1688", "16816", "hmma", "imma", "tensorop", "gmma", "tensor16x8")
# cuBLAS's nvjet kernels (Hopper on) name their types after "nvjet_" (after "nvjet_sm90_" in some
# builds), one BLAS letter each, before the first "_": nvjet_tst_... (bf16 in and out, FP32
# accumulate), nvjet_hsh_... (fp16), nvjet_qqtst_... (fp8 in), nvjet_sss_... (FP32). Names seen
# in public profiles; cuBLAS does not document the scheme. All-"s" types are FP32 math on the CUDA
# cores, unless the name also says tf32 (nvjet_sss_tf32_..., FP32 with TF32 tensor cores).
# A name with "nvjet" but no readable types counts: every nvjet kernel seen so far but FP32 ones
# runs on tensor cores.
NVJET_MARKER = "nvjet"
NVJET_PATTERN = re.compile(r"nvjet_(?:sm\d+_)?(?P<types>[a-z]+)(?:_|$)")
NVJET_FP32_TYPES = re.compile(r"s+")  # fullmatch on the types: FP32 in, compute and out
TF32_MARKER = "tf32"
# A GEMM (or implicit-GEMM convolution) whose name states a tensor-core input type also runs on
# tensor cores (cuBLAS "sm80_xmma_gemm_bf16bf16_...", cuDNN "..._implicit_gemm_tf32f32_..."). Only
# these compact tags: C++ type names (__nv_bfloat16, __half) also appear in cuBLAS's small gemv and
# gemmSN kernels, which run on the CUDA cores.
TENSOR_CORE_TYPES = ("tf32", "bf16", "f16", "fp16", "e4m3", "e5m2", "fp8", "int8")
# ...unless the name says it uses the CUDA cores: FFMA (fused multiply-add) or SIMT tiles.
CUDA_CORE_MARKERS = ("ffma", "simt")
# Attention kernels: FlashAttention 2 (flash_fwd_kernel, flash_bwd_dq_dk_dv_..., PyTorch's
# pytorch_flash::), FlashAttention 3 (flash::FlashAttnFwdSm90) and CUTLASS memory-efficient
# attention (fmha_cutlassF_bf16_...). Their MMAs run on tensor cores for 16-bit (and 8-bit) inputs,
# which they name as C++ types (cutlass::bfloat16_t, cutlass::half_t) or tags (bf16, f16). Their
# FP32 variants (fmha_cutlassF_f32_...) are not counted. Not matched: "flash" alone (flashinfer's
# RMSNorm is no attention), and FlashAttention's two small non-MMA backward kernels.
ATTENTION_PATTERN = re.compile(r"flash_?attn|flash_(?:fwd|bwd)|fmha")
ATTENTION_NON_MMA_MARKERS = ("dot_do_o", "convert_dq")  # flash_bwd_dot_do_o_kernel, ..._convert_dq_
ATTENTION_TENSOR_CORE_TYPES = ("bfloat16", "half", "bf16", "f16", "fp16", "e4m3", "e5m2", "fp8")
# GEMM-like kernels: cuBLAS/CUTLASS GEMMs (sgemm, hgemm, s16816gemm, xmma_gemm), cuDNN
# implicit-GEMM convolutions, Hopper gmma and nvjet kernels. Limits: direct convolutions, FFTs,
# attention and hand-written kernels are not recognised; a future naming scheme needs a new marker.
GEMM_MARKERS = ("gemm", "gmma", "nvjet")


def is_gemm(name: str) -> bool:
    return any(marker in name for marker in GEMM_MARKERS)


def uses_tensor_cores(name: str) -> bool:
    """From the kernel's name alone; see TENSOR_CORE_MARKERS and what follows it for the lists
    and their limits."""
    lowered = name.lower()
    if any(marker in lowered for marker in CUDA_CORE_MARKERS):
        return False
    if any(marker in lowered for marker in TENSOR_CORE_MARKERS):
        return True
    if NVJET_MARKER in lowered:  # the type letters decide, not the type tags below
        nvjet = NVJET_PATTERN.search(lowered)
        fp32 = bool(nvjet) and bool(NVJET_FP32_TYPES.fullmatch(nvjet["types"]))
        return not fp32 or TF32_MARKER in lowered
    if ATTENTION_PATTERN.search(lowered):
        return (not any(marker in lowered for marker in ATTENTION_NON_MMA_MARKERS)
                and any(kind in lowered for kind in ATTENTION_TENSOR_CORE_TYPES))
    return is_gemm(lowered) and any(kind in lowered for kind in TENSOR_CORE_TYPES)
