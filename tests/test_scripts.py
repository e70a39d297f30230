"""The scripts a user runs: run_demos.py's exit code and --out, tensorboard.sh's flags, and the
PYTHON=... mode of run_demos.sh and test.sh (an existing interpreter, no .venv). No real demo run
and no real TensorBoard: fake demo scripts and fake interpreters stand in, so each test takes
seconds."""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from common import tensorboard_compat
from tests.conftest import (ROOT, TENSORBOARD_START_METHOD, UNKNOWN_MARKS, demo_env, demo_forks,
                            load_script, run_in_fork, whole_suite)
from tests.kineto_builder import KinetoTrace, simulate_training, write_demo_run
from tests.synthetic_traces import gpu_training_trace

SCRIPT_TIMEOUT_S = 120  # each script here answers in seconds; this only stops a hang
PROJECT_MODULES = ["torch", "torchvision", "numpy", "matplotlib", "tensorboard"]  # scripts/_venv.sh


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


# --- run_demos.py: exit code and --out, with fake demo scripts ---------------------------------
# A fake demo script does what its name says, as a real one would be seen by run_demos.py:
# "ok" leaves a fresh run (a copy of a prepared one, dated now), "fail" exits 1, "silent" exits 0
# and writes nothing.
# "raise" ends in an error, "message" in sys.exit(a message), "slow-fail" in exit code 3 after two
# lines 2 s apart. "ok" also writes process.json (how it was run) and, from an exit handler,
# at_exit.txt.
FAKE_SCRIPT = """
import atexit, json, os, shutil, sys, time
from datetime import datetime, timezone
from pathlib import Path
behaviour, template = {behaviour!r}, Path({template!r})
here = Path(__file__)
if behaviour == "fail":
    sys.exit(1)
if behaviour == "raise":
    raise ValueError("the fake script's own error")
if behaviour == "message":
    sys.exit("the fake script's message")
if behaviour == "slow-fail":
    print("slow start", flush=True)
    time.sleep(2)
    print("slow end")
    sys.exit(3)
if behaviour == "ok":
    out = Path(sys.argv[sys.argv.index("--out") + 1]) / here.parent.name / here.stem
    shutil.copytree(template / here.parent.name / here.stem, out, dirs_exist_ok=True)
    summary = json.loads((out / "summary.json").read_text())
    summary["created_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (out / "summary.json").write_text(json.dumps(summary))
    (out / "argv.json").write_text(json.dumps(sys.argv[1:]))
    (out / "process.json").write_text(json.dumps(dict(
        name=__name__, cwd=os.getcwd(), path0=sys.path[0], torch="torch" in sys.modules,
        orig_argv=sys.orig_argv[1:])))
    atexit.register((out / "at_exit.txt").write_text, "ran")
"""


def gpu_run(out: Path, demo: str, variant: str) -> None:
    """A small finished run (GPU trace and summary, dated 2025) at out/<demo>/<variant>/."""
    built = KinetoTrace()
    built.gpu()
    write_demo_run(out, demo, variant, simulate_training(built),
                   samples_per_s=1000.0 if variant == "bad" else 2000.0, peak_memory_mb=100.0)


@pytest.fixture
def fake_demos(tmp_path, monkeypatch):
    """run_demos.py with its demos in tmp_path/demos; add(name, bad=..., fixed=...) makes a pair.
    The scripts run from tmp_path/root, standing in for the repository root (run_demos.ROOT), so
    a run that got --out wrong writes there, not into the repository."""
    run_demos = load_script("run_demos")
    monkeypatch.setattr(run_demos, "DEMOS_DIR", tmp_path / "demos")
    monkeypatch.setattr(run_demos, "ROOT", tmp_path / "root")
    run_demos.ROOT.mkdir()
    template = tmp_path / "template"

    def add(name: str, bad: str = "ok", fixed: str = "ok") -> None:
        for variant, behaviour in (("bad", bad), ("fixed", fixed)):
            gpu_run(template, name, variant)
            script = run_demos.DEMOS_DIR / name / f"{variant}.py"
            script.parent.mkdir(parents=True, exist_ok=True)
            script.write_text(FAKE_SCRIPT.format(behaviour=behaviour, template=str(template)))

    return SimpleNamespace(main=run_demos.main, module=run_demos, add=add, root=run_demos.ROOT,
                           out=tmp_path / "out")


