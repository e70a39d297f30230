"""Shared fixtures: smoke runs of the demos (as a user runs them: run_demos.sh, or a script in a
fork of one process that imported torch), TensorBoard, and work run in the background."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from common import tensorboard_compat, trace
from tests.synthetic_traces import gpu_training_trace

# pytest imports this file as "conftest", the tests as "tests.conftest" (tests/ is no package):
# one module for both, so that what it starts once per session (the fork server) is one.
sys.modules.setdefault("tests.conftest", sys.modules[__name__])

ROOT = Path(__file__).resolve().parents[1]
DEMO_RUN_TIMEOUT_S = 300  # a smoke run takes seconds; this only stops a hung run


def load_script(name: str):
    """scripts/<name>.py as a module (scripts/ is not a package), registered under its name:
    dataclasses look their module up while it runs."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def demo_env() -> dict[str, str]:
    """This process's environment, with this tree's common/ first: the interpreter may have
    another checkout installed (PYTHON=..., or a .venv made by one), which a script run by path
    would otherwise import."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


@dataclass
class DemoForks:
    """scripts/forks.py for the tests' demo runs on the CPU (run_demos.Forks, started once)."""
    forks: object  # run_demos.Forks
    env: dict[str, str]  # the environment it started under: its forks have this one
    lock: threading.Lock  # the tests run demos from threads too; one reads the replies at a time
    poll_s: float  # how often run_demo looks for its fork's end: run_demos.py's POLL_S


DEMO_FORKS: list[DemoForks] = []  # the one started, once a test has asked for it
DEMO_FORKS_LOCK = threading.Lock()


def demo_forks(env: dict[str, str]) -> DemoForks | None:
    """The process to fork demo runs from, started on first use; None if it started under
    another environment (a test changed os.environ since): a fork would not have the change."""
    with DEMO_FORKS_LOCK:
        if not DEMO_FORKS:
            run_demos = load_script("run_demos")
            DEMO_FORKS.append(DemoForks(run_demos.start_forks(env), env, threading.Lock(),
                                        run_demos.POLL_S))
    return DEMO_FORKS[0] if same_env(DEMO_FORKS[0].env, env) else None


# What this process sets in its own environment as it runs, which a demo run sets for itself
# too: Kineto's log level (harness.setup on a CPU, setdefault) and, on a first compile,
# Inductor's cache folder (its default) and its own _TORCHINDUCTOR_* bookkeeping.
SET_BY_THE_RUN = ("KINETO_LOG_LEVEL", "TORCHINDUCTOR_CACHE_DIR")
SET_BY_THE_RUN_PREFIX = "_TORCHINDUCTOR_"


def same_env(started: dict[str, str], now: dict[str, str]) -> bool:
    """Whether `now` is the environment `started` was, but for the name of the test pytest is
    running (PYTEST_CURRENT_TEST, which it sets for each) and what this process added to it as a
    run would (SET_BY_THE_RUN): a test's own change to the environment is none of those."""
    def added_by_the_run(name: str) -> bool:
        return name not in started and (name in SET_BY_THE_RUN
                                         or name.startswith(SET_BY_THE_RUN_PREFIX))

    def kept(env: dict[str, str]) -> dict[str, str]:
        return {name: value for name, value in env.items()
                if name != "PYTEST_CURRENT_TEST" and not added_by_the_run(name)}
    return kept(started) == kept(now)


def close_demo_forks() -> None:
    for started in DEMO_FORKS:
        with started.lock:
            started.forks.close()  # it waits for its forks: a run_demo interrupted ends first


def pytest_sessionfinish(session) -> None:
    stop_background_jobs()  # before the fork server closes: a job may still use it
    close_demo_forks()


