"""Run the bad and the fixed script of each demo, then compare them and write the report
(<out>/REPORT.md and a self-contained <out>/report.html, rebuilt from this run only). A ladder
runs its rungs in order (rung0_baseline.py, rung1_workers.py, ...) and prints its waterfall; the
memory ladder prints which rungs fit its memory budget (a rung over it on a GPU stops at the cap
and leaves a record of it: that is its result, not a failure).

Examples:
  ./scripts/run_demos.sh                          every demo, on the GPU if there is one
  ./scripts/run_demos.sh dataloader_workers --device cpu
  ./scripts/run_demos.sh --smoke                  tiny sizes: checks that everything runs
  PYTHON=python3 ./scripts/run_demos.sh --device cuda --out traces/h100
                                                  a python that has PyTorch already, no .venv

traces/reference/ holds the committed reference runs: --out there is refused unless
--update-reference says that replacing them is the point (traces/reference/README.md).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from common import compare, ladder, report, stopping, trace

ROOT = Path(__file__).resolve().parents[1]
DEMOS_DIR = ROOT / "demos"
REFERENCE_DIR = ROOT / "traces" / "reference"  # committed runs: written only on purpose
VARIANTS = compare.VARIANTS
POLL_S = 0.05  # how often a run looks for a script that has ended


def available_demos() -> list[str]:
    """The pairs (a bad.py and a fixed.py) and the ladders (rung scripts) under demos/."""
    return sorted(d.name for d in DEMOS_DIR.iterdir()
                  if all((d / f"{variant}.py").is_file() for variant in VARIANTS)
                  or len(rungs_of(d.name)) >= 2)


def rungs_of(demo: str) -> list[str]:
    """A ladder's rung scripts (rung<K>_<fix>.py) by K; [] for a pair."""
    found = [(int(match.group(1)), path.stem) for path in (DEMOS_DIR / demo).glob("rung*.py")
             if (match := ladder.RUNG_FOLDER.match(path.stem))]
    return [stem for _, stem in sorted(found)]


def variants_of(demo: str) -> list[str]:
    return rungs_of(demo) or list(VARIANTS)


def parse_flags(argv: list[str] | None = None) -> argparse.Namespace:
    demos = available_demos()
    parser = trace.OneLineArgumentParser(  # a bad flag or demo name: one line, exit code 2
        prog="run_demos.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Demos: {', '.join(demos)}.")
    parser.add_argument("demos", nargs="*", metavar="DEMO", help="demos to run (default: all)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="passed to every script (default: auto)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes and few steps; with --device cpu the scripts run in "
                             "forks of one process that imported torch once (scripts/forks.py)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps, passed to every script (default: each preset's)")
    parser.add_argument("--recorded-steps", type=int, default=None, metavar="N",
                        help="steps each profiler records, passed to every script in place of "
                             "each preset's (memory_leak's 24, llm_decode's 1 on a GPU, whose "
                             "trace is slow to write; default: 3 or the preset's, or a round "
                             "of the DataLoader's workers where a few timed steps in a row "
                             "stand off the data wait)")
    parser.add_argument("--seed", type=int, default=None,
                        help="random seed, passed to every script (default: 0)")
    parser.add_argument("--memory-budget-gb", type=float, default=None, metavar="GB",
                        help="passed to every script: the memory a run may use (default: each "
                             "preset's, which only memory_ladder has)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="with --smoke: N scripts at once, each one's output printed when it "
                             "ends (default: 1; a timed run never shares the cores)")
    parser.add_argument("--with-stack", action="store_true",
                        help="passed to every script: record Python frames in the traces")
    parser.add_argument("--out", type=Path, default=ROOT / "traces",
                        help="output root (default: traces/)")
    parser.add_argument("--update-reference", action="store_true",
                        help="allow --out inside traces/reference/ (replaces committed runs)")
    flags = parser.parse_args(argv)
    for name, value in (("--steps", flags.steps), ("--recorded-steps", flags.recorded_steps)):
        if value is not None and value < 1:
            parser.error(f"{name} must be a whole number >= 1, got {value}")
    if flags.jobs < 1:
        parser.error(f"--jobs must be a whole number >= 1, got {flags.jobs}")
    if flags.jobs > 1 and not flags.smoke:
        parser.error("--jobs above 1 needs --smoke: scripts run at once share the cores, and "
                     "their timings would not be their own")
    if flags.memory_budget_gb is not None and not flags.memory_budget_gb > 0:
        parser.error(f"--memory-budget-gb must be a number > 0, got {flags.memory_budget_gb}")
    if flags.out.resolve().is_relative_to(REFERENCE_DIR) and not flags.update_reference:
        parser.error(f"--out {flags.out} is inside traces/reference/, the committed reference "
                     f"runs; write to traces/<your_gpu> instead, or add --update-reference to "
                     f"replace them on purpose")
    unknown = [name for name in flags.demos if name not in demos]
    if unknown:
        parser.error(f"unknown demo {', '.join(map(repr, unknown))}; choose from: {', '.join(demos)}")
    flags.demos = flags.demos or demos
    flags.out = flags.out.resolve()  # relative to where the user stands, not the repository root
    return flags


