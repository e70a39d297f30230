"""Shared fixtures: smoke runs of the demos (subprocesses, as a user runs them)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO_RUN_TIMEOUT_S = 300  # a smoke run takes seconds; this only stops a hung run


def run_demo(demo: str, variant: str, *args: str) -> subprocess.CompletedProcess:
    script = ROOT / "demos" / demo / f"{variant}.py"
    return subprocess.run([sys.executable, str(script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=DEMO_RUN_TIMEOUT_S)


def read_summary(out: Path, demo: str, variant: str) -> dict:
    return json.loads((out / demo / variant / "summary.json").read_text())


@pytest.fixture(scope="session")
def workers_smoke_out(tmp_path_factory) -> Path:
    """Both dataloader_workers scripts run once with --smoke --device cpu into one output root."""
    out = tmp_path_factory.mktemp("traces")
    for variant in ("bad", "fixed"):
        result = run_demo("dataloader_workers", variant, "--smoke", "--device", "cpu", "--out", str(out))
        assert result.returncode == 0, result.stdout + result.stderr
    return out