def test_run_demos_exits_0_and_writes_out_relative_to_where_the_user_stands(
        fake_demos, tmp_path, monkeypatch, capsys):
    fake_demos.add("healthy")
    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)  # the scripts run from the root; --out must not follow them there
    assert fake_demos.main(["--out", "relative/out"]) == 0
    printed = capsys.readouterr()
    out = caller / "relative" / "out"
    for variant in ("bad", "fixed"):
        assert (out / "healthy" / variant / "summary.json").is_file()
    assert (out / "REPORT.md").is_file() and (out / "report.html").is_file()
    assert list(fake_demos.root.iterdir()) == []
    assert "2.00x more samples/s" in printed.out  # the comparison of this run's fresh summaries
    assert "failed" not in printed.err


def test_run_demos_exits_1_and_names_the_failed_script(fake_demos, capsys):
    fake_demos.add("broken", fixed="fail")
    fake_demos.add("healthy")
    assert fake_demos.main(["--out", str(fake_demos.out)]) == 1
    printed = capsys.readouterr()
    assert one_line(printed.err) == "failed: broken/fixed"
    assert "broken: no comparison (a run failed)" in printed.out
    assert "2.00x more samples/s" in printed.out  # the healthy pair is still compared


def test_run_demos_exits_1_for_a_stale_pair(fake_demos, capsys):
    """Scripts that exit 0 but write nothing leave last time's summaries: nothing to compare."""
    fake_demos.add("stale", bad="silent", fixed="silent")
    for variant in ("bad", "fixed"):
        gpu_run(fake_demos.out, "stale", variant)  # an earlier run's, dated 2025
    assert fake_demos.main(["--out", str(fake_demos.out)]) == 1
    printed = capsys.readouterr()
    assert one_line(printed.err) == "failed: stale (comparison)"
    assert "stale: no comparison (bad/summary.json is from 2025-01-01" in printed.out


def test_run_demos_unknown_demo_is_one_line_and_exit_code_2(fake_demos, capsys):
    fake_demos.add("healthy")
    with pytest.raises(SystemExit) as stopped:
        fake_demos.main(["healthy", "nosuch"])
    assert stopped.value.code == 2
    assert one_line(capsys.readouterr().err) == (
        "run_demos.sh: error: unknown demo 'nosuch'; choose from: healthy")


def test_run_demos_passes_steps_and_seed_to_every_script(fake_demos):
    fake_demos.add("healthy")
    assert fake_demos.main(["--out", str(fake_demos.out), "--steps", "7", "--seed", "3",
                            "--recorded-steps", "9"]) == 0
    for variant in ("bad", "fixed"):
        argv = json.loads((fake_demos.out / "healthy" / variant / "argv.json").read_text())
        assert argv[argv.index("--steps") + 1] == "7" and argv[argv.index("--seed") + 1] == "3"
        assert argv[argv.index("--recorded-steps") + 1] == "9"
    assert fake_demos.main(["--out", str(fake_demos.out)]) == 0  # not given: the scripts' own
    argv = json.loads((fake_demos.out / "healthy" / "bad" / "argv.json").read_text())
    assert not {"--steps", "--seed", "--recorded-steps"} & set(argv)


def test_run_demos_passes_the_memory_budget_to_every_script(fake_demos):
    fake_demos.add("healthy")
    assert fake_demos.main(["--out", str(fake_demos.out), "--memory-budget-gb", "0.5"]) == 0
    for variant in ("bad", "fixed"):
        argv = json.loads((fake_demos.out / "healthy" / variant / "argv.json").read_text())
        assert argv[argv.index("--memory-budget-gb") + 1] == "0.5"


def test_run_demos_jobs_run_smoke_scripts_at_once_and_print_each_whole_in_order(fake_demos,
                                                                                capsys):
    """--jobs 2 --smoke: every script runs, a failed one is named as without --jobs, and each
    script's header comes in the order of the runs."""
    fake_demos.add("broken", fixed="fail")
    fake_demos.add("healthy")
    assert fake_demos.main(["--out", str(fake_demos.out), "--smoke", "--jobs", "2"]) == 1
    printed = capsys.readouterr()
    assert one_line(printed.err) == "failed: broken/fixed"
    headers = [line.split()[1:3] for line in printed.out.splitlines() if line.startswith("=== [")]
    assert headers == [["[1/4]", "broken/bad"], ["[2/4]", "broken/fixed"],
                       ["[3/4]", "healthy/bad"], ["[4/4]", "healthy/fixed"]]
    for variant in ("bad", "fixed"):
        argv = json.loads((fake_demos.out / "healthy" / variant / "argv.json").read_text())
        assert "--smoke" in argv
    assert "2.00x more samples/s" in printed.out


