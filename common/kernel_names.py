"""What a GPU kernel's name says: whether it is a GEMM, and whether it runs on tensor cores
(NVIDIA) or matrix cores (AMD); for a hand-written kernel, the precision its demangled signature
gives its operands (signature_precision). Names are all a trace gives; there is no counter for
tensor-core instructions in it. Imports no torch."""
from __future__ import annotations

import re

# --- Tensor cores, from kernel names (lowercased substrings). ---------------------------------
# Names are all a trace gives; there is no counter for tensor-core instructions in it. Markers:
# 884 (Volta HMMA), 1688 (Turing), 16816 (Ampere and later, also i8816), hmma/imma, Hopper's
# warpgroup MMA (gmma, wgmma), and tensor16x8 (cuBLAS/cuDNN tile names). The TensorBoard plugin's
# list (from NVIDIA PyProf) has the first few and "xmma", which we do not take alone: xmma kernels
# also run plain FP32 FFMA math.
TENSOR_CORE_MARKERS = ("884", "1688", "16816", "hmma", "imma", "gmma", "tensor16x8")
# CUTLASS's "tensorop" (its tensor-core operator class) as a word of its own: cutlass_tensorop_...,
# cutlass_80_tensorop_bf16_s16816gemm..., cutlass3x_sm100_tensorop_gemm... Not after a letter:
# MIOpen's element-wise kernels SubTensorOpWithScalar1d, SubTensorOpWithCastTensor1d (an operation
# on a sub-tensor) are no matrix work. CUTLASS's own C++ type names do put letters before it
# (cutlass::arch::OpClassTensorOp, cutlass::gemm::warp::MmaTensorOp, RowMajorTensorOpMultiplicand...
# in templated kernel names); inside a name that says "cutlass" any "tensorop" counts, as before.
TENSOROP_PATTERN = re.compile(r"(?<![a-z])tensorop")
TENSOROP_MARKER = "tensorop"
CUTLASS_MARKER = "cutlass"
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
# tensor cores (cuBLAS "sm80_xmma_gemm_bf16bf16_...", cuDNN "..._implicit_gemm_tf32f32_...",
# Triton's "_matmul_ogs_NNT_bf16xbf16xmxfp4_..."). Only these compact tags: C++ type names
# (__nv_bfloat16, __half) also appear in cuBLAS's small gemv and gemmSN kernels, which run on the
# CUDA cores. fp4/e2m1: FP4 (NVFP4, MXFP4) operands, Blackwell's and Triton's names for them.
TENSOR_CORE_TYPES = ("tf32", "bf16", "f16", "fp16", "e4m3", "e5m2", "fp8", "int8", "fp4", "e2m1")
# ...unless the name says it uses the CUDA cores: FFMA (fused multiply-add) or SIMT tiles.
CUDA_CORE_MARKERS = ("ffma", "simt")

# --- AMD Tensile / hipBLASLt GEMMs (rocBLAS, hipBLASLt: PyTorch's matmuls on ROCm). ----------
# A Tensile kernel is named after its problem in index notation, C = A.B with free indices i, j,
# batch k and summed index l: Cijk_Ailk_Bljk_ (NN), Cijk_Alik_Bljk_ (TN), Cijk_Ailk_Bjlk_ (NT)...
# The next "_"-separated token starts with the input type in Tensile's DataType characters
# (Tensile/DataType.py): S single (FP32), D double, C/Z complex, I int32, H half, B bfloat16,
# X xfloat32 (MI300's TF32-like MFMA input), I8 int8, 4xi8 (int8x4), F8, B8, F8B8, B8F8 (8-bit
# floats); then the output and compute types (HHS: half in, half out, single compute; SB: single,
# "B" for beta). hipBLASLt splits that token: Cijk_Alik_Bljk_B_BS_BH_... (bf16 in), Cijk_Ailk_Bljk
# _S_B_... (FP32 in). A kernel on the matrix cores names its MFMA instruction MI<m>x<n>x<b> (MI16x16
# x1, MI32x32x1; older Tensile MI<m>x<n>x<k>x<b>, MI32x32x2x1); one without is plain VALU math.
# It counts as tensor/matrix-core work when its input is 16- or 8-bit (or xfloat32, the TF32 of
# MI300, as tf32 counts on NVIDIA) AND it names an MFMA: an FP32 or FP64 input on the matrix cores
# (Cijk_..._SB_..._MI16x16x1) is still FP32 math, what the fp32_matmul verdict is about. "F"/"B"
# with any digit is read as a narrow float too (F8, B8; F6, F4 by the same pattern, unseen).
# Limits: the scheme is read from Tensile's source and from traces, not from a documented spec.
TENSILE_PREFIX = "cijk_"
TENSILE_PATTERN = re.compile(r"cijk_a[a-z]+_b[a-z]+_(?P<types>[a-z0-9]+)")  # match at the start
TENSILE_MATRIX_CORE_INPUTS = re.compile(r"4xi8|i8|[fb]\d|[hbx]")  # match at the types' start
TENSILE_MFMA_PATTERN = re.compile(r"_mi\d+x\d+x\d+(?:x\d+)?(?:_|$)")