def script_command(demo: str, variant: str, flags: argparse.Namespace) -> list[str]:
    """The script and the flags it is run with: the same for a fresh process and a fork."""
    command = [str(DEMOS_DIR / demo / f"{variant}.py"), "--device", flags.device,
               "--out", str(flags.out)] + (["--smoke"] if flags.smoke else [])
    command += ["--with-stack"] if flags.with_stack else []
    command += [arg for flag, value in (("--steps", flags.steps),
                                        ("--recorded-steps", flags.recorded_steps),
                                        ("--seed", flags.seed),
                                        ("--memory-budget-gb", flags.memory_budget_gb))
                if value is not None for arg in (flag, str(value))]
    return command


def forks_scripts(flags: argparse.Namespace) -> bool:
    """Whether the scripts run in forks of one process that imported torch once (scripts/
    forks.py): a smoke run on the CPU only. A timed run starts each script afresh, so that its
    process and its memory are its own (the memory ladder's CPU fit reads the peak resident
    memory), and so does a run that may use CUDA, which works in a fork only where the parent
    never touched it."""
    return flags.smoke and flags.device == "cpu"


@dataclass
class Forks:
    """scripts/forks.py, started for this run: the scripts' exit codes as it replies them."""
    process: subprocess.Popen
    replies_fd: int
    ended: dict[int, int] = field(default_factory=dict)  # request id -> exit code
    unread: bytes = b""
    asked: int = 0

    def start(self, command: list[str], log: Path | None, stderr: Path | None = None,
              timeout_s: float | None = None) -> Callable[[], int | None]:
        """Ask for one script (forks.py: `stderr` apart from `log`, if given; ended by SIGALRM
        past `timeout_s`); returns its poll, as start_script's."""
        request = {"id": self.asked, "command": command, "cwd": str(ROOT),
                   "log": None if log is None else str(log),
                   "stderr": None if stderr is None else str(stderr), "timeout_s": timeout_s}
        self.asked += 1
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        return lambda: self.exit_code(request["id"])

    def exit_code(self, request_id: int) -> int | None:
        while select.select([self.replies_fd], [], [], 0)[0]:
            chunk = os.read(self.replies_fd, 65536)
            if not chunk:
                break
            *lines, self.unread = (self.unread + chunk).split(b"\n")
            for line in filter(None, lines):
                replied_id, code = map(int, line.split())
                self.ended[replied_id] = code
        if request_id not in self.ended and self.process.poll() is not None:
            raise RuntimeError(f"scripts/forks.py ended (exit code {self.process.returncode}) "
                               f"before script {request_id} did; its error is above")
        return self.ended.get(request_id)

    def close(self) -> None:
        self.process.stdin.close()  # the end of its requests: it waits for its forks and exits
        self.process.wait()
        os.close(self.replies_fd)

    def stop(self, after_ctrl_c: bool = False) -> None:
        """Stop it and its forks (forks.py ends them on SIGTERM); close() then returns at once.
        After Ctrl-C, which forks.py has too, it stops its forks itself in the steps of
        stopping.AFTER_CTRL_C, holding a SIGTERM back meanwhile; a SIGKILL in the middle would
        leave its forks without it. So: a wait one step longer than its stop, then SIGKILL."""
        outlast_its_stop = (None,) * len(stopping.AFTER_CTRL_C) + (signal.SIGKILL,)
        stopping.stop(self.process,
                      signals=outlast_its_stop if after_ctrl_c else stopping.STOP_SIGNALS)