def test_run_demos_jobs_start_a_ladder_s_rungs_one_at_a_time():
    """--jobs: beside a running rung, the next script to start is the first waiting one that is
    no rung of the same ladder (its compiled rungs reuse the compile cache the one before wrote);
    pairs and other ladders start as they come."""
    run_demos = load_script("run_demos")
    runs = [("ladder", "rung0_baseline"), ("ladder", "rung1_workers"), ("pair", "bad"),
            ("pair", "fixed"), ("other_ladder", "rung0_baseline")]
    assert run_demos.next_to_start(runs, [0, 1, 2, 3, 4], running=[]) == 0
    assert run_demos.next_to_start(runs, [1, 2, 3, 4], running=[0]) == 2
    assert run_demos.next_to_start(runs, [1, 3, 4], running=[0, 2]) == 3
    assert run_demos.next_to_start(runs, [1, 4], running=[0]) == 4
    assert run_demos.next_to_start(runs, [1], running=[0]) is None
    assert run_demos.next_to_start(runs, [1, 3], running=[2]) == 1


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_run_demos_smoke_on_the_cpu_runs_each_script_in_a_fork_as_python_would(fake_demos, capfd,
                                                                            jobs):
    """--smoke --device cpu: the scripts run in forks of one process that imported torch once
    (scripts/forks.py; a fresh `python` has not), each as `python <script>` would run it: as
    __main__, from the root, its own folder first on sys.path, its exit handlers run, and
    sys.exit(a code), sys.exit(a message) and an error (its traceback printed) are failures. Each
    script's exit code and whole output are its own, under its own header, where a slow failing
    script runs beside a fast one that succeeds. A run on another device starts each script
    afresh."""
    fake_demos.add("broken", bad="raise", fixed="message")
    fake_demos.add("healthy")
    fake_demos.add("slow", bad="slow-fail")
    assert fake_demos.main(["--out", str(fake_demos.out), "--smoke", "--device", "cpu",
                            "--jobs", jobs]) == 1
    printed = capfd.readouterr()
    assert printed.err.strip().splitlines()[-1] == "failed: broken/bad, broken/fixed, slow/bad"
    slow_bad = printed.out.split("slow/bad (")[1].split("\n=== ")[0]
    assert "slow start" in slow_bad and "slow end" in slow_bad
    assert "slow: no comparison (a run failed)" in printed.out
    written = printed.out + printed.err
    assert "Traceback" in written and "ValueError: the fake script's own error" in written
    assert "the fake script's message" in written
    assert "2.00x more samples/s" in printed.out
    for variant in ("bad", "fixed"):
        folder = fake_demos.out / "healthy" / variant
        script = fake_demos.module.DEMOS_DIR / "healthy" / f"{variant}.py"
        argv = json.loads((folder / "argv.json").read_text())
        assert json.loads((folder / "process.json").read_text()) == {
            "name": "__main__", "cwd": str(fake_demos.root),
            "path0": str(fake_demos.module.DEMOS_DIR / "healthy"), "torch": True,
            # what a script restarts itself with (--compile-log): `python <script> <flags>`
            "orig_argv": [str(script), *argv]}
        assert (folder / "at_exit.txt").read_text() == "ran"
    assert fake_demos.main(["healthy", "--out", str(fake_demos.out), "--smoke"]) == 0
    assert json.loads((fake_demos.out / "healthy" / "bad" / "process.json").read_text())[
        "torch"] is False  # --device auto: a process of its own