# --- TensorRT-LLM's trtllm-gen batched GEMMs (Blackwell: sm100a/sm100f cubins, in TensorRT-LLM,
# FlashInfer and vLLM MoE layers). Named bmm_<C type>_<A type><B type>_[cast<T>_]<accumulator
# type>_t<tile>_...: bmm_E4m3_E4m3E4m3_Fp32_t128x128x128u2_s3_..., bmm_Bfloat16_E2m1E2m1_Fp32_...,
# bmm_MxE4m3_MxE2m1MxE4m3_Fp32_..., bmm_Bfloat16_MxInt4Bfloat16_castBfloat16_Fp32_... Types are
# CamelCase words: E4m3, E5m2, E2m1 (FP4), Mx... (block-scaled), MxInt4, Bfloat16, Fp16, Fp32. Not
# documented; read from TensorRT-LLM's kernel lists and public profiles. They run on the tensor
# cores unless both inputs are Fp32. A name starting bmm_ whose next token is no such type
# (Triton's bmm_kernel) is a GEMM that goes by the type tags above.
TRTLLM_BMM_PREFIX = "bmm_"
_TRTLLM_TYPE = r"(?:mx)?(?:u?e\d+m\d+|u?int\d+|bfloat16|fp\d+|tf32)"
TRTLLM_BMM_PATTERN = re.compile(rf"bmm_{_TRTLLM_TYPE}_(?P<inputs>(?:{_TRTLLM_TYPE})+)_")
TRTLLM_FP32_INPUTS = re.compile(r"(?:fp32)+")  # fullmatch on the inputs: FP32 math

# --- Triton matmuls. Triton names a kernel after its Python function: the tutorial's
# matmul_kernel (and its _persistent, _tma variants), OpenAI's triton_kernels _matmul_ogs_<layout>
# _<types>_... and _p_matmul_ogs_... (vLLM's MoE on AMD), FBGEMM's _kernel_matmul_fp8_row... Not:
# triton_kernels' _finalize_matmul... (the scatter and sum after matmul_ogs, no dot product).
# Tensor cores by the type tags above. Most Triton names state no type: those count on tensor
# cores (as typeless nvjet names do) unless they say f32, so that fp32_matmul never fires on a
# guess: a BF16 model compiled with max-autotune would otherwise be told to use BF16. Limit: an
# FP32 model's typeless Triton matmuls are not caught as FP32 math. A name with a C++ signature
# (matmul_k(float*, ...)) is no Triton kernel: its operand types decide (hand-written kernels,
# below).
MATMUL_MARKER = "matmul"
FP32_TAGS = ("fp32", "f32")
MATMUL_NON_GEMM_MARKERS = ("finalize_matmul",)
# TorchInductor's template kernels (max-autotune) are named triton_tem_fused_<the aten ops they
# came from>_<n>: triton_tem_fused_mm_0, triton_tem_fused_addmm_relu_1, triton_tem_fused_bmm_2,
# triton_tem_fused__scaled_mm_3, triton_tem_fused_convolution_4 (Inductor's conv template, a
# tl.dot implicit GEMM). A template with one of these ops as a "_"-separated word is a GEMM; words,
# never substrings ("comm", "summ"). Only templates: Inductor's pointwise and reduction kernels
# carry the ops they were fused from (triton_poi_fused_addmm_relu_0 is the bias and ReLU after a
# cuBLAS GEMM). Limits: templates named without their ops (descriptive_names off:
# triton_tem_fused_0) are not recognised; their names carry no type.
INDUCTOR_TEMPLATE_PREFIX = "triton_tem_"
INDUCTOR_GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "convolution"})

