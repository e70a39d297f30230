"""The three ways to Python frames: --with-stack on every demo (the trace's python_function events
and the analyzer's hot frames), --cprofile (the timed phase's .prof and its top 10), and py-spy
on host_roundtrip/bad (a flame graph that names the hot function)."""
from __future__ import annotations

import pstats
import shutil
import subprocess
import sys

import pytest

from common import analyze, frames
from tests.conftest import ROOT, read_summary, run_demo

DEMOS = sorted(d.name for d in (ROOT / "demos").iterdir() if (d / "bad.py").is_file())
PY_SPY_TIMEOUT_S = 300  # a CPU run of host_roundtrip/bad takes seconds; this stops a hang
# The CPU preset's 1,000 timed steps spend about 0.3 ms each in the loop (its walkthrough): some
# 0.3 s of the run in per_sample_weights, about 70 samples at 200 Hz (400 steps gave 27 here);
# 30 steps gave some 4 and once none. --nonblocking: py-spy reads the process without stopping
# it (stopping it at 500 Hz made a 5 s run take 39 s).
PY_SPY_RATE_HZ = 200


@pytest.mark.parametrize("demo", DEMOS)
def test_with_stack_records_the_script_s_own_frames(tmp_path, demo):
    result = run_demo(demo, "bad", "--smoke", "--device", "cpu", "--with-stack",
                      "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert read_summary(tmp_path, demo, "bad")["config"]["profiler_with_stack"] is True
    detail = analyze.analyze(tmp_path / demo / "bad")
    python = detail.result["python"]
    assert python is not None and python["hot_frames"], "no Python frames in the trace"
    table = frames.frame_times(detail.columns, detail.host_window, detail.steps.size)
    times, user_of = table.times, table.user
    # The project's own code (the script's step, or the harness's and models' that it calls)
    # is there and is the user's; torch's frames are not.
    files = {label: label.split(":")[0] for label in times if ":" in label}
    ours = [label for label, path in files.items()
            if path.endswith("bad.py") or "common/" in path]
    theirs = [label for label, path in files.items() if path.startswith("torch/")]
    assert ours and all(user_of[label] for label in ours), sorted(times)[:20]
    assert theirs and not any(user_of[label] for label in theirs)


def test_cprofile_writes_the_timed_phase_and_a_rerun_removes_it(tmp_path):
    result = run_demo("item_sync", "bad", "--smoke", "--device", "cpu", "--cprofile",
                      "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    prof = tmp_path / "item_sync" / "bad" / "cprofile.prof"
    stats = pstats.Stats(str(prof))
    # The timed phase's steps ran under it: the script's step function, once per timed step.
    summary = read_summary(tmp_path, "item_sync", "bad")
    step_calls = [calls for (path, _, function), (_, calls, *_rest) in stats.stats.items()
                  if path.endswith("bad.py") and function == "step"]
    assert step_calls == [summary["steps"]]
    assert "Ordered by: cumulative time" in result.stdout
    assert any("cProfile" in note for note in summary["notes"])
    rerun = run_demo("item_sync", "bad", "--smoke", "--device", "cpu", "--out", str(tmp_path))
    assert rerun.returncode == 0 and not prof.exists()  # nothing stale from the earlier run


def test_py_spy_names_the_hot_loop(tmp_path):
    """py-spy samples the running script with no change to it (it reads the process's memory
    through ptrace: root here and in CI; elsewhere it may be refused, and the test says so)."""
    py_spy = shutil.which("py-spy") or str(ROOT / ".venv" / "bin" / "py-spy")
    if not shutil.which(py_spy):
        pytest.skip("py-spy is not installed (pip install py-spy: the [test] extra has it)")
    if not (ROOT / "demos" / "host_roundtrip" / "bad.py").is_file():
        pytest.skip("demos/host_roundtrip/ is missing")
    svg = tmp_path / "flame.svg"
    result = subprocess.run(
        [py_spy, "record", "--nonblocking", "--rate", str(PY_SPY_RATE_HZ), "--format",
         "flamegraph", "-o", str(svg), "--", sys.executable,
         str(ROOT / "demos" / "host_roundtrip" / "bad.py"), "--device", "cpu",
         "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S)
    if result.returncode != 0 and ("ptrace" in result.stderr.lower()
                                   or "permission" in result.stderr.lower()):
        pytest.skip(f"py-spy may not trace processes here: {result.stderr.strip()[-200:]}")
    assert result.returncode == 0, result.stderr[-2000:]
    text = svg.read_text()
    assert "per_sample_weights" in text and "bad.py" in text


def test_hot_frames_name_the_loop_of_host_roundtrip(tmp_path):
    """At the CPU preset (few steps), the analyzer's hot frames on bad --with-stack name the
    function holding the Python loop over .tolist() values, in bad.py, as the user's."""
    if not (ROOT / "demos" / "host_roundtrip" / "bad.py").is_file():
        pytest.skip("demos/host_roundtrip/ is missing")
    result = run_demo("host_roundtrip", "bad", "--device", "cpu", "--steps", "5", "--with-stack",
                      "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    hot = analyze.analyze_trace(tmp_path / "host_roundtrip" / "bad")["python"]["hot_frames"]
    loop = [frame for frame in hot if frame["frame"].endswith(" per_sample_weights")]
    assert loop and loop[0]["user"] and loop[0]["frame"].split(":")[0].endswith("bad.py"), hot
