"""The trace analyzer: metrics on hand-built traces with hand-computed numbers, each verdict on its
case and silent on a healthy control, bad input, and the CPU traces of the demos' smoke runs."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from common import analyze, kernel_names, trace, trace_steps
from common.verdicts import HOST_SYNC_IDLE_MIN_PCT, dataloader_share_min_pct
from tests.conftest import ROOT, read_summary
from tests.kineto_builder import (BF16_GEMM, ELEMENTWISE, FLASH_BF16_FWD, FLASH_FP16_BWD,
                                  FP32_GEMM, H100_MEMORY_BYTES, H100_NAME, MB, NVJET_FP16_GEMM,
                                  NVJET_FP32_GEMM, NVJET_GEMM, NVJET_TF32_GEMM, KinetoTrace,
                                  simulate_training)

T0 = 1_000_000.0  # µs; a realistic absolute clock keeps float precision honest
# Stops a hung command only: importing report imports matplotlib, whose first import on a fresh
# machine builds its font cache (tens of seconds on 2 busy cores); a run takes ~2 s after that.
CLI_HANG_TIMEOUT_S = 300


def hand_trace(vocabulary: str) -> KinetoTrace:
    """Two steps, every number chosen so the expected metrics can be worked out by hand (see
    test_gpu_metrics_match_the_hand_computed_numbers). Times are µs after T0."""
    t = KinetoTrace(vocabulary=vocabulary)
    t.gpu()
    t.launch(T0 - 50, 5, T0 - 40, 45, name=ELEMENTWISE)  # before the steps, runs into step 1
    t.step(1, T0 + 0, 100)
    t.dataloader(T0 + 1, 8)
    t.op("aten::mm", T0 + 8, 32)
    t.launch(T0 + 10, 5, T0 + 20, 30, name=BF16_GEMM)
    t.launch(T0 + 20, 5, T0 + 50, 5, name=ELEMENTWISE)
    t.memcpy(T0 + 30, 4, T0 + 60, 10, kind="HtoD")
    t.step(2, T0 + 100, 100)
    t.launch(T0 + 110, 5, T0 + 120.25, 20, name=FP32_GEMM)
    t.runtime("cudaStreamSynchronize", T0 + 160, 25)
    t.memset(T0 + 170, 2, T0 + 175, 2)
    t.launch(T0 + 186, 4, T0 + 190, 40.5, name=NVJET_GEMM)  # runs past the step's host end
    for at, mb, device_type in ((10, 100, 1), (60, 300, 1), (150, 200, 1), (70, 999, 0)):
        t.memory(T0 + at, mb * MB, device_type)
    return t


# By hand, for hand_trace (µs after T0):
# GPU busy: [-40,5] [20,55] [60,70] [120.25,140.25] [175,177] [190,230.5] -> 152.5 of 270.5.
# Step 1 starts when the pre-step kernel ends (5), ends at its host end (100); step 2 runs
# 100 .. 230.5 (its last kernel). Window 5 .. 230.5 = 225.5.
WINDOW_US = 225.5
EXPECTED_GPU = {
    # Kernels, the copy and the memset: [20,55] [60,70] [120.25,140.25] [175,177] [190,230.5].
    "utilization_pct": 100 * (35 + 10 + 20 + 2 + 40.5) / WINDOW_US,
    "idle_pct": 100 * (1 - (35 + 10 + 20 + 2 + 40.5) / WINDOW_US),  # what the causes split
    "copy_only_pct": 100 * (10 + 2) / WINDOW_US,  # the copy and the memset, no kernel beside them
    # HTA's: the same work from the first GPU op (-40) to the last (230.5).
    "hta_idle_pct": 100 * (1 - 152.5 / 270.5),
    "kernels_per_step": 4 / 2,
    "median_kernel_us": 25.0,  # of 30, 5, 20, 40.5
    "short_kernel_pct": 25.0,  # one of four < 10 µs
    "launches_per_step": 4 / 2,  # the pre-step launch is outside the steps
    "syncs_per_step": 1 / 2,
    "h2d_pct": 100 * 10 / WINDOW_US,
    "h2d_exposed_pct": 100 * 10 / WINDOW_US,  # 60 .. 70: no kernel runs beside it
    "tensor_core_pct": 100 * (30 + 40.5) / 95.5,  # the bf16 xmma GEMM and the nvjet kernel
    "tensor_core_gemm_pct": 100 * (30 + 40.5) / (30 + 20 + 40.5),  # of the three GEMMs' time
    "gemm_pct": 100 * 90.5 / 95.5,
    "non_tensor_core_gemm_pct": 100 * 20 / 95.5,  # the sgemm
    "kernel_ms_per_step": 95.5 / 2 / 1000,
    "launch_ms_per_step": (5 + 5 + 5 + 4) / 2 / 1000,
    "sync_idle_pct": 100 * 13 / WINDOW_US,  # the sync returns at 185 in the gap 177 .. 190
}


@pytest.mark.parametrize("vocabulary", ["current", "2021", "tensorboard"])
def test_gpu_metrics_match_the_hand_computed_numbers(tmp_path, vocabulary):
    result = analyze.analyze_trace(hand_trace(vocabulary).write(tmp_path / "t.pt.trace.json"))
    assert result["device"] == "cuda" and result["gpu_name"] == H100_NAME
    assert result["steps"] == 2  # the GPU-side copies of ProfilerStep#N are not steps
    assert result["step_ms"]["mean"] == pytest.approx((95 + 130.5) / 2 / 1000)
    assert result["step_ms"]["p50"] == pytest.approx((95 + 130.5) / 2 / 1000)
    assert result["step_ms"]["p95"] == pytest.approx((95 + 0.95 * 35.5) / 1000)
    assert result["window_ms"] == pytest.approx(WINDOW_US / 1000)
    assert result["dataloader_pct"] == pytest.approx(100 * 4 / WINDOW_US)  # clipped at 5
    assert result["peak_memory_mb"] == pytest.approx(300.0)  # CUDA events only
    assert result["device_memory_mb"] == pytest.approx(H100_MEMORY_BYTES / MB)
    for name, expected in EXPECTED_GPU.items():
        assert result["gpu"][name] == pytest.approx(expected, rel=1e-9), name


def test_idle_uses_the_float_timestamps(tmp_path):
    """Rounded to whole µs, the idle share would move by 0.5/270.5 (the kernel ending at 230.5)."""
    result = analyze.analyze_trace(hand_trace("current").write(tmp_path / "t.pt.trace.json"))
    rounded_idle = 100 * (1 - 152 / 270)
    assert result["gpu"]["hta_idle_pct"] == pytest.approx(EXPECTED_GPU["hta_idle_pct"], abs=1e-9)
    assert abs(result["gpu"]["hta_idle_pct"] - rounded_idle) > 0.05


@pytest.mark.parametrize("vocabulary", ["current", "2021", "tensorboard"])
def test_step_breakdown_follows_the_plugin_priority(tmp_path, vocabulary):
    """Step 1 (5 .. 100): DataLoader 5-9, CPU 9-10, runtime 10-15, CPU 15-20, kernel 20-55 (the
    runtime calls under it count as kernel), other 55-60, memcpy 60-70, other 70-100. Whatever
    the DataLoader's and the step's category (an operator one in 2021 and after the rewrite),
    they are not CPU Exec."""
    analysis = analyze.analyze(hand_trace(vocabulary).write(tmp_path / "t.pt.trace.json"))
    step_1 = dict(zip(trace_steps.BREAKDOWN_ROLES, analysis.breakdown_ms[0] * 1000))
    expected = {"kernel": 35, "memcpy": 10, "memset": 0, "runtime": 5, "dataloader": 4,
                "cpu_exec": 6, "other": 35}
    assert step_1 == pytest.approx(expected)
    assert analysis.breakdown_ms.sum(axis=1) * 1000 == pytest.approx([95, 130.5])


@pytest.mark.parametrize("vocabulary, cpu_exec_us", [
    ("current", 20),  # the aten::mm operator only
    ("tensorboard", 20),  # the rewrite leaves regions and Python functions as they are
    ("2021", 80),  # "forward" was an Operator span then: the plugin counts it as CPU Exec
])
def test_cpu_exec_is_operator_spans_as_the_plugin_counts_it(tmp_path, vocabulary, cpu_exec_us):
    """One 100 µs CPU step: a "forward" region 10 .. 90 holding a Python function 15 .. 45 that
    holds the operator aten::mm 20 .. 40. The plugin counts operator spans as CPU Exec, not
    user_annotation regions nor python_function spans: the rest of the step is Other (Python
    between operators)."""
    t = KinetoTrace(vocabulary=vocabulary)
    t.step(1, T0, 100)
    t.annotation("forward", T0 + 10, 80)
    t.python("nn.Module: Linear_0", T0 + 15, 30)
    t.op("aten::mm", T0 + 20, 20)
    analysis = analyze.analyze(t.write(tmp_path / "t.pt.trace.json"))
    breakdown = analysis.result["step_breakdown_ms"]
    assert breakdown["cpu_exec"] * 1000 == pytest.approx(cpu_exec_us)
    assert breakdown["other"] * 1000 == pytest.approx(100 - cpu_exec_us)
    assert analysis.regions["forward"].size == 1  # the region is still found, for the timeline


def test_gzip_and_plain_json_give_the_same_result(tmp_path):
    built = hand_trace("current")
    plain = analyze.analyze_trace(built.write(tmp_path / "a.pt.trace.json"))
    packed = analyze.analyze_trace(built.write(tmp_path / "b.pt.trace.json.gz", compress=True))
    plain.pop("trace"), packed.pop("trace")
    assert plain == packed


@pytest.mark.parametrize("chunk_bytes", [300, 5000])
def test_reading_in_pieces_gives_the_whole_file_result(tmp_path, monkeypatch, chunk_bytes):
    """Large traces are parsed a piece of traceEvents at a time (trace.event_pieces); any split
    must give what one parse of the whole file gives."""
    path = simulate_training(KinetoTrace(), steps=5, dataloader_us=50, syncs_per_step=2,
                             after_sync_us=40, h2d_us=30).write(tmp_path / "t.pt.trace.json")
    whole = analyze.analyze_trace(path)
    monkeypatch.setattr(trace, "CHUNK_BYTES", chunk_bytes)
    _, pieces = trace.event_pieces(path)
    assert len(list(pieces)) > 1
    assert analyze.analyze_trace(path) == whole


def test_a_split_inside_a_string_is_split_again(tmp_path, monkeypatch):
    """A kernel named with "},{" in it: a piece cut there ends inside the name and does not
    parse, so the reader cuts at the next gap between events (tests/test_reader.py has more),
    with the hand-computed result."""
    built = hand_trace("current")
    for event in built.events:
        if event.get("name") == ELEMENTWISE:
            event["name"] = 'odd<"},{"> kernel'
    path = built.write(tmp_path / "t.pt.trace.json")
    monkeypatch.setattr(trace, "CHUNK_BYTES", 10)  # try a split after every event
    assert sum(map(len, trace.event_pieces(path)[1])) == len(built.to_json()["traceEvents"])
    result = analyze.analyze_trace(path)
    assert result["gpu"]["hta_idle_pct"] == pytest.approx(EXPECTED_GPU["hta_idle_pct"])
    assert result["gpu"]["utilization_pct"] == pytest.approx(EXPECTED_GPU["utilization_pct"])


def test_a_run_directory_means_its_newest_trace(tmp_path):
    import os
    old = hand_trace("current").write(tmp_path / "old.pt.trace.json")
    new = simulate_training(KinetoTrace(), steps=4).write(tmp_path / "new.pt.trace.json.gz",
                                                          compress=True)
    os.utime(old, (1, 1))
    result = analyze.analyze_trace(tmp_path)
    assert result["trace"] == str(new) and result["steps"] == 4
    # A schedule's repeat cycles, or a rerun into the folder: the first line says there are more.
    assert result["traces_in_folder"] == 2
    assert analyze.format_human(result).splitlines()[0] == (
        f"trace        {new} (its folder holds 2 traces: pass a file to read another)")
    alone = analyze.analyze_trace(new)
    assert "traces_in_folder" not in alone
    assert analyze.format_human(alone).splitlines()[0] == f"trace        {new}"


def test_no_steps_means_the_whole_trace_is_one_step(tmp_path):
    t = KinetoTrace()
    t.op("aten::mm", T0, 100)
    t.dataloader(T0 + 10, 30)
    t.op("aten::add", T0 + 150, 50)
    t.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": t.cpu_pid,
                     "tid": t.cpu_pid, "ts": T0 + 120})  # no "dur": zero length
    result = analyze.analyze_trace(t.write(tmp_path / "t.pt.trace.json"))
    assert result["steps"] == 1 and not result["steps_named"]
    assert result["step_ms"]["mean"] == pytest.approx(0.2)
    assert result["dataloader_pct"] == pytest.approx(15.0)
    assert result["device"] == "cpu" and result["gpu"] is None and result["findings"] == []
    assert result["peak_memory_mb"] is None


@pytest.mark.parametrize("iterator, workers", [("_SingleProcessDataLoaderIter", False),
                                               ("_MultiProcessingDataLoaderIter", True),
                                               ("both", False),
                                               (None, None)])
def test_the_dataloader_fix_follows_where_its_batches_are_made(tmp_path, iterator, workers):
    """The same wait on the DataLoader (25 % of the step): without workers the fix is workers;
    with workers already there, it is cheaper batches for them. A loader in the training process
    beside one with workers ("both") may be the wait: no workers for the rule. Without a
    DataLoader span the trace says nothing of workers (and the rule is silent)."""
    t = KinetoTrace(vocabulary="2021")
    t.step(7, 1000, 400)
    if iterator == "both":
        t.dataloader(1000, 50, iterator="_MultiProcessingDataLoaderIter")
        t.dataloader(1050, 50, iterator="_SingleProcessDataLoaderIter")
    elif iterator:
        t.dataloader(1000, 100, iterator=iterator)
    t.op("aten::conv2d", 1100, 300)
    result = analyze.analyze_trace(t.write(tmp_path / "t.pt.trace.json"))
    assert result["dataloader_workers"] is workers
    found = {f["id"]: f for f in result["findings"]}
    assert ("dataloader" in found) == (iterator is not None)
    if iterator:
        fix = found["dataloader"]["fix"]
        assert fix.startswith("the worker processes do not keep up" if workers
                              else "prepare batches in worker processes")
        assert found["dataloader"]["share_pct"] == pytest.approx(25.0)
    line = next(row for row in analyze.format_human(result).splitlines()
                if row.startswith("DataLoader"))
    assert line.endswith(analyze.LOADER_WORDS[workers])


def test_one_step_cpu_trace_with_integer_times(tmp_path):
    t = KinetoTrace(vocabulary="2021")
    t.step(7, 1000, 400)
    t.dataloader(1000, 100)
    t.op("aten::conv2d", 1100, 300)
    t.memory(1200, 64 * MB, 0)
    result = analyze.analyze_trace(t.write(tmp_path / "t.pt.trace.json"))
    assert (result["steps"], result["device"], result["gpu"]) == (1, "cpu", None)
    assert result["step_ms"] == {"mean": 0.4, "p50": 0.4, "p95": 0.4}
    assert result["dataloader_pct"] == pytest.approx(25.0)
    assert result["peak_memory_mb"] == pytest.approx(64.0)
    assert [f["id"] for f in result["findings"]] == ["dataloader"]


def test_tensor_core_names_across_generations():
    for name in ("volta_h884gemm_64x64_ldg8_nn", "turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn",
                 "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn",
                 "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8",
                 "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
                 "_execute_segment_k_off_kernel__5x_cublas", BF16_GEMM, NVJET_GEMM,
                 "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x64",
                 "void cutlass::Kernel2<cutlass_80_wmma_tensorop_s161616gemm_f16_32x32_128x2_tn>",
                 "sm90_gemm_bf16_wgmma_kernel"):
        assert kernel_names.uses_tensor_cores(name), name
    for name in (FP32_GEMM, "volta_sgemm_128x64_nn", "cutlass_80_simt_sgemm_128x64_8x5_nn_align1",
                 "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x2x1_ffma",
                 "void cudnn::cnn::implicit_convolve_sgemm<float, float, 128, 6, 7, 3, 3, 5>",
                 ELEMENTWISE, "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::"
                 "BFloat16, at::native::func_wrapper_t<float, at::native::sum_functor>>>",
                 # cuBLAS's small-matrix kernel: a GEMM with a bf16 C++ type, on the CUDA cores
                 "void gemmSN_TN_kernel<float, 128, 16, 2, 4, 4, 4, true, cublasGemvTensorStrided"
                 "Batched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16>>"):
        assert not kernel_names.uses_tensor_cores(name), name


def test_nvjet_kernels_by_their_type_letters():
    """cuBLAS nvjet names carry their types after "nvjet_": 16- and 8-bit types and TF32 run on
    tensor cores, plain FP32 ("sss") does not."""
    for name in (NVJET_GEMM, NVJET_FP16_GEMM, NVJET_TF32_GEMM,
                 "nvjet_qqtst_128x256_128x6_2x1_2cta_v_bz_TNT",  # fp8 inputs
                 "nvjet_sm90_hss_320x128", "NVJET_TST_64X8_64X16_4X1_V_BZ_TNT"):
        assert kernel_names.uses_tensor_cores(name), name
        assert kernel_names.is_gemm(name.lower()), name
    for name in (NVJET_FP32_GEMM, "nvjet_sss_64x8_64x16_4x1_v_bz_splitK_TNT", "nvjet_sm90_sss"):
        assert not kernel_names.uses_tensor_cores(name), name
        assert kernel_names.is_gemm(name.lower()), name  # an FP32 GEMM: what fp32_matmul looks for


def test_attention_kernels_with_a_16_bit_type_use_tensor_cores():
    for name in (FLASH_BF16_FWD, FLASH_FP16_BWD, "fmha_cutlassF_bf16_aligned_64x64_rf_sm80",
                 "fmha_cutlassB_f16_aligned_128x64_k64_sm80",
                 "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90"
                 "<flash::CollectiveMainloopFwdSm90<2, cute::tuple<int, int, int>, 128, "
                 "cutlass::bfloat16_t, float, cutlass::arch::Sm90>>>>(...)"):
        assert kernel_names.uses_tensor_cores(name), name
        assert not kernel_names.is_gemm(name.lower()), name  # attention is not in the GEMM share
    for name in ("fmha_cutlassF_f32_aligned_64x64_rf_sm80",  # FP32 attention: not counted
                 "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(...)",  # no attention
                 "void pytorch_flash::flash_bwd_dot_do_o_kernel<true, pytorch_flash::Flash_bwd_"
                 "kernel_traits<64, 128, 128, 8, 2, 4, 2, false, false, cutlass::half_t>>(...)"):
        assert not kernel_names.uses_tensor_cores(name), name


@pytest.mark.parametrize("kernel_name, expected_pct, fp32_verdict", [
    (NVJET_GEMM, 100.0, False), (NVJET_TF32_GEMM, 100.0, False), (NVJET_FP32_GEMM, 0.0, True),
])
def test_tensor_core_share_of_gemm_time_on_h100_names(tmp_path, kernel_name, expected_pct,
                                                      fp32_verdict):
    """An H100 training loop of one GEMM kind: FP32 nvjet GEMMs are the mixed_precision demo's
    bad case (fp32_matmul fires), TF32 or bf16 ones its fixes."""
    built = gpu_trace(kernel_name=kernel_name)
    result = analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))
    assert result["gpu"]["tensor_core_gemm_pct"] == pytest.approx(expected_pct)
    assert ("fp32_matmul" in [f["id"] for f in result["findings"]]) == fp32_verdict


def test_tensor_core_share_of_gemm_time_is_null_without_gemms(tmp_path):
    result = analyze.analyze_trace(gpu_trace(kernel_name=FLASH_BF16_FWD).write(
        tmp_path / "t.pt.trace.json"))
    assert result["gpu"]["gemm_pct"] == 0.0 and result["gpu"]["tensor_core_gemm_pct"] is None
    assert result["gpu"]["tensor_core_pct"] == pytest.approx(100.0)  # all flash attention
    assert "of GEMM time" in analyze.format_human(result)  # printed as n/a, not an error


# --- Verdicts: each fires on its case (and only it) and stays silent on a healthy control. ------

def verdicts(tmp_path, built: KinetoTrace) -> list[str]:
    result = analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))
    return [f["id"] for f in result["findings"]]


def gpu_trace(**options) -> KinetoTrace:
    built = KinetoTrace()
    built.gpu()
    return simulate_training(built, **options)


def test_healthy_run_yields_no_findings(tmp_path):
    # 200 µs bf16 GEMMs launched every 10 µs keep the GPU busy; memory at 30 % of the GPU.
    built = gpu_trace(peak_memory_bytes=int(0.3 * H100_MEMORY_BYTES), syncs_per_step=1)
    result = analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))
    assert result["gpu"]["utilization_pct"] > 95 and result["findings"] == []


VERDICT_CASES = {
    # 400 µs of DataLoader before 20 x 25 µs of busy GPU in every step
    "dataloader": dict(dataloader_us=400, kernel_us=25),
    # 15 µs kernels (not short) launched every 40 µs: 37 % busy, median 15 µs, at batch 8
    "small_batch": dict(kernel_us=15, launch_gap_us=40, kernels_per_step=100, input_batch=8),
    # FP32 SIMT GEMMs keep the GPU busy without tensor cores
    "fp32_matmul": dict(kernel_name=FP32_GEMM),
    # peak allocated at 90 % of the GPU's 80 GB, in training (a backward pass)
    "activation_memory": dict(peak_memory_bytes=int(0.9 * H100_MEMORY_BYTES), backward=True),
    # 4 µs kernels, each behind a 6 µs launch call
    "launch_overhead": dict(kernel_us=4, launch_us=6, launch_gap_us=8, kernels_per_step=200),
    # two syncs per step, each followed by 300 µs of host work before the next launch
    "host_sync": dict(syncs_per_step=2, after_sync_us=300),
    # a 600 µs pageable host-to-device copy per step
    "h2d_copy": dict(h2d_us=600),
}


@pytest.mark.parametrize("rule_id", sorted(VERDICT_CASES))
def test_each_verdict_fires_on_its_case_alone(tmp_path, rule_id):
    built = gpu_trace(**VERDICT_CASES[rule_id])
    result = analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))
    assert [f["id"] for f in result["findings"]] == [rule_id]
    found = result["findings"][0]
    assert found["severity"] in ("high", "medium") and found["fix"]
    # (these traces have no backward pass: a host-bound one points at the inference pair)
    assert found["demo"] in ("dataloader_workers", "small_batch", "mixed_precision",
                             "activation_checkpointing", "llm_decode", "item_sync")
    assert any(ch.isdigit() for ch in found["evidence"])  # evidence states the numbers


def test_verdict_thresholds_are_the_boundaries(tmp_path):
    """Just below a threshold the rule is silent; just above, it fires."""
    base = dict(steps=1, kernels_per_step=10, kernel_us=50, launch_gap_us=5, gpu_latency_us=3)
    gpu_after_loader_us = 3 + 10 * 50  # the step ends when its last kernel does

    def loader_share(pct: float) -> KinetoTrace:  # share = loader / (loader + GPU after it)
        return gpu_trace(dataloader_us=pct / (100 - pct) * gpu_after_loader_us, **base)
    assert analyze.analyze_trace(loader_share(19.9).write(tmp_path / "a.pt.trace.json"))[
        "dataloader_pct"] == pytest.approx(19.9)
    assert "dataloader" not in verdicts(tmp_path, loader_share(19.9))
    assert "dataloader" in verdicts(tmp_path, loader_share(20.1))
    memory = [verdicts(tmp_path, gpu_trace(peak_memory_bytes=int(share * H100_MEMORY_BYTES),
                                           **base))
              for share in (0.849, 0.851)]
    assert "activation_memory" not in memory[0] and "activation_memory" in memory[1]


def test_small_batch_defers_to_the_named_causes(tmp_path):
    """Short kernels and an idle GPU because of the DataLoader are a DataLoader problem."""
    ids = verdicts(tmp_path, gpu_trace(kernel_us=15, launch_gap_us=40, kernels_per_step=20,
                                       dataloader_us=2000))
    assert ids == ["dataloader"]


def test_one_sync_per_step_in_a_gpu_bound_loop_is_not_a_finding(tmp_path):
    """A loss.item() per step costs almost nothing when the GPU is the bottleneck."""
    built = gpu_trace(syncs_per_step=1, after_sync_us=20)
    result = analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))
    assert result["gpu"]["syncs_per_step"] == 1.0
    assert result["gpu"]["sync_idle_pct"] < HOST_SYNC_IDLE_MIN_PCT
    assert result["findings"] == []


def test_gpu_verdicts_are_not_made_on_a_cpu_trace(tmp_path):
    t = KinetoTrace()
    t.step(1, T0, 1000)
    t.op("aten::mm", T0, 1000)
    t.memory(T0 + 1, 10**12, 0)  # a terabyte of CPU memory: no GPU memory verdict
    result = analyze.analyze_trace(t.write(tmp_path / "t.pt.trace.json"))
    assert result["gpu"] is None and result["findings"] == []


# --- Bad input: one line on stderr naming the file, exit code 2, no traceback. ------------------

BAD_INPUTS = {
    "not JSON": b"this is not json",
    "truncated or corrupt gzip": gzip.compress(b'{"traceEvents": []}' * 50)[:30],
    "empty file": b"",
    "no traceEvents": b"{}",
    "top level is a JSON list": b'[{"ph": "X"}]',
    "traceEvents is empty": b'{"traceEvents": []}',
    "traceEvents is a JSON dict, not a list": b'{"traceEvents": {"a": 1}}',
    "not a Kineto trace": b'{"traceEvents": [{"ph": "X", "name": "x"}]}',  # no ts
    "no timed events": b'{"traceEvents": [{"ph": "M", "name": "process_name"}]}',
}


@pytest.mark.parametrize("problem", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, problem):
    path = tmp_path / "bad.pt.trace.json"
    path.write_bytes(BAD_INPUTS[problem])
    assert analyze.main([str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and str(path) in captured.err and problem in captured.err


def test_missing_file_and_empty_directory(tmp_path, capsys):
    assert analyze.main([str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert analyze.main([str(tmp_path)]) == 2
    assert "no .pt.trace.json" in capsys.readouterr().err


def test_command_line_without_torch(tmp_path):
    """The analyzer runs where torch is absent, and bad input exits 2 without a traceback."""
    good = hand_trace("current").write(tmp_path / "t.pt.trace.json.gz", compress=True)
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    script = ("import sys; sys.modules['torch'] = None\n"
              "from common import analyze, compare, report\n"
              "code = analyze.main(sys.argv[1:])\n"
              "assert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
              "sys.exit(code)")
    ok = subprocess.run([sys.executable, "-c", script, str(good), "--json"], cwd=ROOT,
                        capture_output=True, text=True, timeout=CLI_HANG_TIMEOUT_S)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["gpu"]["kernels_per_step"] == 2
    failed = subprocess.run([sys.executable, "-c", script, str(bad)], cwd=ROOT,
                            capture_output=True, text=True, timeout=CLI_HANG_TIMEOUT_S)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert failed.stderr.startswith("analyze: ") and "not JSON" in failed.stderr


def test_human_output_names_the_verdict_and_the_demo(tmp_path, capsys):
    path = gpu_trace(**VERDICT_CASES["small_batch"]).write(tmp_path / "t.pt.trace.json")
    assert analyze.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "small_batch" in out and "demos/small_batch/" in out and "utilization" in out


def test_flags_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        analyze.main(["--frobnicate"])
    assert exit_info.value.code == 2 and "error:" in capsys.readouterr().err


# --- The demos' own CPU traces. ------------------------------------------------------------------

# The rules that read the GPU's metrics (m["gpu"], null on a CPU trace).
GPU_ONLY_VERDICTS = {"small_batch", "fp32_matmul", "activation_memory", "launch_overhead",
                     "host_sync", "h2d_copy"}


def cpu_spans(path, predicate) -> list[tuple[float, float]]:
    events = trace.load_trace(path)["traceEvents"]
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("ph") == "X" and predicate(e["name"]))


def test_smoke_traces_of_the_workers_pair(workers_smoke_out):
    for variant in ("bad", "fixed"):
        run_dir = workers_smoke_out / "dataloader_workers" / variant
        result = analyze.analyze_trace(run_dir)
        summary = read_summary(workers_smoke_out, "dataloader_workers", variant)
        assert result["trace"].endswith(summary["trace_file"])
        assert result["device"] == "cpu" and result["gpu"] is None and result["steps"] == 3
        # Recomputed from the raw events: with no GPU the steps are the ProfilerStep spans, and
        # the DataLoader spans (one per step, one after another) are summed inside them.
        steps = cpu_spans(result["trace"], lambda name: name.startswith("ProfilerStep#"))
        loader = cpu_spans(result["trace"], lambda name: name.startswith("enumerate(DataLoader)#"))
        low, high = steps[0][0], steps[-1][1]
        step_ms = [(end - start) / 1000 for start, end in steps]
        assert result["step_ms"]["mean"] == pytest.approx(sum(step_ms) / 3)
        assert result["step_ms"]["p50"] == pytest.approx(sorted(step_ms)[1])
        inside_us = sum(max(0.0, min(end, high) - max(start, low)) for start, end in loader)
        assert len(loader) >= 3 and result["dataloader_pct"] == pytest.approx(
            100 * inside_us / (high - low))
        assert result["peak_memory_mb"] == pytest.approx(summary["peak_memory_mb"])
        assert sum(result["step_breakdown_ms"].values()) == pytest.approx(
            result["step_ms"]["mean"])
        # No GPU verdict on a CPU trace. (Which CPU-side verdicts fire on a smoke step is its
        # timing: SGD's share of a tiny ResNet step can reach unfused_optimizer's line.)
        assert not {f["id"] for f in result["findings"]} & GPU_ONLY_VERDICTS


def test_dataloader_verdict_on_the_workers_pair_at_cpu_preset_sizes(workers_cpu_out):
    """The workers pair at the CPU preset's sizes, read by the analyzer. Where the live shares
    fall relative to the rule's share depends on this CPU's decode and training speeds (~35 % bad on
    the 2-core Xeon here), so the rule's threshold is pinned on hand-built traces
    (test_verdict_thresholds_are_the_boundaries, tests/test_verdict_edges.py), and which variant
    waits longer is a timing of one step, left to the benchmark (run_demos.sh). What a live run
    decides on any machine: the verdict fires exactly when the share it measured reaches the
    rule's line (10 % where workers make the batches), the analyzer names no other cause, and the bad run's main process does the data
    work itself (operators inside every __next__, at least one per image) where the fixed one's
    only receives batches that workers made (fewer operators per batch than images in it)."""
    ops_per_batch = {}
    for variant in ("bad", "fixed"):
        result = analyze.analyze_trace(workers_cpu_out / "dataloader_workers" / variant)
        assert result["device"] == "cpu" and result["gpu"] is None
        found = {f["id"]: f for f in result["findings"]}
        assert set(found) <= {"dataloader"}, variant
        fires = result["dataloader_pct"] >= dataloader_share_min_pct(result["dataloader_workers"])
        assert ("dataloader" in found) == fires, (variant, result["dataloader_pct"])
        if fires:  # its evidence quotes the share it measured, and the demo
            assert f"{result['dataloader_pct']:.0f} %" in found["dataloader"]["evidence"]
            assert found["dataloader"]["demo"] == "dataloader_workers"
        nexts = cpu_spans(result["trace"], lambda name: name.startswith("enumerate(DataLoader)#"))
        inside = [e for e in trace.load_trace(result["trace"])["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                  and not e["name"].startswith("enumerate(DataLoader)#")
                  and any(low <= e["ts"] < high for low, high in nexts)]
        ops_per_batch[variant] = len(inside) / len(nexts)
    batch_size = read_summary(workers_cpu_out, "dataloader_workers", "bad")["batch_size"]
    assert ops_per_batch["bad"] >= batch_size > ops_per_batch["fixed"], ops_per_batch
    for variant in ("bad", "fixed"):
        wait = read_summary(workers_cpu_out, "dataloader_workers", variant)["data_wait_pct"]
        assert 0 <= wait <= 100


def test_a_copy_under_the_kernels_is_not_copy_bound(tmp_path):
    """dataloader_workers/fixed on a GPU copies the next batch on a side stream while the step's
    kernels run: the copy takes as long as before, but nothing waits for it. Only the copy time
    with no kernel beside it counts for the h2d_copy verdict. Times in µs after T0."""
    def one_step(copy_gpu_start: float, copy_stream: int) -> KinetoTrace:
        t = KinetoTrace()
        t.gpu()
        t.step(1, T0, 1000)
        t.launch(T0 + 10, 5, T0 + 100, 600, name=FP32_GEMM)  # the step's compute: 100 .. 700
        t.stream = copy_stream
        t.memcpy(T0 + 20, 5, T0 + copy_gpu_start, 300, kind="HtoD")
        return t

    hidden = analyze.analyze_trace(one_step(200, copy_stream=8).write(tmp_path / "h.json"))
    exposed = analyze.analyze_trace(one_step(700, copy_stream=7).write(tmp_path / "e.json"))
    for result in (hidden, exposed):
        assert result["gpu"]["h2d_pct"] == pytest.approx(100 * 300 / result["window_ms"] / 1000)
    assert hidden["gpu"]["h2d_exposed_pct"] == pytest.approx(0.0)
    assert exposed["gpu"]["h2d_exposed_pct"] == pytest.approx(exposed["gpu"]["h2d_pct"])
    assert "h2d_copy" not in {f["id"] for f in hidden["findings"]}
    assert "h2d_copy" in {f["id"] for f in exposed["findings"]}
