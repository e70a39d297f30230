"""The demo scripts, run end to end in smoke mode on the CPU."""
from __future__ import annotations

import gzip
import json
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from common import trace
from tests.conftest import (DEMO_RUN_TIMEOUT_S, ROOT, assert_timing_is_consistent, demo_env,
                            demo_forks, read_summary, run_demo, run_python, same_env)

REQUIRED_SUMMARY_FIELDS = {
    "demo", "variant", "device", "device_name", "torch_version", "batch_size", "steps",
    "samples_per_s", "step_ms_p50", "step_ms_p95", "peak_memory_mb", "config",
}


def test_each_variant_writes_one_gzip_trace_with_profiler_steps(workers_smoke_out):
    for variant in ("bad", "fixed"):
        run_dir = workers_smoke_out / "dataloader_workers" / variant
        traces = trace.trace_files(run_dir)
        assert len(traces) == 1
        assert traces[0].name.endswith(".pt.trace.json.gz")
        events = json.loads(gzip.decompress(traces[0].read_bytes()))["traceEvents"]
        steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
        assert len(steps) == 3  # the schedule records three active steps
        # By name: the harness rewrites user_annotation to a category the TensorBoard plugin keeps.
        regions = {e["name"] for e in events if e.get("ph") == "X"}
        assert {"data", "forward", "backward", "optimizer"} <= regions
        assert any(name.startswith("enumerate(DataLoader)") for name in regions)
        assert (run_dir / "key_averages.txt").read_text().count("\n") > 5


def test_summary_has_the_fields_and_the_config_that_differs(workers_smoke_out):
    bad = read_summary(workers_smoke_out, "dataloader_workers", "bad")
    fixed = read_summary(workers_smoke_out, "dataloader_workers", "fixed")
    for summary, variant in ((bad, "bad"), (fixed, "fixed")):
        assert REQUIRED_SUMMARY_FIELDS <= summary.keys()
        assert summary["variant"] == variant and summary["device"] == "cpu"
        assert summary["samples_per_s"] > 0
        assert 0 < summary["step_ms_p50"] <= summary["step_ms_p95"]
        assert summary["peak_memory_mb"] > 0  # from the profiler's CPU [memory] events
        assert summary["steps"] == 3 and summary["batch_size"] == 4  # the smoke preset
        assert_timing_is_consistent(summary)
        assert summary["data_wait_pct"] is not None and 0 <= summary["data_wait_pct"] < 100
    assert bad["config"]["num_workers"] == 0 and bad["config"]["batch_dtype"] == "float32"
    assert fixed["config"]["num_workers"] >= 1 and fixed["config"]["persistent_workers"]
    assert fixed["config"]["pin_memory"] is False  # pinning is for CUDA copies only
    # uint8 batches (4x fewer bytes), normalised after the loader: on a CPU in the training process
    assert fixed["config"]["batch_dtype"] == "uint8"
    assert fixed["config"]["to_device"].startswith("normalised in the training process")
    assert "to_device" not in bad["config"]