# --- AMD Composable Kernel (CK) XDL kernels: CK's kernels on the matrix cores (MFMA, "xdlops")
# say xdl: ck::kernel_gemm_xdl_cshuffle_v3<...>, kernel_grouped_conv_fwd_xdl_cshuffle_v3<...>
# (an implicit-GEMM convolution), DeviceGemmXdl...; also MIOpen's ..._xdlops kernels. CK builds
# FP32 xdl kernels too, so they count when the name states a 16- or 8-bit type: the tags above
# (ck_tile's mangled DF16_ / DF16b hold "f16") or CK's C++ types as a demangled name writes them:
# ck::half_t, ck::bhalf_t, ck::f8_t, ck::bf8_t, ck::f8_fnuz_t, ck::f8_ocp_t, or resolved: _Float16,
# __bf16, unsigned short (CK's bhalf_t), _BitInt(8), signed char / int8_t. Limits: a mangled name's
# one-letter types (..._v3INS_...ColumnMajorES7_ttftt..., t: unsigned short, CK's bf16) are not
# read, so such a kernel is a GEMM off the matrix cores here.
XDL_MARKER = "xdl"
CK_TENSOR_CORE_TYPES = ("half_t", "_float16", "__bf16", "unsigned short", "f8_t", "f8_fnuz_t",
                        "f8_ocp_t", "_bitint(8)", "signed char", "int8_t")

# --- Attention kernels: FlashAttention 2 (flash_fwd_kernel, flash_bwd_dq_dk_dv_..., PyTorch's
# pytorch_flash::), FlashAttention 3 (flash::FlashAttnFwdSm90), CUTLASS memory-efficient
# attention (fmha_cutlassF_bf16_...), AOTriton's attn_fwd (PyTorch's SDPA on ROCm), Triton's
# tutorial _attn_fwd/_attn_bwd, vLLM's Triton kernel_unified_attention_2d/_3d and paged_attention
# kernels. Their MMAs run on tensor cores for 16-bit (and 8-bit) inputs, which they name as C++
# types (cutlass::bfloat16_t, cutlass::half_t) or tags (bf16, f16). Their FP32 variants
# (fmha_cutlassF_f32_...) and names with no type (attn_fwd, kernel_unified_attention_2d) are not
# counted. Not matched: "flash" alone (flashinfer's RMSNorm is no attention), and the small non-MMA
# backward kernels (FlashAttention's dot_do_o and convert_dq, Triton's _attn_bwd_preprocess).
# None of these names holds a GEMM marker, so attention stays out of the GEMM share (a fused
# attention named as GEMMs, CK's kernel_batched_gemm_softmax_gemm_xdl..., does count as one).
ATTENTION_PATTERN = re.compile(
    r"flash_?attn|flash_(?:fwd|bwd)|fmha|attn_(?:fwd|bwd)|unified_attention|paged_attention")
ATTENTION_NON_MMA_MARKERS = ("dot_do_o", "convert_dq", "bwd_preprocess")
ATTENTION_TENSOR_CORE_TYPES = ("bfloat16", "half", "bf16", "f16", "fp16", "e4m3", "e5m2", "fp8")
# vLLM's paged_attention_v1/v2_kernel<__nv_bfloat16, ...> do their dot products with FMAs on the
# CUDA cores whatever the type; its ROCm kernels on the matrix cores name their instruction
# (paged_attention_ll4mi_QKV_mfma16_kernel). A paged_attention name counts only with "mfma".
PAGED_ATTENTION_MARKER = "paged_attention"
MFMA_MARKER = "mfma"

# --- Hand-written kernels: operand types from the demangled signature. -------------------------
# CUPTI records a kernel's demangled C++ name: a hand-written CUDA kernel reads
# matmul_k(float*, float*, float*, int), a templated one void gemm_kernel<float, 32>(float const*,
# ...) or void foo<__half, 128>(__half const*, ...). Its parameter list and template arguments name
# the element types of its operands, where a library's compact names (sm80_xmma_gemm_bf16...,
# nvjet_tst_...) name them in tags. Integers are sizes, strides and indices, not operands; a type
# of any other kind (double, 8- or 4-bit, complex) leaves the kernel read as if it had no
# signature, as is a name with no signature or no floating-point type in it. Only C++ type words
# are read, as whole words: float (and its vectors float2, float4), the 16-bit floats as CUDA, HIP,
# PyTorch and CUTLASS/CK spell them (c10::Half reads "half", c10::BFloat16 "bfloat16"). Limits: a
# name left mangled (_Z8matmul_kPfS_S_i, where demangling failed) is not read; a hand-written
# kernel whose own name carries a 16-bit tag (gemm_fp16_kernel(__half*, ...)) keeps the tag rule
# below (tensor cores).
FP32_OPERAND_TYPES = frozenset({"float", "float1", "float2", "float3", "float4"})
FP16_OPERAND_TYPES = frozenset({"half", "__half", "half2", "__half2", "__nv_half", "__nv_half2",
                                "half_t", "_float16", "__fp16"})
