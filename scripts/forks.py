"""Run demo scripts in forks of one process that imported torch once (run_demos.py starts it for a
smoke run on the CPU: the imports are most of a smoke script's time, 7.8 of 13 s on 2 cores).

    python scripts/forks.py REPLIES_FD

This process is fresh: it imports PRELOADED_MODULES and nothing of its caller's, so a fork holds
what `python <script>` would hold after its imports, exit handlers included. Each line on stdin
asks for one script, as JSON: {"id": 3, "command": ["demos/x/bad.py", "--smoke", ...],
"cwd": "/repo", "log": "/tmp/3.log" or null (the console)}, and may add "stderr": a file for its
standard error apart from the log, and "timeout_s": seconds after which SIGALRM ends the fork (a
hung script). Each fork runs its script as __main__ and ends as the interpreter would
(threads joined, exit handlers run, the exit code of sys.exit, 1 after an error's traceback, as
SIGINT ends a process after Ctrl-C); "<id> <exit code>" is written to REPLIES_FD when it has
ended. At the end of stdin, this process waits for its forks and exits. On SIGTERM it stops
its forks (SIGTERM, then SIGKILL after stopping.STOP_GRACE_S) and ends as SIGTERM ends it; on
Ctrl-C, which its forks have too, it gives them that time to end on it before it stops them.
"""
from __future__ import annotations

import atexit
import importlib
import json
import math
import os
import runpy
import select
import signal
import sys
import threading
import time
import traceback

from common import stopping

# What a script imports before its first step: torch, torchvision, and torch._dynamo, which an
# optimizer's constructor pulls in.
PRELOADED_MODULES = ("torch", "torchvision", "torch._dynamo", "common.harness", "common.data",
                     "common.models")
POLL_S = 0.05  # how often this process looks for a fork that has ended