def test_rerun_into_the_same_out_leaves_one_trace(workers_smoke_out, tmp_path):
    # The first run is the smoke run's (3 steps), copied; the rerun takes 2: the step counts and
    # the trace's name tell which run wrote what is left.
    run_dir = tmp_path / "dataloader_workers" / "bad"
    shutil.copytree(workers_smoke_out / "dataloader_workers" / "bad", run_dir)
    [first] = trace.trace_files(run_dir)
    result = run_demo("dataloader_workers", "bad", "--smoke", "--device", "cpu", "--steps", "2",
                      "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [left] = trace.trace_files(run_dir)
    summary = read_summary(tmp_path, "dataloader_workers", "bad")
    assert left.name != first.name
    assert summary["steps"] == 2 and summary["trace_file"] == left.name


def test_help_describes_the_demo_and_the_flags():
    result = run_demo("dataloader_workers", "fixed", "--help")
    assert result.returncode == 0
    assert "DataLoader workers (fixed)" in result.stdout
    for flag in ("--device", "--smoke", "--steps", "--out", "--seed"):
        assert flag in result.stdout


def test_bad_flags_are_one_clear_error_with_exit_code_2():
    # --device cpu where the device is not the point: those run in forks (run_demo).
    cases = (["--device", "cpu", "--steps", "0"], ["--device", "tpu"],
             ["--device", "cpu", "--frobnicate"], ["--device", "cpu", "--memory-budget-gb", "0"])
    with ThreadPoolExecutor(max_workers=2) as pool:  # two at a time: 2 cores
        results = list(pool.map(lambda args: run_demo("dataloader_workers", "bad", *args), cases))
    for result in results:
        assert result.returncode == 2
        assert "Traceback" not in result.stderr
        assert "error:" in result.stderr.splitlines()[-1]


# A demo's set-up, then what a step might raise: Ctrl-C (KeyboardInterrupt) or an error.
STOPPED_IN_A_STEP = """from common import harness
harness.setup(demo="dataloader_workers", variant="bad")
raise {raised}
"""


@pytest.mark.parametrize("in_a_fork", [False, True], ids=["python", "fork"])
def test_ctrl_c_in_a_run_is_one_line_and_ends_it_as_sigint_does(tmp_path, in_a_fork):
    """Ctrl-C in a demo's step: one line, not the traceback of where the step was, and the end
    SIGINT gives a process (a shell loop around it stops too). An error still prints its
    traceback and exits 1. The same from `python <script>` and from a fork of forks.py."""
    for raised, code in (("KeyboardInterrupt", -signal.SIGINT), ("ValueError('no batch')", 1)):
        script = tmp_path / "stopped.py"
        script.write_text(STOPPED_IN_A_STEP.format(raised=raised))
        done = run_python([str(script), "--device", "cpu"], in_a_fork)
        assert done.returncode == code, done.stderr
        last_line = done.stderr.strip().splitlines()[-1]
        if code == 1:
            assert "Traceback" in done.stderr and last_line == "ValueError: no batch"
        else:
            assert "Traceback" not in done.stderr
            assert last_line == "[dataloader_workers/bad] stopped (Ctrl-C)"


# How a script may end, each of which a fork of forks.py ends as `python <script>` does.
SCRIPT_ENDINGS = {
    "a subclass of KeyboardInterrupt": "class Stop(KeyboardInterrupt): pass\nraise Stop\n",
    "an exception hook that fails": (
        "import atexit, sys\n"
        "def hook(*exception): raise ValueError('the hook fails')\n"
        "sys.excepthook = hook\n"
        "atexit.register(print, 'exit handlers ran')\n"
        "raise RuntimeError('the script fails')\n"),
}


@pytest.mark.parametrize("ending", SCRIPT_ENDINGS)
def test_a_fork_ends_a_script_as_python_does(tmp_path, ending):
    script = tmp_path / "ends.py"
    script.write_text(SCRIPT_ENDINGS[ending])
    fresh, forked = (run_python([str(script)], in_a_fork) for in_a_fork in (False, True))
    assert forked.returncode == fresh.returncode == 1
    assert forked.stdout == fresh.stdout
    # What they say, less the traceback's frames: a fork's hold runpy's, which ran the script.
    said = [[line for line in result.stderr.splitlines() if not line.startswith(" ")]
            for result in (fresh, forked)]
    assert said[0] == said[1] and said[0][-1] in ("Stop", "RuntimeError: the script fails")


def test_the_fork_server_serves_an_environment_the_run_itself_added_to():
    """What this process adds to its environment as a run would (Kineto's log level, Inductor's
    cache folder and bookkeeping on a first compile) leaves the fork server in use: without it,
    every later CPU run fell back to a fresh python. A test's own change does not, nor does a
    change to a value the server started with."""
    started = {"PATH": "/bin", "PYTEST_CURRENT_TEST": "a"}
    assert same_env(started, {**started, "PYTEST_CURRENT_TEST": "b", "KINETO_LOG_LEVEL": "6",
                              "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_root",
                              "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR": "1407"})
    assert not same_env(started, {**started, "CXX": "no-such-compiler"})
    assert not same_env({**started, "KINETO_LOG_LEVEL": "2"}, {**started, "KINETO_LOG_LEVEL": "6"})


def test_a_demo_run_on_the_cpu_forks_and_answers_as_a_fresh_python_does():
    """run_demo runs a script given --device cpu in a fork of one process that imported torch
    (tests/conftest.py): its exit code, its standard output and its standard error's last line
    (a bad flag: exit code 2, the error there alone) are those of `python <script>` with the same
    flags. What the imports print (a library's warning) is the fork process's, not the run's."""
    args = ("--device", "cpu", "--steps", "0")
    forks = demo_forks(demo_env())
    asked = forks.forks.asked
    forked = run_demo("dataloader_workers", "bad", *args)
    assert forks.forks.asked > asked  # it went to the fork process (a background job may too)
    fresh = subprocess.run([sys.executable, str(ROOT / "demos" / "dataloader_workers" / "bad.py"),
                            *args], check=False, cwd=ROOT, capture_output=True, text=True,
                           env=demo_env(), timeout=DEMO_RUN_TIMEOUT_S)
    last_line = [result.stderr.strip().splitlines()[-1] for result in (forked, fresh)]
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout) == (2, "")
    assert last_line[0] == last_line[1] and "--steps" in last_line[0]