BF16_OPERAND_TYPES = frozenset({"bfloat16", "bfloat16_t", "__nv_bfloat16", "__nv_bfloat162",
                                "nv_bfloat16", "nv_bfloat162", "__hip_bfloat16", "hip_bfloat16",
                                "__bf16", "bf16", "bhalf_t"})
# fullmatch on a word: FP64, 8-bit integers (int8_t demangles to "signed char"), complex, and the
# 8-, 6- and 4-bit floats (__nv_fp8_e4m3, c10::Float8_e4m3fn, c10::Float4_e2m1fn_x2, ...).
OTHER_OPERAND_TYPES = re.compile(
    r"double[1-4]?|u?char\d?|u?int8_t|complex|.*(?:fp8|fp6|fp4|float8|float6|float4_|e4m3|e5m2"
    r"|e2m1|e3m2|e2m3|e8m0).*")
TYPE_WORD = re.compile(r"[a-z_][a-z0-9_]*")
SIGNATURE_START = re.compile(r"[<(]")
BASE_NAME = re.compile(r"[a-z_][a-z0-9_]*$")  # the function's own name, before the signature
ANONYMOUS_NAMESPACE = "(anonymous namespace)"
SIXTEEN_BIT_PRECISIONS = ("fp16", "bf16", "16-bit")  # what signature_precision says of 16-bit
# Libraries whose C++ names carry types and their own tensor-core rules (above): CUTLASS and CuTe
# (tensorop, simt, gmma, their MMA atoms), Composable Kernel (xdl and its types). Their names keep
# those rules; the signature decides for the rest.
LIBRARY_TYPED_NAMES = re.compile(rf"{CUTLASS_MARKER}|{XDL_MARKER}|(?<![a-z0-9_])(?:cute|ck)::")
# A hand-written kernel on the tensor cores says so in its name, or it is plain FMA math on the
# CUDA cores whatever its type (a half kernel without MMA instructions runs FP16 FMAs): the WMMA
# API (nvcuda::wmma, rocWMMA), "tensor core", "mma" or AMD's "mfma" as a word (mma_sync, gemm_mma,
# mfma_gemm), or a PTX MMA shape (m16n8k16; AWQ's gemm_forward_4bit_cuda_m16nXk32).
HANDWRITTEN_TENSOR_CORE_PATTERN = re.compile(
    r"wmma|tensor_?core|(?<![a-z0-9])(?:mma|mfma|m(?:8|16|32|64)n(?:\d+|x)k\d+)(?![a-z0-9])")
# A hand-written GEMM under another name than gemm/matmul (is_gemm below): "mm" or "bmm" as a word
# of the function's own name (mm_kernel, tiled_mm), the CUDA samples' matrixMul (matrixMulCUDA),
# mat_mul. Only with a signature whose operand types read as FP32 or 16-bit: a name with no types
# stays as it was (no GEMM).
HANDWRITTEN_GEMM_WORDS = frozenset({"mm", "bmm"})
HANDWRITTEN_GEMM_MARKERS = ("matrixmul", "mat_mul")


def _signature(lowered: str) -> tuple[str, str] | None:
    """(what comes before the signature: return type, namespaces, the function's name; the
    signature: template arguments and parameters) of a lowercased name; None for a name with
    neither."""
    lowered = lowered.replace(ANONYMOUS_NAMESPACE, "anonymous_namespace")
    start = SIGNATURE_START.search(lowered)
    return (lowered[:start.start()], lowered[start.start():]) if start else None


