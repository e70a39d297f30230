"""The five pairs after dataloader_workers, from the session's smoke run of every demo
(./scripts/run_demos.sh --smoke --device cpu, the demos_smoke fixture). Speed ratios are left to
the benchmark run: at smoke sizes on two shared cores they are noise. These tests check what a smoke
run decides reliably: each script trains what it says it trains, and its trace shows the mechanism
of the fix (BF16 matmuls, recomputed blocks, compiled regions, values read back to the host)."""
from __future__ import annotations

from collections import Counter

import pytest

from common import devices, harness, presets, profiling, runs, trace
from tests.conftest import assert_timing_is_consistent, read_summary

PAIRS = ("small_batch", "mixed_precision", "activation_checkpointing", "launch_overhead",
         "item_sync")
REQUIRED_SUMMARY_FIELDS = {
    "demo", "variant", "device", "preset", "batch_size", "steps", "samples_per_s", "step_ms_mean",
    "step_ms_p50", "step_ms_p95", "peak_memory_mb", "first_step_s", "warmup_s", "config", "extra",
    "notes", "timed_wall_s", "data_wait_pct", "profiled_step_ms_p50", "profiler_overhead_ratio",
}
REGIONS = {"data", "forward", "backward", "optimizer"}
SMALL_BATCH_BAD = 8  # bad.py's batch
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
# The CPU target for activation checkpointing; smoke sizes measure 0.42 (deterministic:
# the same tensors are allocated on every run).
CHECKPOINT_PEAK_RATIO_MAX = 0.6
ITEM_SYNC_READ_EVERY = 10  # fixed.py's LOG_EVERY_STEPS
NO_NATIVE_BF16 = "no native BF16 on this CPU; the speed-up needs tensor cores"


def cpu_ops(out, demo: str, variant: str) -> list[dict]:
    """The operator events of the run's trace (all recorded steps)."""
    events = trace.load_trace(trace.trace_files(out / demo / variant)[0])["traceEvents"]
    return [e for e in events if e.get("cat") == "cpu_op"]


def op_counts(out, demo: str, variant: str) -> Counter:
    return Counter(event["name"] for event in cpu_ops(out, demo, variant))


def smoke_sizes(demo: str) -> dict:
    return presets.PRESETS[demo]["smoke"].sizes


@pytest.fixture(scope="module")
def pairs(demos_smoke) -> dict[str, dict[str, dict]]:
    """{demo: {variant: summary}} for the five pairs, after checking the runner ran each script."""
    summaries = {}
    for demo in PAIRS:
        for variant in ("bad", "fixed"):
            assert f"{demo}/{variant}" in demos_smoke.ran
        summaries[demo] = {v: read_summary(demos_smoke.out, demo, v) for v in ("bad", "fixed")}
    return summaries


def test_every_script_writes_a_summary_and_a_trace_of_three_steps(pairs, demos_smoke_out):
    for demo, by_variant in pairs.items():
        for variant, summary in by_variant.items():
            where = f"{demo}/{variant}"
            assert REQUIRED_SUMMARY_FIELDS <= summary.keys(), where
            assert (summary["demo"], summary["variant"]) == (demo, variant)
            assert summary["device"] == "cpu" and summary["preset"] == "smoke", where
            assert summary["steps"] == presets.PRESETS[demo]["smoke"].steps, where
            assert 0 < summary["first_step_s"] <= summary["warmup_s"], where
            assert_timing_is_consistent(summary)
            # Operator shapes only where the lesson reads them (they slow every operator).
            assert summary["config"]["profiler_record_shapes"] is (
                profiling.records_shapes(demo, is_cuda=False)), where
            events = trace.load_trace(trace.trace_files(demos_smoke_out / demo / variant)[0])
            names = Counter(e.get("name") for e in events["traceEvents"])
            assert sum(n for name, n in names.items()
                       if str(name).startswith("ProfilerStep#")) == runs.PROFILE_ACTIVE_STEPS
            assert all(names[region] == runs.PROFILE_ACTIVE_STEPS for region in REGIONS), where
            has_shapes = any("Input Dims" in e.get("args", {}) for e in events["traceEvents"])
            assert has_shapes is summary["config"]["profiler_record_shapes"], where


