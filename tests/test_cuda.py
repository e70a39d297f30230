"""Every pair on a CUDA GPU at smoke sizes, through scripts/run_demos.py: both scripts and the
comparison succeed, each trace holds GPU kernels and each summary says cuda. Marked `cuda` and
skipped where PyTorch sees no GPU (this machine, CI). On a GPU machine:

    PYTHON=python3 ./scripts/test.sh -m cuda
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from common import analyze, compare, ladder, presets, runs, trace, verdicts
from tests.conftest import ROOT
from tests.test_data_pipeline import assert_compiled_jitter_is_eager

# Both scripts of a pair at smoke sizes take seconds; launch_overhead's fixed.py compiles
# (Triton: a minute or two, cold). This only stops a hung run.
PAIR_TIMEOUT_S = 900
NO_GPU = (f"no CUDA GPU: torch.cuda.is_available() is False (torch {torch.__version__}, "
          f"CUDA build {torch.version.cuda})")

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)]


def pairs() -> list[str]:
    """Every demos/<name>/ with a bad.py and a fixed.py, as run_demos.sh finds them."""
    return sorted(folder.name for folder in (ROOT / "demos").iterdir()
                  if all((folder / f"{variant}.py").is_file() for variant in compare.VARIANTS))


@pytest.mark.parametrize("demo", pairs())
def test_pair_runs_on_the_gpu(demo, tmp_path):
    # The project root on the path, as ./scripts/test.sh sets it with PYTHON=...: the scripts
    # import `common`, and an existing environment has not pip-installed this project.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_demos.py"), demo, "--smoke",
         "--device", "cuda", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=PAIR_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for variant in compare.VARIANTS:
        run_dir = tmp_path / demo / variant
        summary = json.loads((run_dir / trace.SUMMARY_FILE).read_text())
        assert (summary["device"], summary["preset"]) == ("cuda", "smoke"), variant
        analysis = analyze.analyze_trace(run_dir)
        assert analysis["device"] == "cuda", f"{variant}: no GPU activity in the trace"
        assert analysis["gpu"]["kernels_per_step"] > 0, variant
        # what FP32 math was allowed to run in, recorded for every pair (compare.precision)
        assert {type(summary["config"].get(k)) for k in ("tf32_matmul", "tf32_cudnn")} == {bool}
        # the warm-up starts on an empty GPU queue: every kernel in the recording was launched
        # while CUPTI was on
        assert analysis["gpu"]["idle_by_cause_pct"]["unrecorded"] == 0.0, variant
        if demo == "llm_decode":  # fixed replays each token as a CUDA graph, bad never does
            graphs = analysis["gpu"]["graph_launches_per_step"]
            tokens = summary["config"]["new_tokens"]
            assert graphs >= tokens - 1 if variant == "fixed" else graphs == 0, (variant, graphs)
        if demo == "tokenizer_bound" and variant == "bad":  # the GPU waits while it tokenizes
            assert analysis["host_regions"]["tokenize"]["gpu_idle_pct"] > 0
        if demo == "host_roundtrip":  # its syncs are structural: the same count at any size
            syncs = analysis["gpu"]["syncs_per_step"]
            assert syncs >= 5 if variant == "bad" else syncs == 0, (variant, syncs)
            # fixed ran a step under torch.cuda.set_sync_debug_mode("error") (config sync_free)
            assert variant == "bad" or "made no sync" in result.stdout
        if demo == "recompiles":  # the compile verdicts read host operators: the same on a GPU
            found = {f["id"] for f in analysis["findings"]}
            syncs = analysis["gpu"]["syncs_per_step"]
            if variant == "bad":  # .item() breaks the graph and syncs with the GPU every step
                assert "graph_breaks" in found and syncs >= 1, (found, syncs)
                assert summary["extra"]["dynamo"]["graphs"] >= 3
            else:
                assert not found & {"recompiles", "graph_breaks"} and syncs == 0, (found, syncs)
                assert summary["extra"]["dynamo"]["graphs"] == 1
        check_memory(demo, variant, run_dir, summary, analysis)
    if demo == "item_sync":
        check_snapshot_flag(tmp_path)


def test_ladder_runs_every_rung_on_the_gpu(tmp_path):
    """Every rung of the ladder at smoke sizes through run_demos.py: each runs on the GPU, its
    trace holds kernels and the operators' shapes (the analyzer reads each rung's batch from them),
    and the waterfall reads them all."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_demos.py"), "ladder", "--smoke",
         "--device", "cuda", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=PAIR_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = ladder.ladder_rows(tmp_path / "ladder")
    assert [row["fix"] for row in rows[1:]] == list(ladder.FIX_DEMO)
    for row in rows:
        assert row["device"] == "cuda", row["rung"]
        analysis = analyze.analyze_trace(tmp_path / "ladder" / row["rung"])
        assert analysis["gpu"]["kernels_per_step"] > 0, row["rung"]
        assert analysis["gpu"]["idle_by_cause_pct"]["unrecorded"] == 0.0, row["rung"]
        summary = json.loads((tmp_path / "ladder" / row["rung"] / trace.SUMMARY_FILE).read_text())
        # A compiled step's convolutions run inside Inductor's generated code: no aten operator
        # there records a shape, and no rule needs the batch once the step is compiled.
        compiled = summary["config"].get("torch_compile") is not None
        expected_batch = None if compiled else row["batch_size"]
        assert analysis["input_batch"] == expected_batch, row["rung"]
        # From rung 3 the math is BF16 where the GPU has BF16 tensor cores, FP32 where it has none
        from_bf16 = row["k"] > list(ladder.FIX_DEMO).index("bf16")
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        # nothing skipped on a GPU, but the link to the BF16 rung where it kept FP32
        skipped = row["chain"] is not None and row["chain"]["status"] == "skipped"
        assert skipped is (not native and row["chain"] is not None
                           and row["chain"]["next_fix"] == "bf16"), row["rung"]
        expected = "bfloat16" if from_bf16 and native else None
        assert summary["config"]["autocast_dtype"] == expected, row["rung"]
        assert summary["extra"].get("bf16_kept_fp32", False) is (from_bf16 and not native)