def _float_kinds(signature: str, untyped: frozenset[str] = frozenset()) -> set[str] | None:
    """The float kinds ("fp32", "fp16", "bf16") a signature's type words name; None where it
    names a type of another kind (OTHER_OPERAND_TYPES), words in `untyped` aside."""
    kinds = set()
    for word in TYPE_WORD.findall(signature):
        if word in FP32_OPERAND_TYPES:
            kinds.add("fp32")
        elif word in FP16_OPERAND_TYPES:
            kinds.add("fp16")
        elif word in BF16_OPERAND_TYPES:
            kinds.add("bf16")
        elif word not in untyped and OTHER_OPERAND_TYPES.fullmatch(word):
            return None  # mixed with a type these rules leave alone
    return kinds


def signature_precision(name: str) -> str | None:
    """The operands' precision from a demangled signature's types (see above): "fp32" (float
    only), "fp16", "bf16" or "16-bit" (both; with or without float, as an accumulator or a
    scale), else None."""
    lowered = name.lower()
    signature = _signature(lowered)
    kinds = None if signature is None else _float_kinds(signature[1])
    if kinds is None:
        return None
    if kinds == {"fp32"}:
        return "fp32"
    sixteen = kinds - {"fp32"}
    if not sixteen:
        return None
    return sixteen.pop() if len(sixteen) == 1 else "16-bit"


def _handwritten_precision(lowered: str) -> str | None:
    """signature_precision, for a name no library rule reads (LIBRARY_TYPED_NAMES)."""
    return None if LIBRARY_TYPED_NAMES.search(lowered) else signature_precision(lowered)


def _handwritten_gemm_name(lowered: str, markers: tuple[str, ...] = HANDWRITTEN_GEMM_MARKERS
                            ) -> bool:
    """Whether the function's own name (before its signature) holds one of `markers` or one of
    HANDWRITTEN_GEMM_WORDS as a word."""
    if "mm" not in lowered and not any(marker in lowered for marker in markers):
        return False  # most names: no regex to run
    signature = _signature(lowered)
    base = BASE_NAME.search(signature[0].rstrip()) if signature else None
    if base is None:
        return False
    base = base.group()
    return (any(marker in base for marker in markers)
            or not HANDWRITTEN_GEMM_WORDS.isdisjoint(re.split(r"[^a-z]+", base)))


# Which GEMMs are one's own: named matmul, mm, bmm, matrixMul or mat_mul, with a signature, and
# no library's. What fp32_matmul's fix reads (torch.autocast does not change a kernel's own types).
# Library kernels named gemm carry signatures too, on the CUDA cores and reached by autocast
# (cuBLAS's sgemm_largek_lds64(float*, ...), gemmSN_TN_kernel<float, ...>, magma_sgemmEx_kernel,
# cuDNN's implicit_convolve_sgemm, FBGEMM's): a name with gemm alone is not counted as one's own.
HANDWRITTEN_MATMUL_MARKERS = (MATMUL_MARKER, *HANDWRITTEN_GEMM_MARKERS)


def handwritten_gemm_precision(name: str) -> str | None:
    """signature_precision of a GEMM named as one's own kernels are (see above); None for any
    other kernel."""
    lowered = name.lower()
    if (LIBRARY_TYPED_NAMES.search(lowered)
            or any(marker in lowered for marker in MATMUL_NON_GEMM_MARKERS)
            or not _handwritten_gemm_name(lowered, HANDWRITTEN_MATMUL_MARKERS)):
        return None
    return signature_precision(lowered)


# --- GEMM-like kernels: cuBLAS/CUTLASS GEMMs (sgemm, hgemm, s16816gemm, xmma_gemm), cuDNN and
# MIOpen implicit-GEMM convolutions (igemm_...), Hopper gmma and nvjet kernels, CK xdl kernels;
# and, above, Tensile's Cijk_, trtllm-gen's bmm_, Triton matmuls and Inductor's mm templates,
# and hand-written kernels named gemm, matmul, mm, bmm or matrixMul whose signature gives FP32 or
# 16-bit operands. Limits: direct convolutions, FFTs, attention and other hand-written kernels are
# not recognised; a future naming scheme needs a new marker.
GEMM_MARKERS = ("gemm", "gmma", "nvjet", XDL_MARKER)


def is_gemm(name: str) -> bool:
    """name lowercased."""
    if any(marker in name for marker in GEMM_MARKERS):
        return True
    if name.startswith((TENSILE_PREFIX, TRTLLM_BMM_PREFIX)):
        return True
    if MATMUL_MARKER in name and not any(marker in name for marker in MATMUL_NON_GEMM_MARKERS):
        return True
    if INDUCTOR_TEMPLATE_PREFIX in name and not INDUCTOR_GEMM_OPS.isdisjoint(name.split("_")):
        return True
    return _handwritten_gemm_name(name) and signature_precision(name) is not None


