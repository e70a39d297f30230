"""Stopping what a process started. By default SIGTERM (a `kill`, a CI job's timeout, a job
scheduler) ends a Python process at once, skipping its `finally` blocks: the processes it
started run on as orphans (on a GPU, holding its memory), and what it was writing to a
temporary place stays there. Such a process runs under sigterm_raises: SIGTERM then raises
Terminated where the process is, as Ctrl-C raises KeyboardInterrupt, so that the blocks it
unwinds stop what it started and remove what it wrote; then the process ends as SIGTERM would
have ended it. Imports no torch."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

# After SIGTERM, what a started process gets to exit before SIGKILL: a demo script dies at once,
# torchrun takes a few seconds to stop its ranks.
STOP_GRACE_S = 10
# What stop() sends, in turn, waiting up to STOP_GRACE_S after each for the process to end.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGKILL)
# After Ctrl-C, which a terminal sends to the whole process group, so a started process has it
# too: a wait first (None sends nothing), so that no SIGTERM cuts into the `finally` blocks it
# runs as it unwinds, as a profiled step's that removes its staging folder.
AFTER_CTRL_C = (None, *STOP_SIGNALS)


class Terminated(BaseException):
    """SIGTERM, raised by sigterm_raises. A BaseException, as KeyboardInterrupt is: `except
    Exception` does not swallow it."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside the block, SIGTERM raises Terminated. One that ends the block is sent again, after
    the `finally` blocks it unwound, to what handled SIGTERM before: by default that ends the
    process as SIGTERM ends it (exit status -15, 143 in a shell); a handler of its own (pytest's,
    an outer block's) runs as if this block were not there. In another thread than the main
    one, SIGTERM stays as it is: Python runs signal handlers in the main thread only."""
    def raise_terminated(signum, frame) -> None:
        raise Terminated

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    if previous is None:  # a handler not set from Python: SIGTERM's own action stands for it
        previous = signal.SIG_DFL
    try:
        yield
    except Terminated:
        sys.stdout.flush()  # the default action ends the process without writing its buffers
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, previous)
        signal.raise_signal(signal.SIGTERM)  # a Python handler runs before this returns
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop(process: subprocess.Popen, group: bool = False,
         signals: tuple[signal.Signals | None, ...] = STOP_SIGNALS) -> None:
    """SIGTERM to `process` (to its process group, with `group`: a job in a session of its own),
    then, after STOP_GRACE_S, SIGKILL to whatever of it is left; or `signals` in turn
    (AFTER_CTRL_C waits first). Reads its pipes while it waits, so that no full pipe blocks it."""
    for sig in signals:
        if sig is not None:  # None: a wait only
            try:
                if group:
                    os.killpg(process.pid, sig)  # a member may outlive the group's leader
                else:
                    process.send_signal(sig)  # nothing, once it has ended and been waited for
            except ProcessLookupError:  # it has ended, the whole group with it
                break
        try:
            process.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
