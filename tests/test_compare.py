"""python -m common.compare: a pair side by side, its ratios, its verdicts, its errors."""
from __future__ import annotations

import json
import shutil

import pytest

from common import analyze, compare
from tests.conftest import read_summary


def test_synthetic_gpu_pair_side_by_side(synthetic_pairs_out, capsys):
    assert compare.main([str(synthetic_pairs_out / "small_batch"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["demo"] == "small_batch"
    assert result["speedup"] == pytest.approx(5300 / 1000)
    assert result["peak_memory_ratio"] == pytest.approx(8000 / 2000)
    bad, fixed = result["bad"]["analysis"], result["fixed"]["analysis"]
    assert [f["id"] for f in bad["findings"]] == ["small_batch"] and fixed["findings"] == []
    # 15 µs kernels launched every 40 µs keep the GPU busy 15/40 of the time.
    assert bad["gpu"]["utilization_pct"] == pytest.approx(100 * 15 / 40, abs=1.0)
    assert bad["gpu"]["median_kernel_us"] == pytest.approx(15.0)
    assert fixed["gpu"]["utilization_pct"] > 95
    # The same analysis as the analyzer's own command gives.
    run_dir = synthetic_pairs_out / "small_batch" / "bad"
    assert bad == analyze.analyze_trace(run_dir)


def test_text_table_rows_and_ratios(synthetic_pairs_out, capsys):
    assert compare.main([str(synthetic_pairs_out / "small_batch")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("small_batch: cuda (NVIDIA H100 80GB HBM3), torch 2.6.0")
    assert "batch 8 (bad) / 256 (fixed)" in out
    rows = {line.split("  ")[1].strip(): line for line in out.splitlines()[1:]
            if line.startswith("  ") and "  " in line[2:]}
    for label in ("samples/s", "step p50 ms", "GPU utilization %", "GPU idle %", "kernels/step",
                  "median kernel us", "syncs/step", "peak memory MB", "verdicts"):
        assert label in rows, label
    assert rows["samples/s"].split()[-1] == "5.30x"
    assert "fixed / bad: 5.30x samples/s, 4.00x peak memory" in out
    assert "bad: [high] small_batch:" in out or "bad: [medium] small_batch:" in out


def test_cpu_pair_from_the_smoke_runs(workers_smoke_out, capsys):
    assert compare.main([str(workers_smoke_out / "dataloader_workers"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    bad = read_summary(workers_smoke_out, "dataloader_workers", "bad")
    fixed = read_summary(workers_smoke_out, "dataloader_workers", "fixed")
    assert result["speedup"] == pytest.approx(fixed["samples_per_s"] / bad["samples_per_s"])
    assert result["peak_memory_ratio"] == pytest.approx(fixed["peak_memory_mb"]
                                                        / bad["peak_memory_mb"])
    assert result["bad"]["analysis"]["gpu"] is None
    labels = [row[0] for row in compare.table_rows(result)]
    assert "GPU utilization %" not in labels and "DataLoader %" in labels  # no GPU rows on a CPU


@pytest.mark.parametrize("damage, problem", [
    (lambda d: shutil.rmtree(d / "fixed"), "fixed: no such directory"),
    (lambda d: (d / "bad" / "summary.json").unlink(), "summary.json: missing"),
    (lambda d: (d / "bad" / "summary.json").write_text("{"), "summary.json: not JSON"),
    (lambda d: [p.write_bytes(b"\x1f\x8b\x08garbage") for p in (d / "bad").glob("*.gz")],
     "truncated or corrupt gzip"),
])
def test_broken_pairs_are_one_line_and_exit_code_2(synthetic_pairs_out, tmp_path, capsys,
                                                   damage, problem):
    demo_dir = tmp_path / "small_batch"
    shutil.copytree(synthetic_pairs_out / "small_batch", demo_dir)
    damage(demo_dir)
    assert compare.main([str(demo_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("compare: ") and problem in captured.err