def test_a_fork_keeps_its_stderr_apart_and_is_ended_past_its_timeout(tmp_path):
    """forks.py: a request with "stderr" writes the script's standard error there, apart from its
    log, and one with "timeout_s" is ended by SIGALRM once it has run that long (run_demo's
    answer for a hung script, as subprocess.run's timeout is for a process of its own). The
    script would sleep a minute; its alarm is at 1 s."""
    script = tmp_path / "hangs.py"
    script.write_text("import sys, time\nprint('to stdout', flush=True)\n"
                      "print('to stderr', file=sys.stderr, flush=True)\ntime.sleep(60)\n")
    done = run_in_fork(demo_forks(demo_env()), [str(script)], timeout_s=1)
    assert done.returncode == -signal.SIGALRM
    assert (done.stdout, done.stderr) == ("to stdout\n", "to stderr\n")


# --- SIGTERM: a run stopped from outside leaves nothing running ---------------------------------
# A hanging fake script: it writes its pid to started/<its name> and sleeps far longer than the
# test waits, so that only a stop can end it.
HANGING_SCRIPT = """import os, sys, time
from pathlib import Path
pid_file = Path({started!r}, Path(__file__).stem)
print(f"[hangs/{{Path(__file__).stem}}] started", flush=True)  # a demo's line, before the stop
Path(f"{{pid_file}}.part").write_text(str(os.getpid()))
os.replace(f"{{pid_file}}.part", pid_file)  # whole once it is there: the test reads it then
try:
    time.sleep(600)
except KeyboardInterrupt:  # a demo that takes a moment to unwind on Ctrl-C, then says so
    time.sleep({unwind_s})
    Path({started!r}, Path(__file__).stem + ".unwound").touch()
    print(f"[hangs/{{Path(__file__).stem}}] stopped (Ctrl-C)", file=sys.stderr, flush=True)
    sys.exit(130)
"""
UNWIND_S = 0.5  # a SIGTERM at once would cut this short; stopping.STOP_GRACE_S is 20x that
SCRIPTS_START_TIMEOUT_S = 120  # forks.py imports torch first: seconds here, more on a loaded box
# run_demos.py stops what it started within stopping.STOP_GRACE_S (SIGKILL after it); this is
# far above, and only stops a test whose run would not end.
STOPPED_TIMEOUT_S = 60


def session_processes(session_id: int) -> list[int]:
    """Pids of the processes in a session, zombies too: a process that nothing waited for."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int(
                    (proc / "stat").read_text().rsplit(")", 1)[1].split()[3]) == session_id:
                found.append(int(proc.name))
        except OSError:  # it ended while we looked
            pass
    return found


def wait_for_files(paths: list[Path], process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(path.is_file() for path in paths):
        assert process.poll() is None, f"it ended first, exit code {process.returncode}"
        assert time.monotonic() < deadline, f"no {paths} after {timeout_s} s"
        time.sleep(0.1)


def test_sigterm_in_the_block_unwinds_it_then_reaches_the_handler_before_it():
    """stopping.sigterm_raises: SIGTERM raises inside the block, so its `finally` runs; then the
    signal goes on to the handler that was there before (pytest's, an outer block's), which is
    back in place; where that is the default, the process ends (the run_demos tests below)."""
    from common import stopping
    seen = []

    def outer(signum, frame) -> None:
        seen.append("outer handler")

    before = signal.signal(signal.SIGTERM, outer)
    try:
        with stopping.sigterm_raises():
            try:
                signal.raise_signal(signal.SIGTERM)
                seen.append("not stopped")
            finally:
                seen.append("finally")
        seen.append("after the block")
        assert signal.getsignal(signal.SIGTERM) is outer
    finally:
        signal.signal(signal.SIGTERM, before)
    assert seen == ["finally", "outer handler", "after the block"]


# stopping.STOP_GRACE_S in the two tests below: each stage waits this long; the last one, after
# SIGKILL, has it to see the process gone, which takes milliseconds even on loaded cores.
STAGE_GRACE_S = 1.0
# A process that ignores both signals sent before SIGKILL (SIGINT too: the wait after Ctrl-C is
# for it); it says so on standard output once they are ignored.
DEAF_TO_STOPS = """import signal, time
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""
# The same as a fork of forks.py, stopped by forks.stop_forks, in a process of its own (stop_forks
# reaps with waitpid(-1), which in the tests' process would reap their other children too).
STOP_A_DEAF_FORK = """import os, signal, sys, time
sys.path[:0] = [{root!r}, {scripts!r}]
import forks
from common import stopping
stopping.STOP_GRACE_S = {grace_s}
replies, reply_end = os.pipe()
ready, ready_end = os.pipe()
pid = os.fork()
if pid == 0:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    os.write(ready_end, b"x")
    time.sleep(60)
    os._exit(0)
os.read(ready, 1)  # its signals are ignored from here
os.kill(pid, signal.SIGINT)  # Ctrl-C, as the terminal sends it to the group
running = {{pid: 7}}
began = time.monotonic()
forks.stop_forks(running, reply_end, stopping.AFTER_CTRL_C)
print(os.read(replies, 64).decode().strip(), len(running), time.monotonic() - began)
"""