def exit_code(code: object) -> int:
    """What the interpreter exits with after sys.exit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def write_to(path: str, *fds: int) -> None:
    """Point the file descriptors `fds` at the file `path`, made anew."""
    opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd in fds:
        os.dup2(opened, fd)
    os.close(opened)


def run_script(command: list[str], cwd: str, log: str | None, stderr: str | None = None,
               timeout_s: float | None = None) -> int:
    """In the fork: run `python <command>` here, from `cwd`, its output to `log` (or the
    console) and its standard error there too, or to `stderr`; its exit code (minus the
    signal's number for one that is to end it, as waitstatus_to_exitcode gives it). Past
    `timeout_s`, SIGALRM ends it (its default action: the script installs no handler of its
    own)."""
    nothing = os.open(os.devnull, os.O_RDONLY)  # not this process's stdin: the requests
    os.dup2(nothing, 0)
    os.close(nothing)
    if log is not None:
        write_to(log, 1, 2)
    if stderr is not None:
        write_to(stderr, 2)
    if timeout_s is not None:
        signal.alarm(max(1, math.ceil(timeout_s)))  # alarm() counts whole seconds
    os.chdir(cwd)
    sys.argv = list(command)
    # What a script restarts itself with (os.execv, as --compile-log does): `python <command>`,
    # not this process's own command line.
    sys.orig_argv = [sys.executable, *command]
    sys.path[0] = os.path.dirname(os.path.abspath(command[0]))  # as for `python <script>`
    code = 1
    try:
        runpy.run_path(command[0], run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = exit_code(stop.code)
    except BaseException as error:  # noqa: BLE001 - as the interpreter ends on an error:
        try:
            sys.excepthook(type(error), error, error.__traceback__)  # the script's, if it set one
        except BaseException as failed:  # noqa: BLE001 - a hook that fails, as Python says it
            print("Error in sys.excepthook:", file=sys.stderr)
            # from the hook's frame on, without the error it was handling (printed next)
            traceback.print_exception(type(failed), failed, failed.__traceback__.tb_next,
                                      chain=False)
            print("\nOriginal exception was:", file=sys.stderr)
            traceback.print_exception(error)
        if type(error) is KeyboardInterrupt:  # then as SIGINT ends a process (a subclass: exit 1)
            code = -signal.SIGINT
    threading._shutdown()  # joins non-daemon threads, as at exit (multiprocessing does too)
    atexit._run_exitfuncs()
    return code


def fork(request: dict, replies_fd: int) -> int:
    """Start one fork for `request`; its pid."""
    sys.stdout.flush()  # else the fork writes this process's buffered lines a second time
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        # SIGTERM ends the script at once, as it ends `python <script>`, not through this
        # process's handler (which stops the forks); serve blocked it across the fork.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.close(replies_fd)
        code = run_script(request["command"], request["cwd"], request["log"],
                          request.get("stderr"), request.get("timeout_s"))
    except BaseException:  # noqa: BLE001 - a fork that could not start its script says why
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if code < 0:  # ended by a signal: its default action
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(128 - code if code < 0 else code)  # the shell's status, as Python falls back to


def serve(replies_fd: int, running: dict[int, int]) -> None:
    """Fork a script for each request, until the end of stdin; `running` holds each fork's pid
    and request id until it has ended and been replied for."""
    for name in PRELOADED_MODULES:
        importlib.import_module(name)
    import torch

    if torch.cuda.is_initialized():  # a fork cannot use CUDA its parent initialized
        sys.exit("forks.py: an import initialized CUDA; the scripts cannot run in forks")
    requests, pending = sys.stdin.buffer, b""
    while True:
        readable, _, _ = select.select([requests], [], [], POLL_S)
        if readable:
            chunk = os.read(requests.fileno(), 65536)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in filter(None, lines):
                request = json.loads(line)
                # SIGTERM held back until the fork is in `running`, so that stop_forks sees it
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
                running[fork(request, replies_fd)] = request["id"]
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        reap(running, replies_fd, block=False)
    while running:
        reap(running, replies_fd, block=True)


def stop_forks(running: dict[int, int], replies_fd: int,
               signals: tuple[signal.Signals | None, ...] = stopping.STOP_SIGNALS) -> None:
    """SIGTERM to every running fork, then, after STOP_GRACE_S, SIGKILL to those left; or
    `signals` in turn (stopping.AFTER_CTRL_C waits first); each reaped and replied for. A SIGTERM
    meanwhile (run_demos.py's, after its own Ctrl-C) asks for this very stop: it is held back
    until the end, so that it cannot cut the stop short and leave a fork without its parent."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    for sig in signals:
        if sig is not None:  # None: a wait only
            for pid in running:
                os.kill(pid, sig)
        deadline = time.monotonic() + stopping.STOP_GRACE_S
        while running and time.monotonic() < deadline:
            reap(running, replies_fd, block=False)
            time.sleep(POLL_S)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # one held back acts now


def reap(running: dict[int, int], replies_fd: int, block: bool) -> None:
    """Reply for each fork that has ended (waiting for one, with `block`)."""
    while running:
        pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        if not pid:
            return
        reply = f"{running.pop(pid)} {os.waitstatus_to_exitcode(status)}\n".encode()
        try:
            os.write(replies_fd, reply)
        except BrokenPipeError:
            pass  # run_demos.py has gone; the other forks still end and are reaped
        block = False


if __name__ == "__main__":
    forks: dict[int, int] = {}  # pid -> request id, while it runs
    try:
        with stopping.sigterm_raises():
            try:
                serve(int(sys.argv[1]), forks)
            except stopping.Terminated:
                stop_forks(forks, int(sys.argv[1]))
                raise
            except KeyboardInterrupt:  # the forks have it too (one process group): wait for them
                stop_forks(forks, int(sys.argv[1]), stopping.AFTER_CTRL_C)
                raise
    except KeyboardInterrupt:  # no traceback
        sys.exit(130)
