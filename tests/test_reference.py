"""The committed GPU reference runs (traces/reference/<gpu>/): each pair's verdicts, the report's
ratios, the READMEs' generated tables, the conditions and the size. Reads whatever runs are
there; skips when there are none."""
from __future__ import annotations

import ast
import functools
import inspect
import json
import re
import subprocess
import sys
import textwrap

import pytest

from common import compare, trace, verdicts
from tests.conftest import ROOT

REFERENCE = ROOT / "traces" / "reference"
REFERENCE_MAX_MB = 40  # MB (10^6 bytes) in traces/reference/<gpu>/; the reference-run issue's cap


GPUS = (sorted(d.name for d in REFERENCE.iterdir() if compare.finished_pairs(d))
        if REFERENCE.is_dir() else [])
PAIRS = [(gpu, demo) for gpu in GPUS for demo in compare.finished_pairs(REFERENCE / gpu)]
if not PAIRS:
    pytest.skip(f"no reference runs under {REFERENCE} (<gpu>/<demo>/bad and fixed with "
                f"{trace.SUMMARY_FILE}): nothing to check", allow_module_level=True)


@functools.cache  # once per session: analyzing a pair's traces takes about a second
def comparison(gpu: str, demo: str) -> dict:
    return compare.compare(REFERENCE / gpu / demo)


def verdict_demos() -> set[str]:
    """The demos the rules in verdicts.RULES name as their lesson: the `demo` argument (the last)
    of every finding(...) call in them."""
    demos = set()
    for rule in verdicts.RULES:
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(rule)))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "finding":
                demos.add(ast.literal_eval(node.args[-1]))
    return demos


@pytest.mark.parametrize(("gpu", "demo"), PAIRS)
def test_own_verdict_on_bad_only(gpu, demo):
    # A pair no rule names has no verdict to look for: padding_waste has none (no finding(...) in
    # common/verdicts.py RULES gives demo "padding_waste"), so it is skipped here, explicitly.
    if demo not in verdict_demos():
        pytest.skip(f"{demo}: no rule in common/verdicts.py RULES names it as its demo")
    c = comparison(gpu, demo)
    own = {v: [f["id"] for f in c[v]["analysis"]["findings"] if f["demo"] == demo]
           for v in compare.VARIANTS}
    every = {v: [f["id"] for f in c[v]["analysis"]["findings"]] for v in compare.VARIANTS}
    assert own["bad"], f"bad/ has no finding with demo {demo!r}; its findings: {every['bad']}"
    assert not own["fixed"], f"fixed/ still has {own['fixed']} (demo {demo!r})"


def report_ratio(report: str, demo: str, label: str) -> str:
    """The `fixed / bad` cell of the `label` row in the report's `## demo` section."""
    section = re.search(rf"^## {re.escape(demo)}\n(.*?)(?=^## |\Z)", report,
                        re.MULTILINE | re.DOTALL)
    assert section, f"REPORT.md has no section '## {demo}'"
    row = re.search(rf"^\| {re.escape(label)} \| [^|]* \| [^|]* \| ([0-9.]+)x \|$",
                    section.group(1), re.MULTILINE)
    assert row, f"REPORT.md's {demo} section has no '{label}' row with a fixed / bad ratio"
    return row.group(1)


@pytest.mark.parametrize(("gpu", "demo"), PAIRS)
def test_report_ratios_match_summaries(gpu, demo):
    c = comparison(gpu, demo)  # speedup and peak_memory_ratio: compare's, from the summaries
    report = (REFERENCE / gpu / "REPORT.md").read_text()
    for label, ratio in ((c["speedup_of"], c["speedup"]),
                         ("peak memory MB", c["peak_memory_ratio"])):
        printed = report_ratio(report, demo, label)
        # Tolerance: half a unit of the last printed digit (0.005 for "4.79"), the rounding's.
        half_unit = 0.5 * 10 ** -len(printed.partition(".")[2])
        assert ratio == pytest.approx(float(printed), abs=half_unit + 1e-12), (
            f"{demo} {label}: summaries give {ratio:.4f}x, REPORT.md prints {printed}x")


@pytest.mark.parametrize("gpu", GPUS)
def test_readmes_hold_current_tables(gpu):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "reference_tables.py"),
                             str(REFERENCE / gpu), "--check"], check=False, capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, (f"rerun scripts/reference_tables.py {REFERENCE / gpu}:\n"
                                    f"{result.stdout}{result.stderr}")


@pytest.mark.parametrize("gpu", GPUS)
def test_one_gpu_one_torch(gpu):
    summaries = {path.relative_to(REFERENCE / gpu).as_posix(): json.loads(path.read_text())
                 for path in (REFERENCE / gpu).glob("*/*/summary*.json")}
    for name, summary in summaries.items():
        assert (summary["device"], summary["preset"]) == ("cuda", "cuda"), name
    for key in ("device_name", "torch_version"):
        values = {s.get(key) for s in summaries.values()}
        assert len(values) == 1, f"{key} differs in {REFERENCE / gpu}: {sorted(map(str, values))}"


@pytest.mark.parametrize("gpu", GPUS)
def test_reference_within_budget(gpu):
    size_mb = sum(p.stat().st_size for p in (REFERENCE / gpu).rglob("*") if p.is_file()) / 1e6
    assert size_mb <= REFERENCE_MAX_MB, f"{REFERENCE / gpu}: {size_mb:.1f} MB"