def test_stop_sends_sigkill_last_to_what_ignores_sigterm_and_ctrl_c(monkeypatch):
    """stopping.stop after Ctrl-C (AFTER_CTRL_C): a wait, SIGTERM, then SIGKILL; a process that
    ignores the first two has each stage's grace in full, then is killed."""
    from common import stopping
    monkeypatch.setattr(stopping, "STOP_GRACE_S", STAGE_GRACE_S)
    deaf = subprocess.Popen([sys.executable, "-c", DEAF_TO_STOPS], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert deaf.stdout.readline() == "ready\n"  # its signals are ignored from here
        deaf.send_signal(signal.SIGINT)  # Ctrl-C, as the terminal sends it to the group
        began = time.monotonic()
        stopping.stop(deaf, signals=stopping.AFTER_CTRL_C)
        took_s, exit_code = time.monotonic() - began, deaf.poll()
    finally:
        deaf.kill()  # nothing, once it has ended
        deaf.wait()
    assert exit_code == -signal.SIGKILL
    assert took_s >= 2 * STAGE_GRACE_S  # the wait and SIGTERM's stage, each waited out


def test_stop_forks_sends_sigkill_last_to_a_fork_that_ignores_sigterm_and_ctrl_c():
    """forks.stop_forks after Ctrl-C: a fork that ignores SIGTERM and SIGINT is killed after both
    stages, reaped and replied for with SIGKILL's exit code."""
    script = STOP_A_DEAF_FORK.format(root=str(ROOT), scripts=str(ROOT / "scripts"),
                                     grace_s=STAGE_GRACE_S)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=STOPPED_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    request_id, exit_code, left, took_s = done.stdout.split()
    assert (request_id, int(exit_code), int(left)) == ("7", -signal.SIGKILL, 0)
    assert float(took_s) >= 2 * STAGE_GRACE_S  # the wait and SIGTERM's stage, each waited out


@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c"])
@pytest.mark.parametrize("args, scripts", [
    (["--smoke", "--device", "cpu", "--jobs", "2"], ["bad", "fixed"]),  # in forks of forks.py
    (["--device", "cpu"], ["bad"]),  # a timed run: a process of its own
], ids=["forks", "processes"])
def test_sigterm_or_ctrl_c_to_run_demos_stops_the_scripts_still_running_and_leaves_nothing(
        tmp_path, args, scripts, stop):
    """A SIGTERM to run_demos.py alone (a `kill`, a CI job's cancel) stops the scripts it started,
    which would run on as orphans, holding a GPU's memory; its --jobs logs go too. Ctrl-C reaches
    the whole process group, as a terminal sends it. Either way it ends as that signal ends a
    process (so a shell loop around it stops too), without a traceback of its own; after Ctrl-C
    it says so in one line, and each script had the time to unwind on the Ctrl-C it got. What
    each script printed is there, with --jobs too (its log, printed whole once it ends, is
    printed on a stop, under a header that says it stopped)."""
    root, started, tmp = tmp_path / "root", tmp_path / "started", tmp_path / "tmp"
    for folder in (root / "scripts", root / "demos" / "hangs", started, tmp):
        folder.mkdir(parents=True)
    for name in ("run_demos.py", "forks.py"):  # the real scripts, over fake demos
        shutil.copy(ROOT / "scripts" / name, root / "scripts" / name)
    for variant in ("bad", "fixed"):
        (root / "demos" / "hangs" / f"{variant}.py").write_text(
            HANGING_SCRIPT.format(started=str(started), unwind_s=UNWIND_S))
    # Output to a file: a pipe would stay open while a script left running holds it.
    with open(tmp_path / "output", "w") as output:
        run = subprocess.Popen(
            [sys.executable, str(root / "scripts" / "run_demos.py"), *args, "--out",
             str(tmp_path / "out")], env=dict(demo_env(), TMPDIR=str(tmp)), stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True,
            # A job started in the background of a shell (as CI may run this) inherits SIGINT
            # ignored, and Python then never raises KeyboardInterrupt: Ctrl-C as a terminal has it.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for_files([started / name for name in scripts], run, SCRIPTS_START_TIMEOUT_S)
        script_pids = [int((started / name).read_text()) for name in scripts]
        assert set(script_pids) <= set(session_processes(run.pid))
        if stop == "sigterm":
            run.send_signal(signal.SIGTERM)
        else:
            os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=STOPPED_TIMEOUT_S)
        left = session_processes(run.pid)  # the scripts, forks.py: each stopped and waited for
    finally:
        with contextlib.suppress(ProcessLookupError):  # none left, as it should be
            os.killpg(run.pid, signal.SIGKILL)  # whatever is left: a failure leaves nothing
        run.wait()
    printed = (tmp_path / "output").read_text()
    expected = signal.SIGTERM if stop == "sigterm" else signal.SIGINT
    assert run.returncode == -expected, printed
    # The fake scripts end on Ctrl-C with a line; a traceback here is run_demos.py's or forks.py's.
    assert "Traceback" not in printed
    lines = printed.splitlines()
    for name in scripts:
        assert f"[hangs/{name}] started" in lines, printed
        if "--jobs" in args:
            assert any(line.startswith("=== [") and f"] hangs/{name} (stopped, " in line
                       for line in lines), printed
    stopped_lines = [line for line in lines if "stopped (Ctrl-C)" in line]
    said = "run_demos.sh: stopped (Ctrl-C); no script is left running"
    assert stopped_lines == ([] if stop == "sigterm" else
                             [f"[hangs/{name}] stopped (Ctrl-C)" for name in scripts] + [said]
                             ), printed
    if stop == "ctrl-c":  # each script had the time to end on its own Ctrl-C
        assert sorted(started.glob("*.unwound")) == [started / f"{name}.unwound"
                                                      for name in scripts]
    assert left == []
    assert list(tmp.glob("run_demos_*")) == []


@pytest.mark.parametrize("args, says", [
    (["--jobs", "2"], "--jobs above 1 needs --smoke"),
    (["--jobs", "0", "--smoke"], "--jobs must be a whole number >= 1, got 0"),
    (["--recorded-steps", "0"], "--recorded-steps must be a whole number >= 1, got 0"),
    (["--memory-budget-gb", "0"], "--memory-budget-gb must be a number > 0, got 0.0")])
def test_run_demos_bad_jobs_or_budget_is_one_line_and_exit_code_2(fake_demos, capsys, args,
                                                                  says):
    fake_demos.add("healthy")
    with pytest.raises(SystemExit) as stopped:
        fake_demos.main(args)
    assert stopped.value.code == 2
    assert one_line(capsys.readouterr().err).startswith(f"run_demos.sh: error: {says}")


def test_run_demos_refuses_to_write_over_the_reference(fake_demos, monkeypatch, capsys):
    fake_demos.add("healthy")
    reference = fake_demos.root / "traces" / "reference"
    monkeypatch.setattr(fake_demos.module, "REFERENCE_DIR", reference)
    with pytest.raises(SystemExit) as stopped:
        fake_demos.main(["--out", str(reference / "h100")])
    assert stopped.value.code == 2
    assert "inside traces/reference/" in one_line(capsys.readouterr().err)
    assert not reference.exists()  # nothing written
    assert fake_demos.main(["--out", str(reference / "h100"), "--update-reference"]) == 0
    assert (reference / "h100" / "healthy" / "bad" / "summary.json").is_file()


# --- tensorboard.sh: flags, answered before any environment is made or checked --------------------
# PYTHON names no program: if a flag were read after scripts/_venv.sh, the answer would be its
# error, not the flag's, and no .venv can be created by accident.
NO_PYTHON = dict(os.environ, PYTHON="/no/such/python")


def tensorboard_sh(*args: str, env: dict = NO_PYTHON) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "scripts" / "tensorboard.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)


def test_tensorboard_help():
    result = tensorboard_sh("--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: ./scripts/tensorboard.sh [--port N] [--logdir DIR]" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--port", "0"], "error: --port needs a number from 1 to 65535"),
    (["--port", "abc"], "error: --port needs a number from 1 to 65535"),
    (["--port", "70000"], "error: --port needs a number from 1 to 65535"),
    (["--port", "99999999999999999999"], "error: --port needs a number from 1 to 65535"),
    (["--port"], "error: --port needs a number from 1 to 65535"),
    (["--logdir", "/no/such/dir"], "error: --logdir needs an existing folder"),
    (["--frobnicate"], "error: unknown argument '--frobnicate' (see --help)"),
])
def test_tensorboard_bad_flags_are_one_line_and_exit_code_2(args, message):
    result = tensorboard_sh(*args)
    assert result.returncode == 2
    assert one_line(result.stderr) == message
    assert result.stdout == ""