def run_demo(demo: str, variant: str, *args: str) -> subprocess.CompletedProcess:
    """`python demos/<demo>/<variant>.py <args>` from the root, as a user runs it. On the CPU
    (--device cpu), in a fork of one process that imported torch once (scripts/forks.py, as the
    smoke run's scripts are): a fresh `python` spends 7.8 s of a smoke script's 13 s on 2 cores
    importing, and the suite runs about 20 of these. Anywhere else (--device auto or cuda), a
    process of its own, as run_demos.sh gives a run that may use CUDA."""
    on_the_cpu = any(args[i:i + 2] == ("--device", "cpu") for i in range(len(args)))
    return run_python([str(ROOT / "demos" / demo / f"{variant}.py"), *args], on_the_cpu)


def run_python(command: list[str], in_a_fork: bool,
               timeout_s: float = DEMO_RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    """`python <command>` from the root, with this tree's common/ first (demo_env): in a fork of
    the demo fork server if `in_a_fork` (for code that never uses CUDA: the server has not, and
    a fork could not), else, or where the server runs under another environment, in a process
    of its own."""
    env = demo_env()
    forks = demo_forks(env) if in_a_fork else None
    if forks is None:
        return subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout_s, env=env)
    return run_in_fork(forks, command, timeout_s)


def run_in_fork(forks: DemoForks, command: list[str],
                timeout_s: float) -> subprocess.CompletedProcess:
    """`python <command>` from the root in a fork of `forks`, as subprocess.run would answer it
    (its standard output and error apart); SIGALRM ends it past `timeout_s` (exit code -14)."""
    with tempfile.TemporaryDirectory(prefix="run_demo_") as logs:
        stdout, stderr = Path(logs, "stdout"), Path(logs, "stderr")
        with forks.lock:
            poll = forks.forks.start(command, stdout, stderr, timeout_s)
        while True:
            with forks.lock:
                code = poll()
            if code is not None:
                break
            time.sleep(forks.poll_s)
        return subprocess.CompletedProcess([sys.executable, *command], code,
                                           stdout.read_text(errors="replace"),
                                           stderr.read_text(errors="replace"))


def cpu_with_flags(monkeypatch, tmp_path: Path, flags: str) -> None:
    """This process reads a /proc/cpuinfo whose one processor has `flags` (devices.CPUINFO_PATH):
    a CPU with or without BF16 instructions and AMX tiles, whatever this machine's is."""
    from common import devices  # here: conftest itself stays free of torch

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    monkeypatch.setattr(devices, "CPUINFO_PATH", cpuinfo)


def read_summary(out: Path, demo: str, variant: str) -> dict:
    return json.loads((out / demo / variant / "summary.json").read_text())


def assert_timing_is_consistent(summary: dict) -> None:
    """samples/s counts the batch the script trained over the timed steps' wall clock, and each
    step's own clock (start to end) lies inside that wall clock: a step timed over another span,
    or a throughput from another batch or step count, fails here."""
    # A run of several ranks counts every rank's samples; a step of micro-batches all of them.
    samples_per_step = (summary["batch_size"] * summary.get("world_size", 1)
                        * summary["config"].get("micro_batches", 1))
    expected = summary["steps"] * samples_per_step / summary["timed_wall_s"]
    assert summary["samples_per_s"] == pytest.approx(expected, rel=1e-9)
    steps_s = summary["steps"] * summary["step_ms_mean"] / 1000
    assert 0 < steps_s <= summary["timed_wall_s"] * (1 + 1e-9)  # 1e-9: the mean's rounding
    assert 0 < summary["step_ms_p50"] <= summary["step_ms_p95"]
    # The profiled steps' time beside the timed ones (compare and the report warn above
    # trace.PROFILER_OVERHEAD_WARN_RATIO; tests/test_compare.py checks that).
    assert summary["profiler_overhead_ratio"] == pytest.approx(
        summary["profiled_step_ms_p50"] / summary["step_ms_p50"])
    assert summary["profiled_step_ms_p50"] > 0