def test_memory_ladder_runs_every_rung_on_the_gpu(tmp_path):
    """Every rung of the memory ladder at smoke sizes through run_demos.py, under the smoke
    preset's budget (a cap of the GPU's allocator): each fits and its peak reserved stays under
    the cap. Then under a budget of 1 KB, which no rung fits: each stops at the cap in one line
    and leaves its record, run_demos.py counts that as the rung's result, and the table says
    "out of memory at the cap" for every rung."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, str(ROOT / "scripts" / "run_demos.py"), "memory_ladder", "--smoke",
               "--device", "cuda"]
    roomy = subprocess.run(command + ["--out", str(tmp_path / "roomy")], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=PAIR_TIMEOUT_S)
    assert roomy.returncode == 0, roomy.stdout[-3000:] + roomy.stderr[-3000:]
    rows = ladder.memory_rows(tmp_path / "roomy" / "memory_ladder")
    assert len(rows) == 5 and all(row["device"] == "cuda" and row["ran"] for row in rows)
    for row in rows:
        assert row["fits"] and 0 < row["peak_mb"] <= row["budget_mb"], row["rung"]
        assert row["peak_of"] == "reserved by the CUDA caching allocator"
        analysis = analyze.analyze_trace(tmp_path / "roomy" / "memory_ladder" / row["rung"])
        assert analysis["gpu"]["kernels_per_step"] > 0, row["rung"]
    tight = subprocess.run(command + ["--out", str(tmp_path / "tight"), "--memory-budget-gb",
                                      "0.000001"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=PAIR_TIMEOUT_S)
    assert tight.returncode == 0, tight.stdout[-3000:] + tight.stderr[-3000:]
    assert "Traceback" not in tight.stderr
    assert tight.stderr.count("error: over the memory budget: memory_ladder/") == 5
    rows = ladder.memory_rows(tmp_path / "tight" / "memory_ladder")
    assert len(rows) == 5 and not any(row["ran"] or row["fits"] for row in rows)
    assert "first rung that fits: none" in tight.stdout


def test_memory_budget_caps_the_allocator(tmp_path):
    """--memory-budget-gb on a GPU: a budget the smoke run fits in is checked against the peak
    reserved, which the cap keeps under it; one of 1 KB stops the run in one line, exit 2, with
    nothing left in its run folder but the record that it did not fit."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    script = [sys.executable, str(ROOT / "demos" / "item_sync" / "bad.py"), "--smoke",
              "--device", "cuda", "--out", str(tmp_path)]
    roomy = subprocess.run(script + ["--memory-budget-gb", "1"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=PAIR_TIMEOUT_S)
    assert roomy.returncode == 0, roomy.stdout[-3000:] + roomy.stderr[-3000:]
    summary = json.loads((tmp_path / "item_sync" / "bad" / trace.SUMMARY_FILE).read_text())
    budget = summary["memory_budget"]
    assert budget["fits"] and 0 < budget["peak_mb"] == summary["peak_reserved_mb"] <= 1000
    tight = subprocess.run(script + ["--memory-budget-gb", "0.000001"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=PAIR_TIMEOUT_S)
    assert tight.returncode == 2 and "Traceback" not in tight.stderr, tight.stderr[-3000:]
    assert tight.stderr.startswith("error: over the memory budget: item_sync/bad")
    assert not (tmp_path / "item_sync" / "bad" / trace.SUMMARY_FILE).exists()
    assert (tmp_path / "item_sync" / "bad" / trace.OUT_OF_MEMORY_FILE).is_file()  # the result


# Flat: growth under the memory_growth verdict's bound, a share of the steps' peak a step.
FLAT_GROWTH_OF_PEAK = verdicts.MEMORY_GROWTH_MIN_PCT / 100
KEPT_LOGITS_MIN = 0.99  # bad keeps its logits a step: 1 % below allows no more than rounding


def check_memory(demo: str, variant: str, run_dir, summary: dict, analysis: dict) -> None:
    """What a GPU run records of memory: the allocator's counters at each recorded step's end,
    the peak reserved, the snapshot where the demo's lesson is memory; the leak's slope and the
    fragmentation pair's segments."""
    where = f"{demo}/{variant}"
    by_step = summary["memory_by_step"]
    assert len(by_step["allocated_mb"]) == len(by_step["reserved_mb"]) == analysis["steps"], where
    assert summary["peak_reserved_mb"] >= summary["peak_memory_mb"] > 0, where
    snapshot_path = run_dir / runs.MEMORY_SNAPSHOT_FILE
    assert snapshot_path.is_file() is (demo in runs.MEMORY_SNAPSHOT_DEMOS_CUDA), where
    if demo == "memory_leak":
        sizes = presets.PRESETS[demo]["smoke"]
        logits_mb = (sizes.batch_size * sizes.sizes["seq_len"] * sizes.sizes["vocab"] * 4
                     / trace.BYTES_PER_MB)
        slope = float(np.polyfit(np.arange(analysis["steps"]), by_step["allocated_mb"], 1)[0])
        if variant == "bad":
            assert slope >= logits_mb * KEPT_LOGITS_MIN, (where, slope, logits_mb)
        else:
            peak = analysis["memory"]["steps_peak_allocated_mb"]  # the rule's peak
            assert abs(slope) < FLAT_GROWTH_OF_PEAK * peak, (where, slope)
    if demo == "fragmentation":  # fixed's segments grow in place; bad's are fixed in size
        with open(snapshot_path, "rb") as file:
            segments = pickle.load(file)["segments"]
        assert segments and {s.get("is_expandable", False) for s in segments} == {
            variant == "fixed"}, where


def check_snapshot_flag(tmp_path) -> None:
    """--memory-snapshot on a pair that does not record one by default (item_sync/bad) writes a
    snapshot with the allocations of its profiled steps, and says how to draw it."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "demos" / "item_sync" / "bad.py"), "--smoke", "--device",
         "cuda", "--memory-snapshot", "--out", str(tmp_path / "snapshot")],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))),
        capture_output=True, text=True, timeout=PAIR_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(tmp_path / "snapshot" / "item_sync" / "bad" / runs.MEMORY_SNAPSHOT_FILE,
              "rb") as file:
        snapshot = pickle.load(file)
    assert snapshot["segments"] and snapshot["device_traces"][0]  # allocations were recorded
    assert "torch.cuda._memory_viz trace_plot" in result.stdout


def test_the_colour_jitter_compiles_to_the_eager_values_on_the_gpu():
    """The ladder's rung 5 jitters each batch on the GPU in Inductor's code (data.jitter_on_device):
    compiled whole, on a batch of the GPU preset's image size, it gives the eager values."""
    assert_compiled_jitter_is_eager(torch.device("cuda"), images=64, size=224, seed=0)