def uses_tensor_cores(name: str) -> bool:
    """From the kernel's name alone; see TENSOR_CORE_MARKERS and what follows it for the lists
    and their limits."""
    lowered = name.lower()
    tensile = TENSILE_PATTERN.match(lowered)
    if tensile:  # the input type and the MFMA decide, nothing else in these long names
        return bool(TENSILE_MATRIX_CORE_INPUTS.match(tensile["types"])
                    and TENSILE_MFMA_PATTERN.search(lowered))
    trtllm = TRTLLM_BMM_PATTERN.match(lowered)
    if trtllm:
        return not TRTLLM_FP32_INPUTS.fullmatch(trtllm["inputs"])
    if any(marker in lowered for marker in CUDA_CORE_MARKERS):
        return False
    if any(marker in lowered for marker in TENSOR_CORE_MARKERS):
        return True
    if TENSOROP_PATTERN.search(lowered) or (TENSOROP_MARKER in lowered
                                            and CUTLASS_MARKER in lowered):
        return True
    if NVJET_MARKER in lowered:  # the type letters decide, not the type tags below
        nvjet = NVJET_PATTERN.search(lowered)
        fp32 = bool(nvjet) and bool(NVJET_FP32_TYPES.fullmatch(nvjet["types"]))
        return not fp32 or TF32_MARKER in lowered
    if ATTENTION_PATTERN.search(lowered):
        if PAGED_ATTENTION_MARKER in lowered and MFMA_MARKER not in lowered:
            return False
        return (not any(marker in lowered for marker in ATTENTION_NON_MMA_MARKERS)
                and any(kind in lowered for kind in ATTENTION_TENSOR_CORE_TYPES))
    if not is_gemm(lowered):
        return False
    kinds = TENSOR_CORE_TYPES + (CK_TENSOR_CORE_TYPES if XDL_MARKER in lowered else ())
    handwritten = _handwritten_precision(lowered) is not None
    # A hand-written kernel's type words (a struct bf16) are no library's tags: only tags in its
    # own name count (gemm_fp16_kernel(...), read as before).
    tagged = _signature(lowered)[0] if handwritten else lowered
    if any(kind in tagged for kind in kinds):
        return True
    if handwritten:  # not a Triton name: its types and its name's markers, no guess
        return bool(HANDWRITTEN_TENSOR_CORE_PATTERN.search(lowered))
    triton = MATMUL_MARKER in lowered or lowered.startswith(INDUCTOR_TEMPLATE_PREFIX)
    return triton and not any(tag in lowered for tag in FP32_TAGS)  # no type: not FP32 by guess


# --- TF32: FP32 tensors multiplied on the tensor cores in TF32 (10-bit mantissa inputs). --------
# What PyTorch allows with torch.backends.cuda.matmul / cudnn.conv fp32_precision = "tf32" (older:
# allow_tf32), and cuDNN's default for convolutions. A kernel does it when it runs on tensor cores
# (uses_tensor_cores) and its name says tf32 (cuDNN's "..._implicit_gemm_f32f32_tf32f32_f32_...",
# cuBLAS's "sm80_xmma_gemm_..._tf32...", nvjet's "nvjet_sss_tf32_..."), or it is CUTLASS's FP32
# GEMM on the TF32 instruction, m16n8k8 ("cutlass_80_tensorop_s1688gemm_...", the "s" for single:
# no narrower type tag in the name), or a Tensile kernel whose input is xfloat32 (MI300's TF32), or
# a hand-written kernel on the tensor cores whose signature gives only float operands (WMMA and
# mma.sync take FP32 inputs only as TF32).
CUTLASS_TF32_PATTERN = re.compile(r"tensorop_s1688")
NARROW_TYPES = tuple(kind for kind in TENSOR_CORE_TYPES if kind != TF32_MARKER)


def uses_tf32(name: str) -> bool:
    """From the kernel's name alone (see above)."""
    if not uses_tensor_cores(name):
        return False
    lowered = name.lower()
    tensile = TENSILE_PATTERN.match(lowered)
    if tensile:
        return tensile["types"].startswith("x")
    if TF32_MARKER in lowered:
        return True
    if _handwritten_precision(lowered) == "fp32":
        return True
    return bool(CUTLASS_TF32_PATTERN.search(lowered)) and not any(
        kind in lowered for kind in NARROW_TYPES)


