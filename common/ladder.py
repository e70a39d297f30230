"""The optimization ladder (demos/ladder/): one training script in rungs, each one fix after the
rung before. Reads a run folder of rungs (<out>/ladder/rung<K>_<fix>/, each a run as the
harness writes it) and says, per rung: its speed, its gain over the rung before and over rung 0
(the waterfall), its verdicts, and whether the analyzer's top verdict on it names the fix the
next rung makes (the chain). `python -m common.compare <out>/ladder` prints it."""
from __future__ import annotations

import json
import re
from pathlib import Path

from common import analyze, trace

RUNG_FOLDER = re.compile(r"^rung(\d+)_(\w+)$")
# The pair that teaches each rung's fix, which a verdict names (its "demo") when it names the fix.
FIX_DEMO = {"workers": "dataloader_workers", "bf16": "mixed_precision", "batch": "small_batch",
            "compile": "launch_overhead", "fused_optimizer": "unfused_optimizer"}
# Fixes no rule can name on a CPU, and why: the chain skips them there, with the reason.
CPU_SILENT_FIXES = {
    "bf16": "BF16's gain is the tensor cores': no rule reads a CPU's matmul precision",
    "batch": "a small batch shows as an idle GPU between short kernels (small_batch's rule); a "
             "CPU does not idle",
}
# A finding that is no bottleneck to fix: start-up in the window (record later steps instead).
NOT_ACTIONABLE = ("initialization",)


def rung_folders(folder: Path) -> list[tuple[int, str, Path]]:
    """(K, fix, path) of each rung run in `folder` (a summary beside a trace), by K."""
    found = []
    for path in folder.iterdir() if folder.is_dir() else []:
        match = RUNG_FOLDER.match(path.name)
        if match and (path / trace.SUMMARY_FILE).is_file():
            found.append((int(match.group(1)), match.group(2), path))
    return sorted(found)


def is_ladder(folder: Path) -> bool:
    return len(rung_folders(folder)) >= 2


def top_finding(result: dict) -> dict | None:
    """The analyzer's first actionable finding (they come ordered by severity, then rule)."""
    return next((f for f in result["findings"] if f["id"] not in NOT_ACTIONABLE), None)


def ladder_rows(folder: Path) -> list[dict]:
    """One row per rung: rung, fix, device, samples_per_s, vs_previous and vs_first (ratios of
    samples/s), verdicts (ids), top (the first actionable finding's id and demo), and chain:
    "holds", "breaks" (with what it named instead) or "skipped" (with the reason) for whether
    the top verdict names the next rung's fix; None on the last rung."""
    rungs = rung_folders(folder)
    rows = []
    for index, (k, fix, path) in enumerate(rungs):
        summary = json.loads((path / trace.SUMMARY_FILE).read_text())
        result = analyze.analyze_trace(path)
        top = top_finding(result)
        row = {"rung": path.name, "k": k, "fix": fix, "device": summary["device"],
               "batch_size": summary["batch_size"], "samples_per_s": summary["samples_per_s"],
               "verdicts": [f["id"] for f in result["findings"]],
               "top": None if top is None else {"id": top["id"], "demo": top["demo"]}}
        first, before = (rows[0], rows[-1]) if rows else (None, None)
        row["vs_previous"] = (None if before is None
                              else row["samples_per_s"] / before["samples_per_s"])
        row["vs_first"] = None if first is None else row["samples_per_s"] / first["samples_per_s"]
        row["chain"] = None
        if index + 1 < len(rungs):
            row["chain"] = chain_link(row, rungs[index + 1][1])
        rows.append(row)
    return rows


def chain_link(row: dict, next_fix: str) -> dict:
    """Whether this rung's top verdict names `next_fix` (FIX_DEMO), or why no rule could on
    this device (CPU_SILENT_FIXES)."""
    wanted = FIX_DEMO.get(next_fix)
    if row["device"] == "cpu" and next_fix in CPU_SILENT_FIXES:
        return {"status": "skipped", "next_fix": next_fix, "why": CPU_SILENT_FIXES[next_fix]}
    named = row["top"]["demo"] if row["top"] else None
    return {"status": "holds" if named == wanted else "breaks", "next_fix": next_fix,
            "wanted": wanted, "named": named}


def ratio_words(ratio: float | None) -> str:
    """A gain in samples/s with its direction: "1.42x more samples/s", "1.04x fewer samples/s"
    (a slowdown, said as its own factor), "the same samples/s" within rounding."""
    if ratio is None:
        return "-"
    if round(ratio, 2) == 1 or round(1 / ratio, 2) == 1:
        return "the same samples/s"
    return f"{ratio:.2f}x more samples/s" if ratio > 1 else f"{1 / ratio:.2f}x fewer samples/s"


def chain_words(link: dict | None) -> str:
    if link is None:
        return "the last rung"
    if link["status"] == "skipped":
        return f"skipped on a CPU ({link['why']})"
    named = link["named"] or "nothing"
    if link["status"] == "holds":
        return f"names the next fix ({link['next_fix']}: see {named})"
    return f"names {named}, not the next fix ({link['next_fix']}: {link['wanted']})"


def format_waterfall(rows: list[dict]) -> str:
    """The waterfall as text: a line per rung with its samples/s, its gain over the rung before
    and over rung 0, its verdicts, and the chain."""
    lines = [f"ladder: {len(rows)} rungs on {rows[0]['device']}" if rows else "ladder: no rungs"]
    for row in rows:
        top = f"{row['top']['id']} ({row['top']['demo']})" if row["top"] else "none"
        lines.append(
            f"{row['rung']:<24} {row['samples_per_s']:>9.1f} samples/s (batch "
            f"{row['batch_size']})  vs the rung before: {ratio_words(row['vs_previous'])}; "
            f"vs rung 0: {ratio_words(row['vs_first'])}")
        lines.append(f"{'':<24} verdicts: {', '.join(row['verdicts']) or 'none'}; top: {top}; "
                     f"chain: {chain_words(row['chain'])}")
    return "\n".join(lines)
