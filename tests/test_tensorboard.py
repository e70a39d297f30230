"""End to end through TensorBoard and the torch-tb-profiler plugin's HTTP API."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

PLUGIN = "/data/plugin/pytorch_profiler"
STARTUP_TIMEOUT_S = 120  # TensorBoard imports and parses traces in the background; 2 cores are slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(port: int, path: str, **query: str):
    url = f"http://127.0.0.1:{port}{PLUGIN}/{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture
def tensorboard(workers_smoke_out):
    port = free_port()
    tensorboard_bin = Path(sys.executable).with_name("tensorboard")
    process = subprocess.Popen(
        [str(tensorboard_bin), "--logdir", str(workers_smoke_out), "--port", str(port),
         "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    yield port, process
    process.terminate()
    process.wait(timeout=30)


def wait_for_runs(port: int, process: subprocess.Popen, expected: set[str]) -> list[str]:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    runs: list[str] = []
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"tensorboard exited: {process.stderr.read()[-2000:]}")
        try:
            answer = get_json(port, "runs")
            runs = answer["runs"]
            if expected <= set(runs) and not answer.get("loading"):
                return runs
        except OSError:
            pass  # not listening yet
        time.sleep(1)
    pytest.fail(f"runs {sorted(expected)} not listed after {STARTUP_TIMEOUT_S} s (saw {runs})")


def test_plugin_lists_both_runs_and_answers_the_overview(tensorboard):
    port, process = tensorboard
    runs = {"dataloader_workers/bad", "dataloader_workers/fixed"}
    wait_for_runs(port, process, runs)
    for run in sorted(runs):
        assert "Overview" in get_json(port, "views", run=run)
        workers = get_json(port, "workers", run=run, view="Overview")
        assert len(workers) == 1  # one trace per run directory
        spans = get_json(port, "spans", run=run, worker=workers[0])
        overview = get_json(port, "overview", run=run, worker=workers[0], span=spans[0])
        step_rows = overview["steps"]["rows"]
        assert len(step_rows) == 3  # the three recorded steps
        average = overview["performance"][0]
        assert average["name"] == "Average Step Time" and average["value"] > 0