# --- TensorBoard's PyTorch Profiler plugin, end to end (test_tensorboard.py, test_browser.py) ---
# One logdir holds every run the plugin tests read. The plugin reads a run folder once, when it
# first sees a trace in it: TensorBoard starts once the smoke run has ended, and the CPU-preset
# pair written later lands whole (the harness writes a trace atomically, one per folder).
RUN_DEMOS_TIMEOUT_S = 900  # every pair in smoke mode takes seconds each; this only stops a hang
# Smoke scripts at once: two, the CI machine's cores. On the CPU the scripts run in forks of one
# process that imported torch once (scripts/forks.py): 152 s on a 2-core EPYC against 320 s with
# a process of its own per script, which spent most of its time importing. Smoke timings are no
# benchmark.
SMOKE_JOBS = 2
# The tests run one at a time, and their chain is the session's longest: the smoke run and the
# TensorBoard after it (process groups of their own, the plugin's loaders in it) run at a lower
# priority, on what the tests leave of the cores, so that they slow the chain less. The
# background jobs keep the tests' priority: their runs are forks of the tests' fork server.
BACKGROUND_NICE = ("nice", "-n", "10")  # POSIX nice(1): 10, its default increment
# The plugin parses each trace in a process of its own, forked (TENSORBOARD_START_METHOD): the
# smoke run's 44 load in 33 s on 2 cores (70 s spawned), and the whole logdir (those, the
# CPU-preset pair, six real GPU traces) in about a minute beside the other tests. A limit 10x
# that only stops a hang, never a slow but working load.
TENSORBOARD_LOAD_TIMEOUT_S = 600
TENSORBOARD_POLL_S = 1.0
# The smoke sizes leave the bad variant's DataLoader share under the plugin's 5 % advice line (3 %
# measured on 2 cores), so the data-loading checks read the CPU preset, with one timed step.
WORKERS_CPU_PRESET_ARGS = ("--device", "cpu", "--steps", "1")


@pytest.fixture(scope="session")
def profiler_logdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tensorboard_logdir")


@dataclass
class SmokeRuns:
    out: Path
    ran: set[str]  # "<demo>/<variant>" for each script run_demos.sh said it ran


@dataclass
class SmokeStarted:
    out: Path
    process: subprocess.Popen
    stdout: Path
    stderr: Path
    deadline: float  # time.monotonic() past which it counts as hung
    # TensorBoard over the logdir, started once the smoke run has succeeded
    # (pytest_runtest_logfinish), or by the tensorboard fixture if it comes first
    tensorboard: TensorBoardStarted | None = None
    followed_up: bool = False  # whether what follows its end has started
    follow_up_error: str | None = None  # why that failed, for the tests that need it


# The smoke run takes minutes of both cores, and most tests need none of it: it starts in the
# background with the first test, and the tests that read it (or what runs after it) run late, so
# the others run beside it instead of after it. Last of all, the tests of the pair that needs the
# cores to itself (workers_cpu_out, which TensorBoard's tests read too): the late tests before
# them run while the background work they wait for ends.
LATE_FIXTURES = ("demos_smoke", "workers_cpu_out", "with_stack_runs", "doc_command_failures",
                 "after_the_smoke_run")
LAST_FIXTURES = ("workers_cpu_out",)
SELECTED_FIXTURES: set[str] = set()  # the fixtures the selected tests use, once collected


DESELECTED: list[str] = []  # the tests a plugin or an option deselected (pytest_deselected)
COLLECTION_ERRORS: list[str] = []  # the files that failed to collect
UNKNOWN_MARKS: list[str] = []  # PytestUnknownMarkWarning's messages: marks not registered


def pytest_deselected(items: list[pytest.Item]) -> None:
    DESELECTED.extend(item.nodeid for item in items)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        COLLECTION_ERRORS.append(report.nodeid)


def pytest_warning_recorded(warning_message, when, nodeid, location) -> None:
    if issubclass(warning_message.category, pytest.PytestUnknownMarkWarning):
        UNKNOWN_MARKS.append(str(warning_message.message))


