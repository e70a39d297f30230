"""python -m common.compare: a pair side by side, its ratios, its verdicts, its errors."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from common import analyze, compare, recorded, trace
from tests.conftest import ROOT, read_summary
from tests.kineto_builder import ELEMENTWISE, KinetoTrace

CLI_TIMEOUT_S = 120  # a command line on a small synthetic pair takes about a second


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
    # 100 kernels of 15 µs per step, one launch each; none is short (< 10 µs).
    assert bad["gpu"]["kernels_per_step"] == 100 and bad["gpu"]["launches_per_step"] == 100
    assert bad["gpu"]["short_kernel_pct"] == 0
    assert fixed["gpu"]["utilization_pct"] > 95
    for variant in ("bad", "fixed"):  # each analysis is of the trace its summary names
        named = result[variant]["summary"]["trace_file"]
        assert result[variant]["analysis"]["trace"].endswith(f"/{variant}/{named}")


def test_the_named_trace_is_analysed_even_when_a_newer_one_sits_beside_it(synthetic_pairs_out,
                                                                          tmp_path):
    """A healthy trace with a later mtime in bad/ (left by another run, say) is not read: the
    summary names its own trace, the small-batch one (GPU 15/40 busy)."""
    demo_dir = tmp_path / "small_batch"
    shutil.copytree(synthetic_pairs_out / "small_batch", demo_dir)
    bad_dir = demo_dir / "bad"
    named = json.loads((bad_dir / "summary.json").read_text())["trace_file"]
    other = bad_dir / "small_batch_fixed.2.pt.trace.json.gz"
    shutil.copy(demo_dir / "fixed" / "small_batch_fixed.1.pt.trace.json.gz", other)
    os.utime(bad_dir / named, (1_000_000_000, 1_000_000_000))
    os.utime(other, (2_000_000_000, 2_000_000_000))  # the newest trace in the folder
    bad = compare.compare(demo_dir)["bad"]["analysis"]
    assert bad["trace"] == str(bad_dir / named)
    assert bad["gpu"]["utilization_pct"] == pytest.approx(100 * 15 / 40, abs=1.0)
    assert [f["id"] for f in bad["findings"]] == ["small_batch"]


@pytest.mark.parametrize("newest", ["small_batch_bad.1.pt.trace.json.gz", "older.pt.trace.json.gz"])
def test_without_trace_file_the_newest_trace_is_analysed(synthetic_pairs_out, tmp_path, newest):
    """An older summary names no trace: the run folder's newest trace (by mtime, set here, not by
    name) is read. bad/ holds its own small-batch trace and a healthy one."""
    demo_dir = tmp_path / "small_batch"
    shutil.copytree(synthetic_pairs_out / "small_batch", demo_dir)
    bad_dir = demo_dir / "bad"
    summary = json.loads((bad_dir / "summary.json").read_text())
    del summary["trace_file"]
    (bad_dir / "summary.json").write_text(json.dumps(summary))
    shutil.copy(demo_dir / "fixed" / "small_batch_fixed.1.pt.trace.json.gz",
                bad_dir / "older.pt.trace.json.gz")
    for index, name in enumerate(sorted(p.name for p in bad_dir.glob("*.gz"))):
        at = 2_000_000_000 if name == newest else 1_000_000_000 + index
        os.utime(bad_dir / name, (at, at))
    bad = compare.compare(demo_dir)["bad"]["analysis"]
    assert bad["trace"] == str(bad_dir / newest)
    small_batch = newest.startswith("small_batch")
    assert (bad["gpu"]["utilization_pct"] < 50) == small_batch
    assert [f["id"] for f in bad["findings"]] == (["small_batch"] if small_batch else [])


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
    assert rows["samples/s"].split()[-3:] == ["5.30x", "higher,", "better"]
    assert rows["peak memory MB"].split()[-3:] == ["4.00x", "higher,", "worse"]
    assert "fixed vs bad: 5.30x more samples/s, 4.00x the peak memory" in out
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
    (lambda d: (d / "bad" / "summary.json").write_text("[]"), "summary.json: not a demo summary"),
    (lambda d: (d / "fixed" / "summary.json").write_text('{"a": 1}'),
     "fixed/summary.json: not a demo summary (no samples_per_s)"),
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


def test_a_demo_dir_that_does_not_exist_is_one_line_and_exit_code_2(tmp_path, capsys):
    assert compare.main([str(tmp_path / "nope")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"compare: {tmp_path / 'nope'}: no such directory")


# --- The harness's data wait and profiler overhead (summary.json), and the warning. ------------

def with_timing_fields(synthetic_pairs_out, tmp_path, bad: dict, fixed: dict):
    demo_dir = tmp_path / "small_batch"
    shutil.copytree(synthetic_pairs_out / "small_batch", demo_dir)
    edit_summary(demo_dir / "bad", **bad)
    edit_summary(demo_dir / "fixed", **fixed)
    return demo_dir


def text_rows(out: str) -> dict[str, list[str]]:
    """The table's rows: label -> [bad, fixed, fixed/bad] cells."""
    rows = {}
    for line in out.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().split("  ") if cell.strip()]
        if line.startswith("  ") and len(cells) >= 3:
            rows[cells[0]] = cells[1:]
    return rows