def start_forks(env: dict[str, str] | None = None) -> Forks:
    """scripts/forks.py, under `env` (this process's environment if None)."""
    replies_fd, reply_end = os.pipe()
    process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("forks.py")),
                                str(reply_end)], stdin=subprocess.PIPE, pass_fds=[reply_end],
                               env=env)
    os.close(reply_end)
    return Forks(process, replies_fd)


def start_script(command: list[str], forks: Forks | None, log: Path | None,
                 processes: list[subprocess.Popen]) -> Callable[[], int | None]:
    """Start one script, in a fork of `forks` or in a process of its own (added to
    `processes`), its output to `log` (or the console); returns its poll: its exit code once it
    has ended, None while it runs."""
    if forks is not None:
        return forks.start(command, log)
    if log is None:
        processes.append(subprocess.Popen([sys.executable, *command], cwd=ROOT))
    else:
        with open(log, "w") as output:  # the script has its own copy of the file
            processes.append(subprocess.Popen([sys.executable, *command], cwd=ROOT,
                                              stdout=output, stderr=subprocess.STDOUT))
    return processes[-1].poll


def stop_scripts(processes: list[subprocess.Popen], forks: Forks | None,
                 after_ctrl_c: bool = False) -> None:
    """Stop every script still running (SIGTERM, then SIGKILL after stopping.STOP_GRACE_S):
    a run that ends early (SIGTERM, Ctrl-C, an error) leaves none behind. After Ctrl-C, which
    reached the scripts too, they get that time to end on it first (stopping.AFTER_CTRL_C)."""
    running = [process for process in processes if process.poll() is None]
    if forks is not None and forks.process.poll() is None:
        forks.stop(after_ctrl_c)
    for process in running:
        stopping.stop(process, signals=stopping.AFTER_CTRL_C if after_ctrl_c
                      else stopping.STOP_SIGNALS)


def succeeded(demo: str, variant: str, returncode: int, started: datetime,
              flags: argparse.Namespace) -> bool:
    """Whether the script that started at `started` succeeded. A rung over its memory budget on
    a GPU stops at the cap (exit code 2) and leaves a record of it, this run's: the memory
    ladder's result for that rung, not a failure."""
    record = flags.out / demo / variant / trace.OUT_OF_MEMORY_FILE
    over_budget = (record.is_file()
                   and (report.created(json.loads(record.read_text())) or started) >= started)
    return returncode == 0 or (returncode == 2 and over_budget)


def now_whole_s() -> datetime:
    """Now, in whole seconds as a summary's created_utc is: when a script starts, for
    succeeded() to tell this run's out-of-memory record from an earlier one's."""
    return datetime.now(timezone.utc).replace(microsecond=0)


def run_variant(demo: str, variant: str, flags: argparse.Namespace, forks: Forks | None,
                processes: list[subprocess.Popen]) -> bool:
    """Run one script (in a fork of `forks`, if given, else added to `processes`), its output
    to the console; whether it succeeded."""
    began = now_whole_s()
    poll = start_script(script_command(demo, variant, flags), forks, None, processes)
    while (code := poll()) is None:
        time.sleep(POLL_S)
    return succeeded(demo, variant, code, began, flags)


def next_to_start(runs: list[tuple[str, str]], waiting: list[int],
                  running: Iterable[int]) -> int | None:
    """The first of the `waiting` runs (indices into `runs`) that may start beside the `running`
    ones: any but a script of a ladder with one of its rungs running (a ladder's scripts are all
    rungs). A ladder's rungs run one at a time: its compiled rungs compile the same model, and
    each after the first finds the compile cache the one before wrote (on a 2-core EPYC, rung 5
    compiled beside rung 4 in 48 CPU-s, rung 6 after them in 15)."""
    climbing = {runs[index][0] for index in running if ladder.RUNG_FOLDER.match(runs[index][1])}
    return next((index for index in waiting if runs[index][0] not in climbing), None)