def whole_suite(session: pytest.Session) -> bool:
    """Whether this session's items are every test there is: pytest ran with no arguments and no
    PYTEST_ADDOPTS (no file, -k, -m, --lf or --ignore: ./scripts/test.sh as CI runs it), every
    file collected and no test deselected."""
    return (not session.config.invocation_params.args and not os.environ.get("PYTEST_ADDOPTS")
            and not DESELECTED and not COLLECTION_ERRORS)


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected what they deselect
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: (any(name in item.fixturenames for name in LATE_FIXTURES)
                                 + any(name in item.fixturenames for name in LAST_FIXTURES)))
    SELECTED_FIXTURES.update(name for item in items for name in item.fixturenames)


# --- Work that runs in the background once the smoke run has ended --------------------------------
# While the smoke run lasts, it and the tests keep both cores busy; after it, the tests run one at
# a time and a core is free. Subprocess work that a few tests only read (the --with-stack runs,
# every doc command) runs there, one job at a time, after TensorBoard has started; the tests that
# read it run late (LATE_FIXTURES) and wait for it if it has not ended.


@dataclass
class BackgroundJob:
    run: Callable[[Path], object]  # given a fresh folder; what it returns is what the tests read
    future: Future | None = None  # once started in the background, or run where it was asked


BACKGROUND_JOBS: dict[str, BackgroundJob] = {}
BACKGROUND = ThreadPoolExecutor(max_workers=1, thread_name_prefix="background_job")


def background_job(name: str, run: Callable[[Path], object]) -> None:
    """Register `run` (a test module does, when it is imported; this file, for the CPU-preset
    pair's bad run, once the smoke run has ended) as the job that the fixture `name` reads: it
    starts in the background once the smoke run has ended, if a selected test uses that fixture
    (start_background_jobs)."""
    BACKGROUND_JOBS[name] = BackgroundJob(run)


def start_background_jobs(base: Path) -> None:
    demo_forks(demo_env())  # started here, in the main thread, under no test's patched environment
    for name, job in BACKGROUND_JOBS.items():
        if job.future is None and name in SELECTED_FIXTURES:
            job.future = BACKGROUND.submit(job.run, Path(tempfile.mkdtemp(prefix=name, dir=base)))


def background_result(name: str, tmp_path_factory) -> object:
    """What the job `name` returned: it ran in the background (waited for, if it has not
    ended), or runs now, where no smoke run has started it (and then never again)."""
    job = BACKGROUND_JOBS[name]
    if job.future is None:
        job.future = Future()
        try:
            job.future.set_result(job.run(tmp_path_factory.mktemp(name)))
        except BaseException as error:  # noqa: BLE001 - result() below raises it again
            job.future.set_exception(error)
    return job.future.result()


def stop_background_jobs() -> None:
    """At the session's end: a job not yet started never starts; a running one is waited for, so
    that nothing it runs outlives the session (or uses the fork server after it has closed)."""
    BACKGROUND.shutdown(wait=True, cancel_futures=True)


def wait_for_background_jobs() -> None:
    futures.wait([job.future for job in BACKGROUND_JOBS.values() if job.future is not None])


def start_smoke(profiler_logdir: Path) -> SmokeStarted:
    out = profiler_logdir / "smoke"
    stdout, stderr = (profiler_logdir.with_name(f"smoke_{name}.log") for name in ("out", "err"))
    with open(stdout, "w") as out_file, open(stderr, "w") as err_file:  # files: a pipe can fill
        process = subprocess.Popen(
            [*BACKGROUND_NICE, str(ROOT / "scripts" / "run_demos.sh"), "--smoke", "--device",
             "cpu", "--jobs", str(SMOKE_JOBS), "--out", str(out)], cwd=ROOT, stdout=out_file,
            stderr=err_file, start_new_session=True)  # its own process group: its scripts too
    return SmokeStarted(out, process, stdout, stderr,
                        deadline=time.monotonic() + RUN_DEMOS_TIMEOUT_S)


