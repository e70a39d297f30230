"""The way in for a user's own code: the README's "Your own script" snippet as it is printed
(harness.profile_loop), and compare BEFORE AFTER on two bare traces, hand-built with worked-out
answers and real ones from other people's GPUs."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from common import analyze, compare, harness
from common.runs import PROFILE_ACTIVE_STEPS
from common.idle_causes import compiling_operators
from common.trace_steps import BREAKDOWN_ROLES, time_by_name
from tests.conftest import ROOT, SHARED_TRACES
from tests.kineto_builder import KinetoTrace, simulate_training

SNIPPET_TIMEOUT_S = 300  # the snippet runs in seconds; this only stops a hang


def readme_snippet() -> str:
    """The first python code block under the README's "## Your own script" heading."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Your own script\n"):]
    section = section[:section.find("\n## ", 1)]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def run_snippet(code: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=SNIPPET_TIMEOUT_S)


@pytest.fixture(scope="module")
def own_runs(tmp_path_factory):
    """The snippet as printed (variant "before"), then again with the change the README names
    (AdamW(fused=True)) as "after", from an empty folder: traces/ lands there."""
    cwd = tmp_path_factory.mktemp("own")
    code = readme_snippet()
    before = run_snippet(code, cwd)
    assert before.returncode == 0, before.stderr
    after_code = code.replace('variant="before"', 'variant="after"').replace(
        "AdamW(model.parameters())", "AdamW(model.parameters(), fused=True)")
    assert after_code.count('variant="after"') == 1 and "fused=True" in after_code
    after = run_snippet(after_code, cwd)
    assert after.returncode == 0, after.stderr
    return cwd / "traces" / "my_model", before


def test_the_readme_snippet_writes_a_run_like_a_demo(own_runs):
    runs, printed = own_runs
    assert "[my_model/before] timed: 20 steps without the profiler" in printed.stdout
    for variant in ("before", "after"):
        run_dir = runs / variant
        names = sorted(p.name for p in run_dir.iterdir())
        assert len([n for n in names if n.endswith(".pt.trace.json.gz")]) == 1, names
        assert "summary.json" in names and "key_averages.txt" in names
        summary = json.loads((run_dir / "summary.json").read_text())
        assert (summary["demo"], summary["variant"], summary["preset"]) == (
            "my_model", variant, "own")
        assert (summary["batch_size"], summary["steps"], summary["warmup_steps"]) == (256, 20, 5)
        assert summary["device"] == "cpu" and summary["samples_per_s"] > 0
        # samples/s is the timed phase's: 20 steps of 256 over its wall clock
        assert summary["samples_per_s"] == pytest.approx(20 * 256 / summary["timed_wall_s"])
        assert summary["config"]["profiler_record_shapes"] is True


def printed(value: float, spec: str = ".1f") -> str:
    """A number as compare prints it (its samples/s row: .1f), as a regular expression."""
    return re.escape(format(value, spec))


