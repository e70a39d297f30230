"""The three ways to Python frames: --with-stack on every demo (the trace's python_function events
and the analyzer's hot frames), --cprofile (the timed phase's .prof and its top 10), and py-spy
on host_roundtrip/bad (a flame graph of the script, and the loop named in a process held in it)."""
from __future__ import annotations

import ast
import os
import pstats
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from common import analyze, frames
from tests.conftest import ROOT, background_job, background_result, read_summary, run_demo

# --with-stack is the harness's: one bad run per loop that records it, not every pair's (a run
# each costs 3-17 s of a suite at its 10-minute bound). train (a DataLoader), train_on_device,
# measure with the script's own step, measure across ranks, generate, serve_texts (its threads).
DEMOS = ("dataloader_workers", "small_batch", "memory_leak", "ddp_no_sync", "llm_decode",
         "tokenizer_bound")
# Those runs one at a time: they run in the background beside the other tests (conftest's
# background jobs), on the one core the smoke run freed; two at a time, with the plugin loading,
# made the tests beside them 2 to 4x slower (tests/test_report.py: 103 s against 25). What the
# test reads of each (the frames in its trace) does not depend on how fast it ran.
WITH_STACK_JOBS = 1
PY_SPY_TIMEOUT_S = 300  # a smoke run of host_roundtrip/bad takes seconds; this stops a hang
PY_SPY_RATE_HZ = 200  # the walkthrough's rate
HOST_ROUNDTRIP_BAD = ROOT / "demos" / "host_roundtrip" / "bad.py"
LOOP_FUNCTION = "per_sample_weights"  # bad's Python loop over .tolist() values, a sample a turn
# A process that runs bad.py's per_sample_weights on "losses" whose values come from a generator
# that says so and then waits for a line on stdin: the process is held inside the loop, at its
# first value, for as long as the test wants (no timing involved).
HELD_IN_THE_LOOP = f"""
import importlib.util, sys
import torch
spec = importlib.util.spec_from_file_location("bad", {str(HOST_ROUNDTRIP_BAD)!r})
bad = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bad)  # defines its functions; main() runs only as __main__
class Held:
    def tolist(self):
        def values():
            print("in the loop", flush=True)
            sys.stdin.readline()
            yield 1.0
        return values()
bad.{LOOP_FUNCTION}(Held(), torch.ones(1))
"""


def py_spy_or_skip() -> str:
    py_spy = shutil.which("py-spy") or str(ROOT / ".venv" / "bin" / "py-spy")
    if not shutil.which(py_spy):
        pytest.skip("py-spy is not installed (pip install py-spy: the [test] extra has it)")
    if not HOST_ROUNDTRIP_BAD.is_file():
        pytest.skip("demos/host_roundtrip/ is missing")
    return py_spy


def skip_if_ptrace_refused(result: subprocess.CompletedProcess) -> None:
    """py-spy reads another process's memory through ptrace: root may (here and in CI, which
    runs as root), so there any failure is a failure; another user may be refused (ptrace_scope,
    a container's seccomp profile), and the test then says so."""
    if (result.returncode != 0 and os.geteuid() != 0
            and ("ptrace" in result.stderr.lower() or "permission" in result.stderr.lower())):
        pytest.skip(f"py-spy may not trace processes here: {result.stderr.strip()[-200:]}")


def function_lines(path, name: str) -> range:
    """The lines of the top-level function `name` in the Python file at `path`."""
    tree = ast.parse(path.read_text())
    [function] = [node for node in tree.body
                  if isinstance(node, ast.FunctionDef) and node.name == name]
    return range(function.lineno, function.end_lineno + 1)


def run_with_stack(out: Path) -> dict:
    """Each of DEMOS' bad.py at smoke sizes with --with-stack, under `out`: {demo: (the finished
    process, its output root)}."""
    def run(demo: str) -> subprocess.CompletedProcess:
        return run_demo(demo, "bad", "--smoke", "--device", "cpu", "--with-stack",
                        "--out", str(out / demo))

    with ThreadPoolExecutor(max_workers=WITH_STACK_JOBS) as pool:
        return {demo: (result, out / demo) for demo, result in zip(DEMOS, pool.map(run, DEMOS))}


background_job("with_stack_runs", run_with_stack)  # runs once the smoke run has ended


@pytest.fixture(scope="module")
def with_stack_runs(tmp_path_factory) -> dict:
    return background_result("with_stack_runs", tmp_path_factory)


@pytest.mark.parametrize("demo", DEMOS)
def test_with_stack_records_the_script_s_own_frames(with_stack_runs, demo):
    result, tmp_path = with_stack_runs[demo]
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
            if path.endswith("bad.py") or path.startswith("common/")]
    theirs = [label for label, path in files.items() if path.startswith("torch/")]
    assert ours and all(user_of[label] for label in ours), sorted(times)[:20]
    assert theirs and not any(user_of[label] for label in theirs)
    # Code torch.compile generated (recompiles' graphs) is no line of the user's either.
    generated = [label for label, path in files.items() if "/torchinductor_" in path]
    assert not any(user_of[label] for label in generated)


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