def stop_smoke(started: SmokeStarted) -> None:
    """The smoke run, whole, and the TensorBoard started after it."""
    if started.process.poll() is None:
        os.killpg(started.process.pid, signal.SIGKILL)
        started.process.wait()
    if started.tensorboard is not None:
        stop_tensorboard(started.tensorboard)


def stop_smoke_on_sigterm(started: SmokeStarted):
    """SIGTERM (a CI timeout, a kill) ends pytest without its teardown, and the smoke run, in a
    process group of its own, would outlive it: stop it first, then end as SIGTERM ends us.
    Returns the handler it replaced, to put back."""
    previous = signal.getsignal(signal.SIGTERM)

    def stop_then_end(signum, frame) -> None:
        stop_smoke(started)
        signal.signal(signal.SIGTERM, previous)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop_then_end)
    return previous


@pytest.fixture(scope="session", autouse=True)
def smoke_started(request, profiler_logdir):
    """./scripts/run_demos.sh --smoke --device cpu --jobs 2, started in the background when a
    selected test reads it (None otherwise, and under pytest-xdist, whose every worker would start
    one: demos_smoke starts it there); stopped, whole, with the TensorBoard started after it
    (pytest_runtest_logfinish), when the session ends."""
    if (os.environ.get("PYTEST_XDIST_WORKER")
            or not any("demos_smoke" in item.fixturenames for item in request.session.items)):
        yield None
        return
    started = start_smoke(profiler_logdir)
    previous = stop_smoke_on_sigterm(started)
    SMOKE_IN_THE_BACKGROUND.append(started)
    try:
        yield started
    finally:
        SMOKE_IN_THE_BACKGROUND.clear()
        stop_background_jobs()
        signal.signal(signal.SIGTERM, previous)
        stop_smoke(started)


SMOKE_IN_THE_BACKGROUND: list[SmokeStarted] = []  # smoke_started's, while the session runs


def pytest_runtest_logfinish(nodeid, location) -> None:
    """After each test: once the background smoke run has succeeded, TensorBoard starts over the
    logdir, so that the plugin loads the smoke runs beside the tests still to run, on a core the
    smoke run no longer needs, not after them (about 2 minutes of 2 cores)."""
    for started in SMOKE_IN_THE_BACKGROUND:
        if started.followed_up or started.process.poll() != 0:
            continue
        started.followed_up = True
        try:  # an error here would end the session (INTERNALERROR): the tests that need it fail
            if started.tensorboard is None and "tensorboard" in SELECTED_FIXTURES:
                started.tensorboard = start_tensorboard(started.out.parent)
            if "workers_cpu_out" in SELECTED_FIXTURES:  # bad has no workers: a job, the last
                logdir = started.out.parent
                background_job("workers_cpu_out", lambda _: run_workers_cpu_preset("bad", logdir))
            start_background_jobs(started.out.parent.parent)  # the session's temporary root
        except Exception as error:  # noqa: BLE001 - reported by the fixtures that read it
            started.follow_up_error = f"after the smoke run: {type(error).__name__}: {error}"


