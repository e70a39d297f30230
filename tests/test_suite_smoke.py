"""The suite's own background smoke run (tests/conftest.py): a SIGTERM to pytest stops it too,
where pytest's teardown, which SIGTERM skips, would have."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import ROOT

CHILD_TIMEOUT_S = 60  # the child ends in about a second; this only stops a hang
GONE_WITHIN_S = 10  # a SIGKILLed process group is reaped within this


# A stand-in for pytest: it starts a long "smoke run" in a process group of its own, as
# start_smoke does, installs the handler, prints the run's pid, and is sent SIGTERM.
CHILD = """
import os, signal, subprocess, sys, time
from pathlib import Path
from tests.conftest import SmokeStarted, stop_smoke_on_sigterm
process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                           start_new_session=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)  # our pipes close when we end
stop_smoke_on_sigterm(SmokeStarted(Path("."), process, Path("o"), Path("e"), deadline=0.0))
print(process.pid, flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
print("still alive", flush=True)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sigterm_to_pytest_stops_the_smoke_run_and_still_ends_pytest():
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, check=False,
                          text=True, timeout=CHILD_TIMEOUT_S,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == -signal.SIGTERM, done.stderr  # it ended as SIGTERM ends it
    assert "still alive" not in done.stdout
    smoke_pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + GONE_WITHIN_S
    while alive(smoke_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(smoke_pid)