def fake_interpreter(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.skipif(sys.platform != "linux",
                    reason="tensorboard.sh forks the plugin's loaders on Linux only")
def test_tensorboard_passes_port_and_logdir_to_tensorboard(tmp_path):
    """A fake PYTHON passes the module check (-c: prints nothing, exits 0), then prints the
    command it was given instead of starting TensorBoard, and how the plugin will start its
    loaders: as the suite's TensorBoard does (tests/conftest.py), which tests what users run."""
    python = fake_interpreter(tmp_path / "python", '[ "$1" = -c ] && exit 0\n'
                              'echo "ran: $*"\necho "loaders: $TORCH_PROFILER_START_METHOD"')
    logdir = tmp_path / "logs"
    logdir.mkdir()
    env = {name: value for name, value in os.environ.items()
           if name != "TORCH_PROFILER_START_METHOD"}
    result = tensorboard_sh("--port", "6123", "--logdir", str(logdir),
                            env=dict(env, PYTHON=str(python)))
    assert result.returncode == 0, result.stderr
    assert f"ran: -m tensorboard.main --logdir {logdir} --port 6123" in result.stdout
    assert f"loaders: {TENSORBOARD_START_METHOD}\n" in result.stdout
    assert f"note: no traces under {logdir} yet" in result.stdout


# --- PYTHON=... mode: an existing interpreter, used as it is -------------------------------------

@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory) -> Path:
    """The scripts, common/ and demos/ without a .venv: whatever a script creates shows here."""
    copy = tmp_path_factory.mktemp("repo")
    for folder in ("scripts", "common", "demos"):
        shutil.copytree(ROOT / folder, copy / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def run_script(repo: Path, script: str, python: Path, *args: str,
               cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHON"] = str(python)
    return subprocess.run([str(repo / "scripts" / script), *args], env=env, cwd=cwd or repo,
                          capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)


@pytest.mark.parametrize("script, missing", [
    ("run_demos.sh", PROJECT_MODULES),
    ("test.sh", PROJECT_MODULES + ["pytest"]),
])
def test_python_lacking_modules_is_one_line_naming_them_all(repo_copy, tmp_path, script, missing):
    # -I -S: the real interpreter with the standard library only (no site-packages, no
    # PYTHONPATH), so every third-party module is missing.
    python = fake_interpreter(tmp_path / "python", f'exec "{sys.executable}" -I -S "$@"')
    result = run_script(repo_copy, script, python)
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        f"error: PYTHON={python} lacks {', '.join(missing)}; install them with: {python} -m pip "
        f"install {' '.join(missing)} (or unset PYTHON to use .venv)")
    assert result.stdout == ""
    assert not (repo_copy / ".venv").exists()


def test_python_too_old_is_one_line(repo_copy, tmp_path):
    # The real interpreter, saying it is 3.9 to the check it is given with -c.
    pretend = ("import sys; code = sys.argv.pop(2); del sys.argv[1]; "
               "sys.version_info = (3, 9, 18, 'final', 0); exec(code)")
    python = fake_interpreter(tmp_path / "python",
                              f'exec "{sys.executable}" -I -S -c "{pretend}" "$@"')
    result = run_script(repo_copy, "run_demos.sh", python)
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        f"error: PYTHON={python} is Python 3.9; 3.10 or newer is needed")
    assert not (repo_copy / ".venv").exists()