def test_small_batch_trains_8_samples_in_bad_and_the_preset_batch_in_fixed(pairs, demos_smoke_out):
    bad, fixed = pairs["small_batch"]["bad"], pairs["small_batch"]["fixed"]
    assert bad["batch_size"] == SMALL_BATCH_BAD
    preset_batch = presets.PRESETS["small_batch"]["smoke"].batch_size
    assert fixed["batch_size"] == preset_batch > SMALL_BATCH_BAD
    for variant, summary in (("bad", bad), ("fixed", fixed)):
        assert summary["config"]["data"] == "staged on the device"
        # The images the first convolution saw: [batch, 3, px, px] with the batch the summary names.
        first_conv = next(e for e in cpu_ops(demos_smoke_out, "small_batch", variant)
                          if e["name"] == "aten::conv2d")
        side = smoke_sizes("small_batch")["image_px"]
        assert first_conv["args"]["Input Dims"][0] == [summary["batch_size"], 3, side, side]


def test_mixed_precision_fixed_runs_its_matmuls_in_bf16(pairs, demos_smoke_out):
    bad, fixed = pairs["mixed_precision"]["bad"], pairs["mixed_precision"]["fixed"]
    assert bad["config"]["autocast_dtype"] is None
    assert fixed["config"]["autocast_dtype"] == "bfloat16"
    for summary in (bad, fixed):  # TF32 off in both: the only change is BF16
        assert summary["config"]["tf32_matmul"] is False
        assert summary["config"]["tf32_cudnn"] is False

    def matmul_types(variant: str) -> Counter:
        return Counter("c10::BFloat16" in e["args"].get("Input type", [])
                       for e in cpu_ops(demos_smoke_out, "mixed_precision", variant)
                       if e["name"] in MATMUL_OPS)

    assert matmul_types("bad")[True] == 0 and matmul_types("bad")[False] > 0
    in_bf16 = matmul_types("fixed")
    assert in_bf16[True] > 0 and in_bf16[False] == 0  # forward and backward matmuls alike


def test_mixed_precision_says_what_bf16_means_on_this_cpu(pairs):
    bad, fixed = pairs["mixed_precision"]["bad"], pairs["mixed_precision"]["fixed"]
    flags = devices.cpu_native_bf16_flags()
    assert fixed["extra"]["cpu_native_bf16_flags"] == flags
    assert any(NO_NATIVE_BF16 in note for note in fixed["notes"]) is (not flags)
    assert all(any(flag in note for note in fixed["notes"]) for flag in flags)
    assert not any("BF16" in note for note in bad["notes"])  # nothing ran in BF16


# (flags /proc/cpuinfo lists, what the note must say, what it must not)
BF16_NOTES = [
    ([], NO_NATIVE_BF16, "speed-up is possible"),
    (["avx512_bf16"], "no AMX tiles: BF16 matmuls may run no faster than FP32", "possible"),
    (["bf16"], "no AMX tiles", "speed-up is possible"),  # an Arm CPU's Features line
    (["amx_bf16", "avx512_bf16"], "AMX tile units", "no faster"),
]


@pytest.mark.parametrize("flags, says, never_says", BF16_NOTES)
def test_bf16_note_promises_only_what_the_cpu_can_do(monkeypatch, tmp_path, flags, says,
                                                     never_says):
    monkeypatch.setattr(devices, "cpu_native_bf16_flags", lambda: flags)
    run = harness.setup("mixed_precision", "fixed", ["--device", "cpu", "--smoke",
                                                     "--out", str(tmp_path)])
    devices.note_cpu_bf16(run)
    assert run.extra == {"cpu_native_bf16": bool(flags), "cpu_native_bf16_flags": flags}
    [note] = run.notes
    assert says in note and never_says not in note
    assert all(flag in note for flag in flags)


@pytest.mark.parametrize("cpuinfo, flags", [
    ("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16 amx_bf16 amx_tile\n",
     ["amx_bf16", "avx512_bf16"]),
    ("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n", []),
    ("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve bf16 i8mm\n", ["bf16"]),
    ("", []),
])
def test_bf16_flags_are_read_from_proc_cpuinfo(monkeypatch, tmp_path, cpuinfo, flags):
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    monkeypatch.setattr(devices, "CPUINFO_PATH", path)
    assert devices.cpu_native_bf16_flags() == flags
    monkeypatch.setattr(devices, "CPUINFO_PATH", tmp_path / "missing")  # not Linux
    assert devices.cpu_native_bf16_flags() == []