def test_data_wait_and_profiler_overhead_rows_and_warning(synthetic_pairs_out, tmp_path, capsys):
    # bad's step p50 is 1000 * 8 / 1000 = 8 ms (write_demo_run); its profiled steps 8.8 ms.
    demo_dir = with_timing_fields(
        synthetic_pairs_out, tmp_path,
        bad=dict(data_wait_pct=42.5, profiled_step_ms_p50=8.8, profiler_overhead_ratio=1.1),
        fixed=dict(data_wait_pct=3.0, profiler_overhead_ratio=1.6))
    assert compare.main([str(demo_dir)]) == 0
    out = capsys.readouterr().out
    rows = text_rows(out)
    assert rows["data wait %"] == ["42.5", "3.0", "39.5 points less, better"]  # a share: points
    assert rows["profiled/timed step"] == ["1.10", "1.60"]
    warnings = [line.strip() for line in out.splitlines() if line.startswith("  warning: ")]
    assert warnings == ["warning: fixed: profiled steps ran 1.60x the timed step p50 (warn above "
                        "1.2x): the trace exaggerates CPU time; trust samples/s"]

    assert compare.main([str(demo_dir), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["data_wait_pct"] == {"bad": 42.5, "fixed": 3.0}
    assert result["profiler_overhead_ratio"] == {"bad": 1.1, "fixed": 1.6}
    assert len(result["warnings"]) == 1 and result["warnings"][0].startswith("fixed: ")


@pytest.mark.parametrize("fields, overhead, warned", [
    (dict(profiler_overhead_ratio=trace.PROFILER_OVERHEAD_WARN_RATIO), 1.2, False),  # not above
    (dict(profiler_overhead_ratio=1.21), 1.21, True),
    # no ratio in the summary: the two p50s give it (bad's timed p50 is 8 ms)
    (dict(profiled_step_ms_p50=16.0), 2.0, True),
    (dict(), None, False),  # an older summary: n/a, no warning
])
def test_profiler_overhead_ratio_and_its_threshold(synthetic_pairs_out, tmp_path, fields,
                                                   overhead, warned):
    assert trace.PROFILER_OVERHEAD_WARN_RATIO == 1.2
    demo_dir = with_timing_fields(synthetic_pairs_out, tmp_path, bad=fields, fixed={})
    comparison = compare.compare(demo_dir)
    assert comparison["profiler_overhead_ratio"]["bad"] == (
        None if overhead is None else pytest.approx(overhead))
    assert [w.startswith("bad: profiled steps ran") for w in comparison["warnings"]] == (
        [True] if warned else [])
    assert ("warning: bad:" in compare.format_text(comparison)) == warned


H100 = ROOT / "traces" / "reference" / "h100"


def profiled_warning(comparison: dict, variant: str) -> str | None:
    return next((w for w in comparison["warnings"]
                 if w.startswith(f"{variant}: profiled steps ran")), None)


@pytest.mark.skipif(not H100.is_dir(), reason="no committed H100 reference")
def test_the_warning_tells_more_gpu_time_from_the_profiler_s_cost_on_real_traces():
    """padding_waste/fixed's recorded steps ran the bucket mix's longer texts: the GPU alone was
    busy 1.8x the timed p50 a step, which no host-side cost explains, and the warning says so.
    unfused_optimizer's GPU idles most of each step (busy 0.14x its p50) while the profiler's
    cost per operator slows the host: the warning blames the CPU time. A GPU-bound run with no
    such mix (padding_waste/bad, busy 99.7 % of its window) keeps its GPU busy its timed p50."""
    padding = compare.compare(H100 / "padding_waste")
    assert padding["gpu_busy_ratio"]["bad"] == pytest.approx(1.0, abs=0.01)
    busy = padding["gpu_busy_ratio"]["fixed"]
    assert busy > trace.PROFILER_OVERHEAD_WARN_RATIO
    assert profiled_warning(padding, "bad") is None
    assert (f"the GPU alone was busy {busy:.2f}x the timed step p50 a recorded step"
            in profiled_warning(padding, "fixed"))
    optimizer = compare.compare(H100 / "unfused_optimizer")
    for variant in compare.VARIANTS:
        assert optimizer["gpu_busy_ratio"][variant] < 1
        assert profiled_warning(optimizer, variant).endswith(
            "the trace exaggerates CPU time; trust samples/s")


def test_a_cpu_trace_has_no_gpu_busy_ratio():
    cpu_run = compare.compare(ROOT / "traces" / "reference" / "cpu" / "host_roundtrip")
    assert cpu_run["gpu_busy_ratio"] == {"bad": None, "fixed": None}
    assert recorded.gpu_busy_ratio({}, {"gpu": {"utilization_pct": 50.0}, "steps": 3,
                                       "window_ms": 30.0}) is None
    assert recorded.gpu_busy_ratio({"step_ms_p50": 10.0}, {"gpu": {"utilization_pct": 50.0},
                                                           "steps": 3, "window_ms": 30.0}) == 0.5


def test_older_summaries_show_n_a_for_the_new_rows(synthetic_pairs_out, capsys):
    """The synthetic summaries have neither field: the rows stay, as n/a, and JSON says null."""
    assert compare.main([str(synthetic_pairs_out / "small_batch")]) == 0
    out = capsys.readouterr().out
    rows = text_rows(out)
    assert rows["data wait %"] == ["n/a", "n/a"] and rows["profiled/timed step"] == ["n/a", "n/a"]
    assert "warning:" not in out
    assert compare.main([str(synthetic_pairs_out / "small_batch"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["data_wait_pct"] == {"bad": None, "fixed": None}
    assert result["profiler_overhead_ratio"] == {"bad": None, "fixed": None}
    assert result["warnings"] == []


# --- Output into a pipe the reader closed (`| head -1`). ----------------------------------------

def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """python -m <args> with stdout a pipe whose reader is gone before it starts, so its first
    write fails with EPIPE every time. (`| head -1` fails only when head exits before the
    writer's last write: output under a pipe's 64 KiB buffer usually gets through.)"""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=CLI_TIMEOUT_S)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("command", [
    ("common.compare", "small_batch"), ("common.compare", "small_batch", "--json"),
    ("common.analyze", "small_batch/bad"), ("common.analyze", "small_batch/bad", "--json"),
])
def test_a_closed_pipe_ends_quietly(synthetic_pairs_out, command):
    module, target, *flags = command
    result = run_into_closed_pipe(module, str(synthetic_pairs_out / target), *flags)
    assert result.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit
    assert result.returncode == 1  # what Python's docs' recipe (and Python itself) exit with


TF32_CONV = "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32"


def tf32_analysis(tmp_path) -> dict:
    """One step of 1000 µs: a TF32 convolution of 300 µs, an FP32 sgemm of 100 and an
    elementwise kernel of 100: TF32 is 300 / 500 = 60 % of the kernel time."""
    t = KinetoTrace()
    t.gpu()
    t.step(1, 1_000_000.0, 1000.0)
    for at, kernel_us, name in ((10, 300, TF32_CONV), (20, 100, "ampere_sgemm_128x64_nn"),
                                (30, 100, ELEMENTWISE)):
        t.launch(1_000_000.0 + at, 5, 1_000_000.0 + 100 * at, kernel_us, name=name)
    return analyze.analyze_trace(t.write(tmp_path / "t.json"))


@pytest.mark.parametrize("config, label", [
    ({"tf32_matmul": False, "tf32_cudnn": True}, "FP32, TF32 convolutions"),  # torch's defaults
    ({"tf32_matmul": True, "tf32_cudnn": False}, "FP32, TF32 matmuls"),
    ({"tf32_matmul": True, "tf32_cudnn": True}, "FP32, TF32 matmuls and convolutions"),
    ({}, "FP32, TF32 kernels"),  # a summary from before the harness recorded the settings
    ({"autocast_dtype": "bfloat16", "tf32_cudnn": True}, "BF16 autocast"),
    ({"dtype": "bfloat16", "tf32_cudnn": True}, "BF16 weights"),  # a model cast to serve it
])
def test_precision_says_tf32_where_the_trace_ran_it(tmp_path, config, label):
    analysis = tf32_analysis(tmp_path)
    assert analysis["gpu"]["tf32_pct"] == pytest.approx(60.0)
    assert compare.precision({"config": config}, analysis) == label


def test_precision_says_fp32_where_no_tf32_kernel_ran(tmp_path):
    """TF32 allowed for convolutions (torch's default) but a model without them: plain FP32.
    Without the trace, the settings alone."""
    analysis = json.loads(json.dumps(tf32_analysis(tmp_path)))
    analysis["gpu"]["tf32_pct"] = 0.0
    allowed = {"config": {"tf32_matmul": False, "tf32_cudnn": True}}
    assert compare.precision(allowed, analysis) == "FP32"
    assert compare.precision(allowed, {"gpu": None}) == "FP32"  # a CPU run
    assert compare.precision(allowed) == "FP32"
    assert compare.precision({"config": {"tf32_matmul": True}}) == "FP32, TF32 matmuls"
    assert compare.precision({"config": {"dtype": "float32"}}, analysis) == "FP32"  # a CPU's


@pytest.mark.parametrize("fixed_created, said", [
    ("2026-11-22T21:02:11+00:00", "run 2026-11-22T20:35:59+00:00"),  # one run: the first's
    ("2026-11-27T04:12:40+00:00",
     "runs 2026-11-22T20:35:59+00:00 (bad) and 2026-11-27T04:12:40+00:00 (fixed)"),
])
def test_conditions_name_each_run_date_where_the_variants_ran_on_different_days(fixed_created,
                                                                                  said):
    summary = {"device": "cuda", "device_name": "GPU", "torch_version": "2.11.0", "preset": "cuda",
               "batch_size": 256, "steps": 60, "created_utc": "2026-11-22T20:35:59+00:00"}
    comparison = {"variants": ["bad", "fixed"], "bad": {"summary": summary},
                  "fixed": {"summary": dict(summary, created_utc=fixed_created)}}
    assert compare.conditions(comparison).endswith(f"60 timed steps, {said}")
