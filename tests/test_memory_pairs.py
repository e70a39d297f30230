"""The memory pairs' scripts and the harness's memory options, from the session's smoke run of
every demo (the demos_smoke fixture) and from setup() alone: memory_leak logs the same numbers in
both variants while bad's memory climbs and fixed's stays flat; fragmentation runs on a CPU and
says it cannot show there; --memory-snapshot refuses a CPU in one line. What needs a GPU (the
snapshot file, reserved memory) is in tests/test_cuda.py."""
from __future__ import annotations

import pytest

from common import analyze, harness, presets, runs, trace, verdicts
from tests.conftest import read_summary, run_demo

LEAK_SIZES = presets.PRESETS["memory_leak"]["smoke"].sizes
LEAK_BATCH = presets.PRESETS["memory_leak"]["smoke"].batch_size
# The logits bad.py keeps each step: [batch, seq_len, vocab] in FP32.
LOGITS_MB = LEAK_BATCH * LEAK_SIZES["seq_len"] * LEAK_SIZES["vocab"] * 4 / trace.BYTES_PER_MB
# Flat: growth under the verdict's bound, a share of the steps' peak a step.
FLAT_GROWTH_OF_PEAK = verdicts.MEMORY_GROWTH_MIN_PCT / 100
# bad's growth is its logits a step (the graph's nodes are not tensors); 1 % below allows for the
# allocator rounding nothing away, and no more.
KEPT_LOGITS_MIN = 0.99
# A line: the leak adds the same bytes every step.
LINE_R2_MIN = 0.99
# The same math in the same order in both variants: equal up to float32 printing.
SAME_NUMBER_REL = 1e-6


@pytest.fixture(scope="module")
def leak(demos_smoke) -> dict[str, dict]:
    """{variant: (summary, the analyzer's result)} for the memory_leak smoke runs."""
    found = {}
    for variant in ("bad", "fixed"):
        assert f"memory_leak/{variant}" in demos_smoke.ran
        found[variant] = (read_summary(demos_smoke.out, "memory_leak", variant),
                          analyze.analyze_trace(demos_smoke.out / "memory_leak" / variant))
    return found


def test_both_variants_log_the_same_loss_and_accuracy(leak):
    bad, fixed = leak["bad"][0]["extra"]["logged"], leak["fixed"][0]["extra"]["logged"]
    # the epoch is every step the run takes: warm-up, timed and profiled
    run = harness.setup("memory_leak", "bad", ["--device", "cpu", "--smoke"])
    assert bad["steps"] == fixed["steps"] == run.total_steps
    assert bad["mean_loss"] == pytest.approx(fixed["mean_loss"], rel=SAME_NUMBER_REL)
    assert bad["accuracy"] == pytest.approx(fixed["accuracy"], rel=SAME_NUMBER_REL)


def test_the_profiler_records_the_presets_steps(leak):
    recorded = presets.PRESETS["memory_leak"]["smoke"].recorded_steps
    assert recorded > runs.PROFILE_ACTIVE_STEPS  # a trend needs more than the default three
    for variant, (_, result) in leak.items():
        assert result["steps"] == recorded, variant


def test_bad_keeps_its_logits_every_step_and_fixed_stays_flat(leak):
    bad, fixed = leak["bad"][1]["memory"], leak["fixed"][1]["memory"]
    # bad keeps at least the logits a step (their graph's nodes add a little more)
    assert bad["growth_mb_per_step"] >= LOGITS_MB * KEPT_LOGITS_MIN
    assert bad["growth_fit_r2"] >= LINE_R2_MIN
    assert abs(fixed["growth_mb_per_step"]) < FLAT_GROWTH_OF_PEAK * fixed["steps_peak_allocated_mb"]
    findings = {variant: {f["id"] for f in result["findings"]} for variant, (_, result) in leak.items()}
    assert "memory_growth" in findings["bad"] and "memory_growth" not in findings["fixed"]


def test_fragmentation_runs_on_a_cpu_and_says_it_cannot_show_there(demos_smoke):
    for variant in ("bad", "fixed"):
        assert f"fragmentation/{variant}" in demos_smoke.ran
    bad, fixed = (read_summary(demos_smoke.out, "fragmentation", v) for v in ("bad", "fixed"))
    assert harness.NO_CACHING_ALLOCATOR in bad["notes"] and harness.NO_CACHING_ALLOCATOR in fixed["notes"]
    assert "expandable_segments:True" in fixed["config"]["alloc_conf"]
    assert bad["config"]["alloc_conf"] is None  # bad clears what the shell may have set
    assert bad["peak_reserved_mb"] is None and bad["memory_by_step"] is None  # CUDA's only


def test_memory_snapshot_on_a_cpu_is_one_line_and_exit_2():
    result = run_demo("item_sync", "bad", "--device", "cpu", "--memory-snapshot")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "need a CUDA GPU" in result.stderr


def test_a_rerun_leaves_no_snapshot_of_the_last_run(tmp_path):
    for name in (runs.MEMORY_SNAPSHOT_FILE, "memory_snapshot.rank1.pickle", "mine.pickle"):
        (tmp_path / name).write_text("x")
    runs.clear_run_dir(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.pickle"]


def test_memory_growth_fires_on_no_other_smoke_run(demos_smoke):
    """The smoke run's report (run_demos.sh writes it from every pair's analysis): memory_growth
    in memory_leak's section, on bad only, and in no other pair's."""
    report = (demos_smoke.out / "REPORT.md").read_text()
    # Where the rule could fire at all: a growth fit (5 or more recorded steps) in memory_leak's
    # runs; the other pairs record 3 steps, too few for a fit, and their silence is by that rule.
    assert "no growth fit" not in sections_of(report)["memory_leak"]
    sections = sections_of(report)
    assert {name.split("/")[0] for name in demos_smoke.ran} <= set(sections)
    for demo, text in sections.items():
        fired = {line.split(":", 1)[0] for line in text.splitlines()
                 if "**memory_growth**" in line}
        assert fired == ({"- bad"} if demo == "memory_leak" else set()), demo


def sections_of(report: str) -> dict[str, str]:
    """REPORT.md's sections by pair name (its "## <pair>" headings)."""
    return {part.split("\n", 1)[0]: part for part in report.split("\n## ")[1:]}