# --- Memory-bound operator kernels: the kernels of eager PyTorch's operators that do a few
# operations per byte they move (element-wise ops, reductions, normalization, pooling, indexing),
# and the library kernels of that kind around convolutions (cuDNN's and MIOpen's batch norm,
# cuDNN's NCHW<->NHWC layout conversions). Each reads its inputs from memory and writes its output
# back: a chain of them (convolution -> batch norm -> ReLU -> residual add) moves each activation
# several times, where one fused kernel (torch.compile's) moves it once. From names: ATen's own
# kernels are in namespace at::native (CUDA and ROCm builds alike); cuDNN's batch norm kernels
# start cudnn::bn_, its conversions are nchwToNhwc/nhwcToNchw kernels; MIOpen's batch norm is
# MIOpenBatchNorm..., its conversions batched_transpose_..., its element-wise ops on sub-tensors
# SubTensorOpWithScalar1d, SubTensorOpWithCastTensor1d (seen on an MI210); ATen's softmax for
# short rows is softmax_warp_forward/backward, outside at::native. Not counted: GEMMs and
# attention (matrix math, above), the optimizer's multi-tensor kernels (a step's update in a few
# launches already: unfused_optimizer's lesson), collectives, and Triton kernels (Inductor's, fused
# already). Limits: element-wise kernels of other libraries (Apex, Transformer Engine, one's own)
# are not recognised.
LAYOUT_CONVERSION_MARKERS = ("nchwtonhwc", "nhwctonchw", "batched_transpose_")
SOFTMAX_MARKER = "softmax"
MEMORY_BOUND_MARKERS = ("at::native::", "cudnn::bn_", "miopenbatchnorm", "subtensorop",
                        "softmax_warp_", *LAYOUT_CONVERSION_MARKERS)
MEMORY_BOUND_EXCLUDED = ("multi_tensor_apply", "fused_adam", "fused_sgd", "nccl")
# Not the data's type: ATen's data pointers (std::array<char*, N>), and double scalar arguments
# (batch norm's momentum and eps, a fill value) beside float or 16-bit data.
UNTYPED_DATA_WORDS = frozenset({"char", "double"})
# A cast's functor names the type it writes (bfloat16_copy_kernel_cuda reads float, writes BF16):
# autocast's own work, counted as 16-bit.
CAST_TO_16_BIT = re.compile(r"(?:bfloat16|half|float16)_copy_kernel")


def is_layout_conversion(name: str) -> bool:
    """A library's NCHW<->NHWC conversion around a convolution (see above)."""
    lowered = name.lower()
    return any(marker in lowered for marker in LAYOUT_CONVERSION_MARKERS)


def is_softmax(name: str) -> bool:
    """A kernel named as a softmax (ATen's cunn_SoftMax..., softmax_warp_...; Inductor's fused
    ones too, which is_memory_bound_op leaves out): attention's, where no fused attention ran, or a
    classifier's."""
    return SOFTMAX_MARKER in name.lower()


def is_memory_bound_op(name: str) -> bool:
    """From the kernel's name alone (see above)."""
    lowered = name.lower()
    if not any(marker in lowered for marker in MEMORY_BOUND_MARKERS):
        return False
    return (not any(marker in lowered for marker in MEMORY_BOUND_EXCLUDED)
            and not is_gemm(lowered) and not ATTENTION_PATTERN.search(lowered))


def data_precision(name: str) -> str | None:
    """The floating-point type of the data a kernel moves, from its demangled signature: "fp32"
    (float only) or "16-bit" (FP16 or BF16, beside float or not, which is then an accumulator or a
    statistic: batch norm's); None with no float type (double data alone), or with another one
    (8-bit). Unlike signature_precision, char and double do not count: ATen's untyped data pointers
    (std::array<char*, 3>) sit beside the typed functor that says what the data is, and a double is
    a scalar argument. A cast to 16 bits (CAST_TO_16_BIT) is 16-bit."""
    lowered = name.lower()
    signature = _signature(lowered)
    kinds = None if signature is None else _float_kinds(signature[1], UNTYPED_DATA_WORDS)
    if not kinds:
        return None
    return "16-bit" if kinds - {"fp32"} or CAST_TO_16_BIT.search(lowered) else "fp32"