def test_python_that_is_no_python_is_one_line(repo_copy):
    result = run_script(repo_copy, "run_demos.sh", Path("/bin/false"))
    assert result.returncode == 2
    assert one_line(result.stderr) == "error: PYTHON=/bin/false did not run as a Python interpreter"


@pytest.mark.parametrize("args, code, expected", [
    (["--help"], 0, "usage: run_demos.sh"),
    (["nosuch"], 2, "run_demos.sh: error: unknown demo 'nosuch'; choose from: "),
])
def test_python_without_the_project_installed_runs_from_anywhere(repo_copy, tmp_path, args,
                                                                 code, expected):
    """An interpreter that has the dependencies but not this project (no pip install -e): the
    script puts the root on PYTHONPATH, and makes no .venv."""
    # -S skips site-packages and its .pth files, the editable install's among them; this
    # interpreter's path comes back through PYTHONPATH, after what the script puts there, less
    # every entry `common` could be imported from.
    dependencies = os.pathsep.join(
        entry for entry in sys.path
        if not (Path(entry or ".").resolve() / "common" / "__init__.py").is_file())
    python = fake_interpreter(tmp_path / "python",
                              f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{dependencies}" '
                              f'exec "{sys.executable}" -S "$@"')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_script(repo_copy, "run_demos.sh", python, *args, cwd=elsewhere)
    assert result.returncode == code, result.stderr
    assert expected in (result.stdout if code == 0 else one_line(result.stderr))
    assert "[setup]" not in result.stdout + result.stderr
    assert not (repo_copy / ".venv").exists()