def test_activation_checkpointing_keeps_less_and_recomputes_each_block(pairs, demos_smoke_out):
    demo = "activation_checkpointing"
    bad, fixed = pairs[demo]["bad"], pairs[demo]["fixed"]
    assert fixed["peak_memory_mb"] <= CHECKPOINT_PEAK_RATIO_MAX * bad["peak_memory_mb"]
    # Each block's attention runs once per step in bad; in fixed once more, recomputed in backward.
    attention_calls = runs.PROFILE_ACTIVE_STEPS * smoke_sizes(demo)["blocks"]
    attention = "aten::scaled_dot_product_attention"
    assert op_counts(demos_smoke_out, demo, "bad")[attention] == attention_calls
    assert op_counts(demos_smoke_out, demo, "fixed")[attention] == 2 * attention_calls


def test_launch_overhead_fixed_is_compiled_outside_the_timing(pairs, demos_smoke_out):
    bad, fixed = pairs["launch_overhead"]["bad"], pairs["launch_overhead"]["fixed"]
    assert bad["config"]["torch_compile"] is None
    assert fixed["config"]["torch_compile"] == "default"  # reduce-overhead is for CUDA graphs
    # Dynamo compiled the model in the warm-up and never again: no compile was timed.
    compiled = fixed["extra"]["dynamo_frames_compiled"]
    assert compiled["warmup"] >= 1 and compiled["timed_and_profiled"] == 0
    assert "dynamo_frames_compiled" not in bad["extra"]
    # One whole graph: no graph break, no frame at the recompile limit, its compile timed.
    dynamo = fixed["extra"]["dynamo"]
    assert dynamo["graph_breaks"] == 0 and dynamo["graph_break_reasons"] == {}
    assert dynamo["graphs"] >= 1 and not dynamo["recompile_limit_hit"]
    assert 0 < dynamo["compile_s"] <= fixed["warmup_s"]
    eager_ops = op_counts(demos_smoke_out, "launch_overhead", "bad")
    compiled_ops = op_counts(demos_smoke_out, "launch_overhead", "fixed")
    assert compiled_ops["Torch-Compiled Region: 0/0"] == runs.PROFILE_ACTIVE_STEPS
    assert not any(name.startswith("Torch-Compiled Region") for name in eager_ops)
    # Fused: far fewer operators dispatched per step (measured 249 against 759 in three steps).
    assert sum(compiled_ops.values()) < sum(eager_ops.values()) / 2


def test_item_sync_bad_reads_values_back_every_step_and_fixed_every_tenth(pairs, demos_smoke_out):
    bad, fixed = pairs["item_sync"]["bad"], pairs["item_sync"]["fixed"]
    assert bad["config"]["read_every_steps"] == 1
    assert fixed["config"]["read_every_steps"] == ITEM_SYNC_READ_EVERY
    preset = presets.PRESETS["item_sync"]["smoke"]
    total_steps = (preset.warmup_steps + preset.steps + runs.PROFILE_WAIT_STEPS
                   + runs.PROFILE_WARMUP_STEPS + runs.PROFILE_ACTIVE_STEPS)
    assert bad["extra"]["logged"]["step"] == total_steps
    last_read = total_steps // ITEM_SYNC_READ_EVERY * ITEM_SYNC_READ_EVERY
    assert last_read > 0  # the smoke preset has enough steps for fixed.py to read once
    assert fixed["extra"]["logged"]["step"] == last_read
    for summary in (bad, fixed):
        assert 0 < summary["extra"]["logged"]["loss"] < float("inf")
        assert any("expect about 1.0x" in note for note in summary["notes"])  # said in words
    # A Python `if` on a tensor and .item() both end in aten::_local_scalar_dense, the op that
    # waits for the device: per step, a check per block in forward and in backward, and two .item().
    reads = "aten::_local_scalar_dense"
    per_step = 2 * smoke_sizes("item_sync")["blocks"] + 2
    assert op_counts(demos_smoke_out, "item_sync", "bad")[reads] == \
        per_step * runs.PROFILE_ACTIVE_STEPS
    assert op_counts(demos_smoke_out, "item_sync", "fixed")[reads] == 0
