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


def edit_summary(run_dir, **changes) -> None:
    path = run_dir / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("field, fixed_value, remedy", [
    ("device", "cpu", "--device"),  # the bad run says cuda
    ("device_name", "NVIDIA A100-SXM4-40GB", "same machine"),
    ("preset", "smoke", "--smoke"),
    ("torch_version", "2.7.1", "same torch"),
])
def test_runs_under_different_conditions_are_not_compared(synthetic_pairs_out, tmp_path, capsys,
                                                          field, fixed_value, remedy):
    demo_dir = tmp_path / "small_batch"
    shutil.copytree(synthetic_pairs_out / "small_batch", demo_dir)
    bad_value = json.loads((demo_dir / "bad" / "summary.json").read_text())[field]
    assert bad_value != fixed_value
    edit_summary(demo_dir / "fixed", **{field: fixed_value})
    assert compare.main([str(demo_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    message = captured.err
    assert message.startswith("compare: ") and f"{field} differs" in message
    # Both values, bad's first, and what to rerun with.
    assert str(bad_value) in message and str(fixed_value) in message
    assert message.index(str(bad_value)) < message.index(str(fixed_value))
    assert "rerun both" in message and remedy in message
    if field == "device":
        assert "bad ran on cuda, fixed ran on cpu" in message
    with pytest.raises(compare.CompareError):
        compare.compare(demo_dir)


def test_conditions_both_runs_lack_are_no_difference(synthetic_pairs_out, tmp_path, capsys):
    """A summary without torch_version in either run (an older harness) still compares; the
    batch size may differ (it is the small_batch pair's lesson)."""
    demo_dir = tmp_path / "small_batch"
    shutil.copytree(synthetic_pairs_out / "small_batch", demo_dir)
    for variant in ("bad", "fixed"):
        path = demo_dir / variant / "summary.json"
        summary = json.loads(path.read_text())
        del summary["torch_version"]
        path.write_text(json.dumps(summary))
    assert compare.main([str(demo_dir), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bad"]["summary"]["batch_size"] != result["fixed"]["summary"]["batch_size"]


def test_a_missing_named_trace_is_an_error_not_another_trace(synthetic_pairs_out, tmp_path,
                                                             capsys):
    """The summary names its trace; with that file gone, an older trace left in the folder must
    not be analysed in its place."""
    demo_dir = tmp_path / "small_batch"
    shutil.copytree(synthetic_pairs_out / "small_batch", demo_dir)
    run_dir = demo_dir / "fixed"
    named = json.loads((run_dir / "summary.json").read_text())["trace_file"]
    (run_dir / named).rename(run_dir / "older_run.1.pt.trace.json.gz")
    assert compare.main([str(demo_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("compare: ")
    assert f"names {named}, which is missing from {run_dir}" in captured.err