def test_compare_reads_the_two_own_runs(own_runs, capsys):
    runs, _ = own_runs
    assert compare.main([str(runs / "before"), str(runs / "after")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("before vs after: cpu (")  # the summaries' conditions
    # Each run's samples/s from its own summary, before's first: which way it went between the
    # two real runs is the timing of the moment (test_compare_says_which_way_samples_per_s_went
    # checks the words for a known direction).
    before, after = (json.loads((runs / v / "summary.json").read_text())["samples_per_s"]
                     for v in ("before", "after"))
    assert re.search(rf"^  samples/s +{printed(before)} +{printed(after)} ", out, re.MULTILINE), out
    assert re.search(rf"^  after vs before: {printed(after / before, '.2f')}x ", out,
                     re.MULTILINE), out
    # The fused optimizer is one operator a step where there was none, in the operator tables
    # what_changed ranks (which 8 rows it shows depends on the timing of the moment).
    for label, calls in (("before", 0.0), ("after", 1.0)):
        detail = analyze.analyze(runs / label)
        operators = time_by_name(detail.columns, detail.window, detail.steps.size,
                                 host_window=detail.host_window,
                                 compiling=compiling_operators(detail.columns)).operators
        assert operators.get("aten::_fused_adamw_", (0.0, 0.0))[1] == pytest.approx(calls)


@pytest.mark.parametrize("factor, row_words, headline_words", [
    (2.0, "2.00x higher, better", "2.00x more samples/s"),
    (0.5, "2.00x lower, worse", "0.50x the samples/s (slower)"),
], ids=["faster", "slower"])
def test_compare_says_which_way_samples_per_s_went(own_runs, tmp_path, capsys, factor,
                                                   row_words, headline_words):
    """The two real runs, copied, with after's samples/s set to `factor` times before's (a
    power of two: the ratio is exact), so the direction is known: higher samples/s is better."""
    runs, _ = own_runs
    for variant in ("before", "after"):
        shutil.copytree(runs / variant, tmp_path / variant)
    before = json.loads((tmp_path / "before" / "summary.json").read_text())["samples_per_s"]
    summary_path = tmp_path / "after" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["samples_per_s"] = factor * before
    summary_path.write_text(json.dumps(summary))
    assert compare.main([str(tmp_path / "before"), str(tmp_path / "after")]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^  samples/s +{printed(before)} +{printed(factor * before)} +"
                     rf"{re.escape(row_words)}$", out, re.MULTILINE), out
    assert re.search(rf"^  after vs before: {re.escape(headline_words)}(,|$)", out,
                     re.MULTILINE), out


def test_a_rerun_leaves_one_trace(own_runs, tmp_path):
    """profile_loop empties its run folder first, as the demos do: TensorBoard reads a folder
    once and would show a stale trace as a second worker. The rerun goes to a folder of its own
    holding a copy of the fixture's "before" run (the other tests read the fixture's). It records
    5 steps, not the default 3: the trace holds as many."""
    runs, _ = own_runs
    stale = tmp_path / "traces" / "my_model" / "before"
    shutil.copytree(runs / "before", stale)
    [old_trace] = [p.name for p in stale.glob("*.pt.trace.json.gz")]
    code = readme_snippet().replace(
        "harness.profile_loop(step,",
        "harness.profile_loop(step, steps=2, warmup_steps=1, recorded_steps=5,")
    assert code.count("steps=2, warmup_steps=1, recorded_steps=5,") == 1
    again = run_snippet(code, tmp_path)
    assert again.returncode == 0, again.stderr
    traces = [p.name for p in stale.glob("*.pt.trace.json.gz")]
    assert len(traces) == 1 and traces != [old_trace], (traces, old_trace)
    assert json.loads((stale / "summary.json").read_text())["steps"] == 2
    assert analyze.analyze_trace(runs / "before")["steps"] == PROFILE_ACTIVE_STEPS == 3
    assert analyze.analyze_trace(stale)["steps"] == 5


@pytest.mark.parametrize("arguments, message", [
    (dict(name="../up"), "must be a folder name"),
    (dict(variant="a/b"), "must be a folder name"),
    (dict(batch_size=0), "batch_size=0 must be a whole number >= 1"),
    (dict(steps=2.5), "steps=2.5 must be a whole number >= 1"),
    (dict(recorded_steps=0), "recorded_steps=0 must be a whole number >= 1"),
])
def test_profile_loop_refuses_bad_arguments_before_running(tmp_path, arguments, message):
    calls = []
    given = dict(name="mine", variant="before", batch_size=8, out=tmp_path) | arguments
    with pytest.raises(ValueError, match=re.escape(message)):
        harness.profile_loop(lambda: calls.append(1), **given)
    assert calls == [] and not any(tmp_path.iterdir())


# --- compare BEFORE AFTER on bare traces (no summary.json) ------------------------------------
# Before: 3 DataLoader-bound steps, 20 kernels of 100 µs each (2.0 ms of kernels a step). After:
# the same loop with kernels of 50 µs (AMP's faster math: 1.0 ms a step) and a DataLoader that
# happened to take longer (5 ms against 3 ms): the step is slower, the kernels are 2x faster.
# Read by the step time alone, after is "worse"; the parts of the step say what changed.

def loader_bound(kernel_us: float, dataloader_us: float) -> KinetoTrace:
    built = KinetoTrace()
    built.gpu()
    return simulate_training(built, steps=3, kernels_per_step=20, kernel_us=kernel_us,
                             dataloader_us=dataloader_us, backward=True)


@pytest.fixture
def bare_pair(tmp_path):
    return (loader_bound(100.0, 3000.0).write(tmp_path / "fp32.pt.trace.json"),
            loader_bound(50.0, 5000.0).write(tmp_path / "amp.pt.trace.json.gz", compress=True))


def test_bare_traces_compare_by_the_parts_of_the_step(bare_pair, capsys):
    comparison = compare.compare_runs(*bare_pair)
    assert comparison["variants"] == ("before", "after")
    assert comparison["speedup"] is None and compare.headline(comparison) == ""  # no summaries
    parts = comparison["step_parts_ms"]
    assert parts["before"]["kernel"] == pytest.approx(2.0)
    assert parts["after"]["kernel"] == pytest.approx(1.0)
    for label in ("before", "after"):  # the breakdown is a partition of the mean step
        analysis = comparison[label]["analysis"]
        assert sum(parts[label][role] for role in BREAKDOWN_ROLES) == pytest.approx(
            analysis["step_ms"]["mean"])
        assert [f["id"] for f in analysis["findings"]] == ["dataloader"]
    assert comparison["still_bounds"].startswith("the GPU waiting for the DataLoader (")
    assert comparison["still_bounds"].endswith("; verdicts: dataloader")
    few = [w for w in comparison["warnings"] if "fewer than 5" in w]
    assert [w.split(":")[0] for w in few] == ["before", "after"]

    assert compare.main([str(p) for p in bare_pair]) == 0
    out = capsys.readouterr().out
    rows = {line.split("  ")[1].strip(): line for line in out.splitlines()
            if line.startswith("  ") and "  " in line[2:]}
    assert re.search(r"^  kernel +2\.00 +1\.00 +-1\.00 ms$", out, re.MULTILINE)  # the parts
    assert rows["trace step p50 ms"].endswith("higher, worse")
    assert "samples/s" not in rows and "data wait %" not in rows  # no timed phase to show
    assert "  still bounds the step (after): the GPU waiting for the DataLoader" in out


def test_a_wide_spread_is_warned(tmp_path):
    """A step 3x the others (p95 over 1.5x the p50) gets the spread warning; even steps do not."""
    built = KinetoTrace()
    built.gpu()
    simulate_training(built, steps=6, kernels_per_step=10, kernel_us=100.0)
    even = built.write(tmp_path / "even.json")
    built.step(7, 1e7, 3 * 1e3)  # a 7th step of 3 ms, far from the 1 ms ones
    built.launch(1e7 + 1, 5, 1e7 + 10, 2900)
    uneven = built.write(tmp_path / "uneven.json")
    warnings = compare.compare_runs(even, uneven)["warnings"]
    assert [w.split(":")[0] for w in warnings if "steps vary" in w] == ["after"]
    assert not [w for w in warnings if "fewer than" in w or "different devices" in w]


@pytest.mark.parametrize("args, message", [
    (["a", "b", "c"], "one DEMO_DIR or two runs (BEFORE AFTER), not 3 paths"),
    (["nope.json", "nope2.json"], "nope.json: no such file or directory"),
])
def test_compare_bad_paths_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    code = None
    try:
        code = compare.main(args)
    except SystemExit as stopped:
        code = stopped.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err


def test_one_trace_alone_says_to_pass_two(bare_pair, capsys):
    assert compare.main([str(bare_pair[0])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "python -m common.compare BEFORE AFTER" in err


def test_real_traces_from_two_vendors(tmp_path):
    """The same model's inference on an H100 and an MI300X (real traces, one step each): compared
    with a warning that the hardware differs, never refused; each side's parts add up to its
    step; the kernels that changed are the vendors' own (cuBLAS's sm90 GEMMs, hipBLASLt's Cijk)."""
    pair = [SHARED_TRACES / f"{gpu}_qwen05b_hf_inference_1step.json.gz"
            for gpu in ("h100", "mi300x")]
    if not all(path.is_file() for path in pair):
        pytest.skip(f"the shared real traces are not beside the project ({SHARED_TRACES})")
    comparison = compare.compare_runs(*pair)
    assert any("different devices (cuda NVIDIA H100 80GB HBM3 vs rocm AMD Instinct MI300X VF)"
               in w for w in comparison["warnings"])
    for label in ("before", "after"):
        analysis = comparison[label]["analysis"]
        assert sum(comparison["step_parts_ms"][label][r] for r in BREAKDOWN_ROLES) == (
            pytest.approx(analysis["step_ms"]["mean"]))
    kernels = [row["name"] for row in comparison["what_changed"]["kernels"]]
    assert any(name.startswith("sm90_") for name in kernels)
    assert any(name.startswith("Cijk_") for name in kernels)