def run_scripts(runs: list[tuple[str, str]], flags: argparse.Namespace):
    """Run each (demo, variant) in order, or flags.jobs of them at once (a ladder's rungs one at
    a time: next_to_start); yield (succeeded, demo, variant) as each is printed, in order. A
    header line starts each script's output: "=== [3/12] <demo>/<variant> (41 s elapsed)"."""
    started = time.perf_counter()

    def header(index: int, demo: str, variant: str, stopped: str = "") -> None:
        print(f"\n=== [{index}/{len(runs)}] {demo}/{variant} ({stopped}"
              f"{time.perf_counter() - started:.0f} s elapsed)", flush=True)

    def print_log(index: int) -> None:
        log = logs / f"{index}.log"  # none if the script failed before it started
        print(log.read_text(errors="replace") if log.is_file() else "", end="", flush=True)

    forks = start_forks() if forks_scripts(flags) else None
    processes: list[subprocess.Popen] = []  # the scripts started in processes of their own
    logs = None
    running: dict[int, tuple[Callable[[], int | None], datetime]] = {}
    waiting, printed = list(range(len(runs))), 0  # printed: the logs shown, in order
    try:
        if flags.jobs == 1:
            for index, (demo, variant) in enumerate(runs, start=1):
                header(index, demo, variant)
                yield run_variant(demo, variant, flags, forks, processes), demo, variant
            return
        # Several at once, each one's output into a file, printed whole when it ends, in order.
        logs = Path(tempfile.mkdtemp(prefix="run_demos_"))
        ended: dict[int, bool] = {}
        for printing, (demo, variant) in enumerate(runs):
            while printing not in ended:
                while (len(running) < flags.jobs
                       and (index := next_to_start(runs, waiting, running)) is not None):
                    waiting.remove(index)
                    command, began = script_command(*runs[index], flags), now_whole_s()
                    log = logs / f"{index}.log"
                    running[index] = start_script(command, forks, log, processes), began
                for index, (poll, began) in list(running.items()):
                    if (code := poll()) is not None:
                        del running[index]
                        ended[index] = succeeded(*runs[index], code, began, flags)
                if printing not in ended:
                    time.sleep(POLL_S)
            header(printing + 1, demo, variant)
            print_log(printing)
            printed = printing + 1
            yield ended[printing], demo, variant
    except BaseException as stopped:  # SIGTERM (stopping.Terminated), Ctrl-C, an error, a close
        stop_scripts(processes, forks, after_ctrl_c=isinstance(stopped, KeyboardInterrupt))
        if logs is not None:  # the output of each script started and not yet printed: where it was
            for index in [i for i in range(printed, len(runs)) if i not in waiting]:
                header(index + 1, *runs[index], stopped="stopped, " * (index in running))
                print_log(index)
        raise
    finally:
        if forks is not None:
            forks.close()
        if logs is not None:
            shutil.rmtree(logs, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    flags = parse_flags(argv)
    failed = []
    run_started = datetime.now(timezone.utc)  # the report shows no summary older than this
    started = time.perf_counter()
    runs = [(demo, variant) for demo in flags.demos for variant in variants_of(demo)]
    # closing: where this loop ends early (SIGTERM, Ctrl-C), run_scripts stops what still runs
    with contextlib.closing(run_scripts(runs, flags)) as results:
        for done, demo, variant in results:
            if not done:
                failed.append(f"{demo}/{variant}")
    failed_demos = {name.split("/")[0] for name in failed}
    pairs = [demo for demo in flags.demos if not rungs_of(demo)]
    ladders = [demo for demo in flags.demos if rungs_of(demo)]
    # The report's sections hold each pair's comparison and each ladder's waterfall: print those,
    # so no trace is read twice.
    sections = report.build_sections(flags.out, pairs, failed=failed_demos,
                                     since=run_started, ladders=ladders)
    print("\n=== comparison")
    for section in sections:
        is_ladder = section.kind in report.LADDER_KINDS
        what = report.ladder_what(section) if is_ladder else "comparison"
        if section.status == "ok":
            print("\n" + (report.ladder_text(section) if is_ladder
                          else compare.format_text(section.comparison)))
        elif section.demo in failed_demos:
            print(f"\n{section.demo}: no {what} (a run failed)")
        else:
            print(f"\n{section.demo}: no {what} ({section.reason})")
            failed.append(f"{section.demo} ({what})")
    markdown, page = report.write_report(flags.out, pairs, sections=sections)
    print(f"\nreport: {markdown} and {page} (opens offline)")
    print(f"traces and summaries under {flags.out} ({time.perf_counter() - started:.0f} s); "
          f"open them with ./scripts/tensorboard.sh or tensorboard --logdir {flags.out}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        with stopping.sigterm_raises():  # SIGTERM stops the scripts running, as Ctrl-C does
            sys.exit(main())
    except KeyboardInterrupt:
        print("\nrun_demos.sh: stopped (Ctrl-C); no script is left running", file=sys.stderr,
              flush=True)
        # Ended by SIGINT, as Python ends without this block: a shell loop around it stops too.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.raise_signal(signal.SIGINT)