def test_tensorboard_compat_without_orjson_writes_the_same_trace(tmp_path):
    """orjson is optional (an existing environment may lack it): json writes the same trace."""
    source = tmp_path / "gpu.pt.trace.json.gz"
    source.write_bytes(gzip.compress(json.dumps(gpu_training_trace()).encode()))
    with_orjson = tmp_path / "with_orjson" / source.name
    tensorboard_compat.rewrite_file(source, with_orjson)
    without = tmp_path / "without_orjson" / source.name
    blocked = ("import sys; sys.modules['orjson'] = None\n"  # import orjson now raises ImportError
               "from common import tensorboard_compat, trace\n"
               "assert tensorboard_compat.orjson is None and trace.orjson is None\n"
               "sys.exit(tensorboard_compat.main(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", blocked, str(source), str(without)], cwd=ROOT,
                            capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    written = json.loads(gzip.decompress(without.read_bytes()))
    assert written == json.loads(gzip.decompress(with_orjson.read_bytes()))
    assert written[tensorboard_compat.REWRITE_MARK_KEY]["renamed"]  # it did rewrite something


def cuda_selected(request) -> set[str]:
    """The tests `pytest -m cuda` selects, with the marker registered: read from this session's
    own items where they are the whole suite (a second collection costs 15 CPU-s on 2 cores),
    else from a `pytest --collect-only -m cuda` of its own."""
    if whole_suite(request.session):
        registered = {line.split(":")[0] for line in request.config.getini("markers")}
        assert "cuda" in registered and not UNKNOWN_MARKS, (registered, UNKNOWN_MARKS)
        return {item.nodeid for item in request.session.items if item.get_closest_marker("cuda")}
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "cuda",
                             "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True,
                            timeout=SCRIPT_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "PytestUnknownMarkWarning" not in result.stdout + result.stderr
    return {line for line in result.stdout.splitlines() if "::" in line}


def test_cuda_marker_selects_one_test_per_pair_and_nothing_else(request):
    """`./scripts/test.sh -m cuda` on a GPU box: the marker is registered and picks every pair,
    each ladder, the memory budget's cap (a harness flag, on one pair) and the ladder's jitter
    in Inductor's GPU code."""
    collected = cuda_selected(request)
    run_demos = load_script("run_demos")
    demos = run_demos.available_demos()
    pairs = [demo for demo in demos if not run_demos.rungs_of(demo)]
    expected = {f"tests/test_cuda.py::test_pair_runs_on_the_gpu[{demo}]" for demo in pairs}
    for name in set(demos) - set(pairs):  # a ladder: one test runs every rung
        expected.add(f"tests/test_cuda.py::test_{name}_runs_every_rung_on_the_gpu")
    expected.add("tests/test_cuda.py::test_memory_budget_caps_the_allocator")
    expected.add("tests/test_cuda.py::"
                 "test_the_colour_jitter_compiles_to_the_eager_values_on_the_gpu")
    assert pairs and collected == expected