def smoke_ended(started: SmokeStarted) -> bool:
    """Waits until the smoke run has ended (True) or its deadline has passed (False)."""
    try:
        started.process.wait(timeout=max(0.0, started.deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def wait_for_smoke(started: SmokeStarted | None) -> None:
    """Until the smoke run has ended; a hung one is stopped and fails the test at its deadline."""
    if started is not None and not smoke_ended(started):
        stop_smoke(started)
        pytest.fail(f"the smoke run_demos.sh ran past {RUN_DEMOS_TIMEOUT_S} s: "
                    f"{started.stdout.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def demos_smoke(profiler_logdir, smoke_started) -> SmokeRuns:
    """./scripts/run_demos.sh --smoke --device cpu --jobs 2: every demo there is, as a user runs
    it."""
    started = smoke_started or start_smoke(profiler_logdir)
    wait_for_smoke(started)
    stdout = started.stdout.read_text()
    assert started.process.returncode == 0, stdout[-3000:] + started.stderr.read_text()[-3000:]
    # Its progress lines read "=== [3/12] <demo>/<variant> (41 s elapsed)".
    ran = {line.split()[2] for line in stdout.splitlines() if line.startswith("=== [")}
    return SmokeRuns(out=started.out, ran=ran)


@pytest.fixture
def after_the_smoke_run(smoke_started) -> None:
    """For a test that compiles what a smoke script compiled: it runs late and waits for the
    smoke run, where the session has one, so that Inductor's cache holds the graphs and the test
    only looks them up; in a session without one, or past a hung one's deadline (the tests that
    read the smoke run fail on it), it compiles them itself."""
    if smoke_started is not None:
        smoke_ended(smoke_started)


@pytest.fixture(scope="session")
def demos_smoke_out(demos_smoke) -> Path:
    """The output root of the smoke run_demos.sh above (traces, summaries, the report)."""
    return demos_smoke.out


@pytest.fixture(scope="session")
def workers_smoke_out(demos_smoke) -> Path:
    """The dataloader_workers pair with --smoke --device cpu: the smoke run_demos.sh above ran it,
    so the tests that read it do not run the two scripts again."""
    assert {"dataloader_workers/bad", "dataloader_workers/fixed"} <= demos_smoke.ran
    return demos_smoke.out


def run_workers_cpu_preset(variant: str, profiler_logdir: Path) -> subprocess.CompletedProcess:
    return run_demo("dataloader_workers", variant, *WORKERS_CPU_PRESET_ARGS,
                    "--out", str(profiler_logdir / "cpu_preset"))


@pytest.fixture(scope="session")
def workers_cpu_out(profiler_logdir, smoke_started) -> Path:
    """The dataloader_workers pair at the CPU preset's sizes (see WORKERS_CPU_PRESET_ARGS) under
    profiler_logdir/cpu_preset. Bad, which has no workers, runs as the last background job after
    the smoke run (pytest_runtest_logfinish), beside the late tests; fixed once the smoke run,
    the plugin's load and every background job have ended: its workers have the cores."""
    wait_for_smoke(smoke_started)
    if smoke_started is not None and smoke_started.follow_up_error:
        pytest.fail(smoke_started.follow_up_error)
    if smoke_started is not None and smoke_started.tensorboard is not None:
        loaded_tensorboard(smoke_started.tensorboard, profiler_logdir)  # its cores, too
    wait_for_background_jobs()
    job = BACKGROUND_JOBS.get("workers_cpu_out")  # registered once a smoke run has ended
    if job and job.future:
        bad = job.future.result()
    else:
        bad = run_workers_cpu_preset("bad", profiler_logdir)
    fixed = run_workers_cpu_preset("fixed", profiler_logdir)
    for result in (bad, fixed):
        assert result.returncode == 0, result.stdout + result.stderr
    return profiler_logdir / "cpu_preset"


def write_synthetic_gpu(profiler_logdir: Path) -> Path:
    """tests/synthetic_traces.py's GPU trace twice: as torch.profiler writes it, and rewritten."""
    out = profiler_logdir / "synthetic_gpu"
    as_written = out / "as_written" / "gpu_worker.1.pt.trace.json"
    as_written.parent.mkdir(parents=True, exist_ok=True)
    as_written.write_text(json.dumps(gpu_training_trace()))
    tensorboard_compat.rewrite_file(as_written, out / "rewritten" / as_written.name)
    return out


SHARED_TRACES = ROOT.parent / "shared" / "traces"  # real traces from others (its README)
# The shared GPU traces, for the plugin (test_tensorboard.py): not the CPU-only gloo rank (no GPU
# view). The plugin drops the MI250 trace's empty last step (one step where we read two: a
# difference of definition, tested on its own); the others it reads step for step as we do.
REAL_GPU_TRACES = ("a100_80gb_rank0_5steps", "a100_alexnet_no_steps", "a100_nccl_rank3_6steps",
                   "v100_nccl_rank1_6steps", "v100_rank1_instant_events_5steps",
                   "mi250_rocm_3steps")


def write_real_traces(profiler_logdir: Path) -> Path | None:
    """The shared real GPU traces, rewritten for the plugin as the harness rewrites ours, one run
    folder each under profiler_logdir/real/; None when ../shared/traces is missing."""
    if not SHARED_TRACES.is_dir():
        return None
    out = profiler_logdir / "real"
    for name in REAL_GPU_TRACES:
        tensorboard_compat.rewrite_file(SHARED_TRACES / f"{name}.json.gz",
                                        out / name / f"{name}.pt.trace.json.gz")
    return out


@dataclass
class TensorBoard:
    port: int
    runs: list[str]  # what the plugin's /runs listed once it had loaded every run

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def plugin_json(self, route: str, **query: str):
        """GET /data/plugin/pytorch_profiler/<route>?<query>, parsed."""
        url = f"{self.url}/data/plugin/pytorch_profiler/{route}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=60) as response:
            return json.loads(response.read())


# TensorBoard binds the port itself (--port 0: the system picks a free one, so no other process
# can take it between a check and the bind) and prints "TensorBoard 2.21.0 at http://HOST:PORT/".
TENSORBOARD_URL_LINE = re.compile(r"TensorBoard \S+ at http://127\.0\.0\.1:(\d+)/")


def tensorboard_port(log_path: Path) -> int | None:
    """The port TensorBoard says it listens on, once it has said it."""
    found = TENSORBOARD_URL_LINE.search(log_path.read_text(errors="replace"))
    return int(found.group(1)) if found else None


def run_folders(logdir: Path) -> set[str]:
    """Run names as the plugin gives them: every folder holding a trace, relative to the logdir."""
    return {path.parent.relative_to(logdir).as_posix() for path in logdir.rglob("*")
            if path.name.endswith(trace.TRACE_SUFFIXES)}


@dataclass
class TensorBoardStarted:
    process: subprocess.Popen
    log_path: Path  # its output: the port it says it listens on, and any error


# The plugin parses each run in a process of its own. scripts/tensorboard.sh forks them from the
# server (TORCH_PROFILER_START_METHOD), and so does the TensorBoard here: the plugin's default,
# spawn, starts a fresh Python that imports TensorBoard and the plugin for every run.
TENSORBOARD_START_METHOD = "fork"


def start_tensorboard(profiler_logdir: Path) -> TensorBoardStarted:
    """A real `tensorboard` on a free port over profiler_logdir, the synthetic and the real GPU
    traces written into it first."""
    write_synthetic_gpu(profiler_logdir)
    write_real_traces(profiler_logdir)
    log_path = profiler_logdir.with_name(f"{profiler_logdir.name}_tensorboard.log")
    with open(log_path, "w") as log:  # a file, not a pipe: a full pipe would stall TensorBoard
        process = subprocess.Popen(
            [*BACKGROUND_NICE, sys.executable, "-m", "tensorboard.main", "--logdir",
             str(profiler_logdir), "--port", "0", "--host", "127.0.0.1"], stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, TORCH_PROFILER_START_METHOD=TENSORBOARD_START_METHOD),
            start_new_session=True)  # its own process group: the plugin's loaders go with it
    return TensorBoardStarted(process, log_path)


def loaded_tensorboard(started: TensorBoardStarted, profiler_logdir: Path) -> TensorBoard:
    """The server, once the plugin has loaded every run folder profiler_logdir holds now (it
    finds a new folder within 10 s: MONITOR_RUN_REFRESH_INTERNAL_IN_SECONDS)."""
    expected = run_folders(profiler_logdir)
    server = TensorBoard(port=0, runs=[])
    deadline = time.monotonic() + TENSORBOARD_LOAD_TIMEOUT_S
    while True:
        if started.process.poll() is not None:
            pytest.fail(f"tensorboard exited: {started.log_path.read_text()[-3000:]}")
        server.port = server.port or tensorboard_port(started.log_path) or 0
        try:
            if not server.port:
                raise ConnectionError("TensorBoard has not said its port yet")
            answer = server.plugin_json("runs")
            server.runs = answer["runs"]
            if expected <= set(server.runs) and not answer["loading"]:
                return server
        except OSError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            pytest.fail(f"after {TENSORBOARD_LOAD_TIMEOUT_S} s the plugin lists "
                        f"{sorted(server.runs)}, not all of {sorted(expected)}")
        time.sleep(TENSORBOARD_POLL_S)


def stop_tensorboard(started: TensorBoardStarted) -> None:
    # SIGKILL, not SIGTERM: the server holds nothing to save, and on SIGTERM it frees every run
    # it loaded first (9 s for the smoke runs alone, 27 s at the suite's end).
    if started.process.poll() is None:
        os.killpg(started.process.pid, signal.SIGKILL)
        started.process.wait()


@pytest.fixture(scope="session")
def tensorboard(profiler_logdir, demos_smoke, workers_cpu_out, smoke_started):
    """A real `tensorboard` over profiler_logdir, once the plugin has loaded every run in it:
    the one started after the background smoke run, or one of its own."""
    if smoke_started is not None and smoke_started.follow_up_error:
        pytest.fail(smoke_started.follow_up_error)
    if smoke_started is not None:  # smoke_started stops it
        if smoke_started.tensorboard is None:  # not yet: started here, and not again after
            smoke_started.tensorboard = start_tensorboard(profiler_logdir)
        yield loaded_tensorboard(smoke_started.tensorboard, profiler_logdir)
        return
    started = start_tensorboard(profiler_logdir)
    try:
        yield loaded_tensorboard(started, profiler_logdir)
    finally:
        stop_tensorboard(started)


# --- Bad-vs-fixed pairs built from synthetic GPU traces (test_compare.py, test_report.py) ---

@pytest.fixture(scope="session")
def synthetic_pairs_out(tmp_path_factory) -> Path:
    """Two pairs as the demo scripts would leave them on a GPU, from tests/kineto_builder.py:
    small_batch (bad: short kernels, GPU 37 % busy; fixed: healthy) and activation_checkpointing
    (bad: peak memory at 90 % of the GPU; fixed: 30 %)."""
    from tests.kineto_builder import (H100_MEMORY_BYTES, MB, KinetoTrace, simulate_training,
                                      write_demo_run)

    def gpu_trace(**options) -> KinetoTrace:
        built = KinetoTrace()
        built.gpu()
        return simulate_training(built, **options)

    out = tmp_path_factory.mktemp("synthetic_pairs")
    write_demo_run(out, "small_batch", "bad",
                   gpu_trace(kernel_us=15, launch_gap_us=40, kernels_per_step=100, input_batch=8),
                   samples_per_s=1000.0, peak_memory_mb=2000.0, batch_size=8)
    write_demo_run(out, "small_batch", "fixed", gpu_trace(), samples_per_s=5300.0,
                   peak_memory_mb=8000.0, batch_size=256)
    for variant, share, samples_per_s in (("bad", 0.9, 400.0), ("fixed", 0.3, 320.0)):
        peak = int(share * H100_MEMORY_BYTES)
        write_demo_run(out, "activation_checkpointing", variant,
                       gpu_trace(peak_memory_bytes=peak, backward=True),
                       samples_per_s=samples_per_s, peak_memory_mb=peak / MB)
    return out
