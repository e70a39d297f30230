"""One quantity, one value: the same number in analyze (text and --json), compare (text and
--json) and the committed report, on the committed H100 reference runs.

Each output is read the way a reader reads it (the text parsed, the JSON formatted at the text's
precision), so a definition or a format changed in one output alone fails here: the GPU's
utilization and idle (the window's, which the causes split), each idle cause, the DataLoader's
share, peak memory in MB (10^6 bytes), the optimizer's CPU and GPU times, syncs per step.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from common import analyze, compare

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "traces" / "reference" / "h100"
# Pairs that hold each quantity away from zero somewhere: the DataLoader, syncs and both optimizer
# sides (dataloader_workers, item_sync, unfused_optimizer); every cause of idle time shows in one.
PAIRS = ("dataloader_workers", "item_sync", "unfused_optimizer")
PCT = ".1f"  # every share prints with one decimal
# compare's row label -> (how analyze --json holds it, its format).
ROWS = {
    "GPU utilization %": (lambda a: a["gpu"]["utilization_pct"], PCT),
    "GPU idle %": (lambda a: a["gpu"]["idle_pct"], PCT),
    "DataLoader %": (lambda a: a["dataloader_pct"], PCT),
    "syncs/step": (lambda a: a["gpu"]["syncs_per_step"], ".1f"),
    "optimizer CPU ms/step": (lambda a: a["optimizer"]["cpu_ms_per_step"], ".1f"),
    "optimizer GPU ms/step": (lambda a: a["optimizer"]["gpu_ms_per_step"], ".1f"),
    **{f"GPU idle: {analyze.IDLE_CAUSE_LABELS[cause]} %":
       (lambda a, cause=cause: a["gpu"]["idle_by_cause_pct"][cause], PCT)
       for cause in analyze.IDLE_CAUSES},
}
# The report's summary table shows these of them (report.PRIMARY_ROWS).
REPORT_ROWS = ("GPU utilization %", "DataLoader %", "syncs/step")


def json_out(main, argv, capsys) -> dict:
    assert main(["--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def text_out(main, argv, capsys) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def table_cells(lines: list[str]) -> dict[str, list[str]]:
    """compare's text table: {label: [bad, fixed]} (labels hold single spaces, columns two)."""
    cells = {}
    for line in lines:
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) >= 3:
            cells[parts[0]] = parts[1:3]
    return cells


def markdown_cells(text: str, demo: str) -> dict[str, list[str]]:
    """The report's table under `## demo`: {label: [bad, fixed]}."""
    section = text.split(f"\n## {demo}\n", 1)[1].split("\n## ", 1)[0]
    return {cells[0]: cells[1:3] for cells in (
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in section.splitlines() if line.startswith("| ") and line.count("|") >= 4)}


def analyze_text_values(text: str) -> dict[str, str]:
    """The numbers analyze's text prints, by compare's labels."""
    values = {"GPU utilization %": re.search(r"^GPU +utilization ([\d.]+) %", text, re.M)[1],
              "GPU idle %": re.search(r"^GPU idle +([\d.]+) %", text, re.M)[1],
              "DataLoader %": re.search(r"^DataLoader +([\d.]+) %", text, re.M)[1],
              "syncs/step": re.search(r" ([\d.]+) syncs/step", text)[1]}
    causes = re.search(r"^GPU idle +[\d.]+ % of the steps: (.*) \(HTA's", text, re.M)[1]
    for cause in analyze.IDLE_CAUSES:
        label = analyze.IDLE_CAUSE_LABELS[cause]
        shown = re.search(rf"(?:^|, ){re.escape(label)} ([\d.]+)(?:,|$)", causes)
        if shown:  # a cause under analyze.SHOWN_PCT_MIN is left out of the line
            values[f"GPU idle: {label} %"] = shown[1]
    return values


@pytest.mark.parametrize("demo", PAIRS)
def test_one_value_in_every_output(demo, capsys):
    compared = json_out(compare.main, [str(REFERENCE / demo)], capsys)
    compare_cells = table_cells(text_out(compare.main, [str(REFERENCE / demo)], capsys)
                                .splitlines())
    report_cells = markdown_cells((REFERENCE / "REPORT.md").read_text(), demo)
    checked = 0
    for column, variant in enumerate(compare.VARIANTS):
        run = str(REFERENCE / demo / variant)
        analysis = json_out(analyze.main, [run], capsys)
        printed = analyze_text_values(text_out(analyze.main, [run], capsys))
        for label, (read, spec) in ROWS.items():
            value = f"{read(analysis):{spec}}"
            # compare's JSON holds the same analysis as analyze's
            assert f"{read(compared[variant]['analysis']):{spec}}" == value, (variant, label)
            assert compare_cells[label][column] == value, (variant, label)
            if label in printed:
                assert printed[label] == value, (variant, label)
            if label in REPORT_ROWS:
                assert report_cells[label][column] == value, (variant, label, "REPORT.md")
            checked += 1
        # The run's peak memory: one number in MB (10^6 bytes) from its summary.
        peak = f"{compared[variant]['summary']['peak_memory_mb']:.1f}"
        assert compare_cells["peak memory MB"][column] == peak
        assert report_cells["peak memory MB"][column] == peak
    assert checked == 2 * len(ROWS)


def test_the_idle_causes_add_up_to_the_idle_and_utilization_to_the_rest(capsys):
    """The window's idle is what its causes split, and utilization is the rest: on every
    reference GPU trace, exactly (in the JSON) and in the printed text within its rounding."""
    traces = sorted(REFERENCE.glob("*/*/**/*.pt.trace.json.gz"))  # every rank's of a DDP run
    assert len(traces) >= 2 * len(PAIRS)
    for path in traces:
        analysis = json_out(analyze.main, [str(path)], capsys)
        gpu = analysis["gpu"]
        if not gpu:
            continue
        assert sum(gpu["idle_by_cause_pct"].values()) == pytest.approx(gpu["idle_pct"], abs=1e-6)
        assert gpu["utilization_pct"] + gpu["idle_pct"] == pytest.approx(100.0, abs=1e-9)
        assert gpu["compute_pct"] + gpu["exposed_comm_pct"] + gpu["copy_only_pct"] == \
            pytest.approx(gpu["utilization_pct"], abs=1e-6)