def test_py_spy_records_a_flame_graph_of_the_script(tmp_path):
    """py-spy samples the running script with no change to it, as the walkthrough runs it (at
    smoke sizes: the check below needs no more). Every sample of the script's main thread, from
    its imports to its exit, has bad.py's module frame at the bottom: the flame graph names the
    script, however few samples land in any one function."""
    py_spy = py_spy_or_skip()
    svg = tmp_path / "flame.svg"
    result = subprocess.run(
        [py_spy, "record", "--rate", str(PY_SPY_RATE_HZ), "--format", "flamegraph", "-o",
         str(svg), "--", sys.executable, str(HOST_ROUNDTRIP_BAD), "--smoke", "--device", "cpu",
         "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": str(ROOT)})  # this tree's common/, whatever is installed
    skip_if_ptrace_refused(result)
    assert result.returncode == 0, result.stderr[-2000:]
    text = svg.read_text()
    assert text.startswith("<?xml") and "bad.py" in text


def test_py_spy_names_the_loop_it_finds_the_process_in(tmp_path):
    """py-spy dump of a process held inside bad.py's loop (HELD_IN_THE_LOOP) names the function
    and a line of it: what each of a flame graph's samples in the loop says, without relying
    on a sample landing there."""
    py_spy = py_spy_or_skip()
    held = subprocess.Popen([sys.executable, "-c", HELD_IN_THE_LOOP], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first_line, result = held.stdout.readline(), None
        if first_line == "in the loop\n":
            result = subprocess.run([py_spy, "dump", "--pid", str(held.pid)],
                                    capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S)
        # A line lets it finish the loop and exit.
        _, stderr = held.communicate(input="\n", timeout=PY_SPY_TIMEOUT_S)
    finally:
        if held.poll() is None:  # only if something above failed: it is ours to stop
            held.kill()
            held.wait()
    assert first_line == "in the loop\n" and held.returncode == 0, stderr[-2000:]
    skip_if_ptrace_refused(result)
    assert result.returncode == 0, result.stderr[-2000:]
    # A stack line reads "    per_sample_weights (bad.py:28)": the function, its file, the line.
    lines = re.findall(rf"^\s+{LOOP_FUNCTION} \((\S+):(\d+)\)$", result.stdout, re.MULTILINE)
    assert len(lines) == 1, result.stdout
    [(file, line)] = lines
    assert file.endswith("bad.py") and int(line) in function_lines(HOST_ROUNDTRIP_BAD,
                                                                   LOOP_FUNCTION), result.stdout


def test_the_loop_s_frames_are_in_the_analyzer_s_table(tmp_path, monkeypatch):
    """At the CPU preset (few steps), bad --with-stack: the analyzer's frame table (the hot
    frames are its top HOT_FRAMES_SHOWN by self time) holds the function with the Python loop
    over .tolist() values, in demos/host_roundtrip/bad.py, as the user's, called once a step, and
    the loop's math.exp once per sample: counts the script fixes, where self times and the rank
    among the hot frames are the timing of the moment. torch records the script as "bad.py"
    (its folder is sys.path[0]); analyzed from the project's root, the one bad.py of the
    thirteen that agrees with the trace is named by its path, and from elsewhere "bad.py"."""
    result = run_demo("host_roundtrip", "bad", "--device", "cpu", "--steps", "5", "--with-stack",
                      "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = tmp_path / "host_roundtrip" / "bad"
    monkeypatch.chdir(ROOT)
    detail = analyze.analyze(run_dir)
    table = frames.frame_times(detail.columns, detail.host_window, detail.steps.size)
    loop = [label for label in table.times if label.endswith(f" {LOOP_FUNCTION}")]
    assert len(loop) == 1, sorted(table.times)
    label = loop[0]
    lines = function_lines(HOST_ROUNDTRIP_BAD, LOOP_FUNCTION)
    assert label == f"demos/host_roundtrip/bad.py:{lines[0]} {LOOP_FUNCTION}" and table.user[label]
    self_ms, calls = table.times[label]
    assert calls == 1.0 and self_ms > 0  # one call a step, with time of its own (the loop)
    called_at = "<built-in function exp> called at demos/host_roundtrip/bad.py"
    exp = [name for name in table.times if name.rsplit(":", 1)[0] == called_at
           and int(name.rsplit(":", 1)[1]) in lines]
    assert len(exp) == 1, sorted(table.times)
    assert table.times[exp[0]][1] == read_summary(tmp_path, "host_roundtrip", "bad")["batch_size"]
    # The hot frames are the table's top HOT_FRAMES_SHOWN by self time, largest first.
    hot = detail.result["python"]["hot_frames"]
    ranked = sorted(table.times, key=lambda name: (-table.times[name][0], name))
    assert [frame["frame"] for frame in hot] == ranked[:frames.HOT_FRAMES_SHOWN]
    # From a folder holding no bad.py: as torch recorded it.
    monkeypatch.chdir(tmp_path)
    elsewhere = frames.frame_times(detail.columns, detail.host_window, detail.steps.size)
    assert f"bad.py:{lines[0]} {LOOP_FUNCTION}" in elsewhere.times
