"""The optimization ladder (demos/ladder/): one training script in rungs, each one fix after the
rung before. Reads a run folder of rungs (<out>/ladder/rung<K>_<fix>/, each a run as the
harness writes it) and says, per rung: its speed, its gain over the rung before and over rung 0
(the waterfall), its verdicts, and whether the analyzer's top verdict on it names the fix the
next rung makes (the chain). `python -m common.compare <out>/ladder` prints it.

The memory ladder (demos/memory_ladder/) is read here too: per rung, whether it fits its memory
budget, its peaks and its speed (memory_rows); a rung that ran out of memory at a GPU's cap left
a record of it (trace.OUT_OF_MEMORY_FILE) in place of a trace."""
from __future__ import annotations

import json
import re
from pathlib import Path

from common import analyze, recorded, trace

RUNG_FOLDER = re.compile(r"^rung(\d+)_(\w+)$")
# The pair that teaches each rung's fix, which a verdict names (its "demo") when it names the fix.
FIX_DEMO = {"workers": "dataloader_workers", "batch": "small_batch", "bf16": "mixed_precision",
            "compile": "launch_overhead", "jitter_on_device": "dataloader_workers",
            "fused_optimizer": "unfused_optimizer"}
# Fixes no rule can name on a CPU, or whose gain cannot show there, and why: the chain skips them
# there, with the reason.
CPU_SILENT_FIXES = {
    "bf16": "BF16's gain on a CPU is AMX's, which a trace does not record: no rule reads a "
            "CPU's matmul precision",
    "batch": "a small batch shows as an idle GPU between short kernels (small_batch's rule); a "
             "CPU does not idle",
    "jitter_on_device": "a CPU has no device to move the colour jitter to: the workers keep "
                        "it (and keep up), only the batches turn uint8",
}
# A BF16 rung that kept FP32 math (harness.bf16_where_fast: a device with no BF16 matrix units,
# where emulated BF16 runs many times slower) made no change to name, on any device.
KEPT_FP32_WHY = ("the rung kept FP32 math: this device has no BF16 matrix units, and BF16 "
                 "runs no faster than FP32 there, or emulated, many times slower")
# A finding that is no bottleneck to fix: start-up in the window (record later steps instead).
NOT_ACTIONABLE = ("initialization",)


# The ladders whose lesson is a memory budget: those whose preset sets one (--memory-budget-gb's
# default; a test holds the two together). Their rungs are read by memory_rows, and a rung may be
# a record of running out.
MEMORY_LADDERS = frozenset({"memory_ladder"})
MEMORY_RECORDS = (trace.SUMMARY_FILE, trace.OUT_OF_MEMORY_FILE)


def rung_folders(folder: Path, records: tuple[str, ...] = (trace.SUMMARY_FILE,)
                 ) -> list[tuple[int, str, Path]]:
    """(K, fix, path) of each rung run in `folder` (one of `records` in it: a summary beside a
    trace, by default), by K."""
    found = []
    for path in folder.iterdir() if folder.is_dir() else []:
        match = RUNG_FOLDER.match(path.name)
        if match and any((path / record).is_file() for record in records):
            found.append((int(match.group(1)), match.group(2), path))
    return sorted(found)


def rung_record(path: Path) -> tuple[dict, bool]:
    """A rung's summary and True, or its out-of-memory record and False (it did not run)."""
    if (path / trace.SUMMARY_FILE).is_file():
        return json.loads((path / trace.SUMMARY_FILE).read_text()), True
    return json.loads((path / trace.OUT_OF_MEMORY_FILE).read_text()), False


def is_memory_ladder(folder: Path) -> bool:
    rungs = rung_folders(folder, MEMORY_RECORDS)
    return len(rungs) >= 2 and rung_record(rungs[0][2])[0].get("demo") in MEMORY_LADDERS


def is_ladder(folder: Path) -> bool:
    """A speed ladder's run folder: two rung runs or more, not a memory ladder's."""
    return len(rung_folders(folder)) >= 2 and not is_memory_ladder(folder)


def top_finding(result: dict) -> dict | None:
    """The analyzer's first actionable finding (they come ordered by verdicts.rank)."""
    return next((f for f in result["findings"] if f["id"] not in NOT_ACTIONABLE), None)


def ladder_rows(folder: Path) -> list[dict]:
    """One row per rung: rung, fix, device, samples_per_s, vs_previous and vs_first (ratios of
    samples/s), verdicts (ids), top (the first actionable finding's id and demo), warnings
    (recorded.recorded_warnings: where the trace does not stand for the timed steps), and chain:
    "holds", "breaks" (with what it named instead) or "skipped" (with the reason) for whether
    the top verdict names the next rung's fix; None on the last rung."""
    rungs = rung_folders(folder)
    summaries = [json.loads((path / trace.SUMMARY_FILE).read_text()) for _, _, path in rungs]
    rows = []
    for index, ((k, fix, path), summary) in enumerate(zip(rungs, summaries)):
        result = analyze.analyze_trace(path)
        top = top_finding(result)
        row = {"rung": path.name, "k": k, "fix": fix, "device": summary["device"],
               "batch_size": summary["batch_size"], "samples_per_s": summary["samples_per_s"],
               "verdicts": [f["id"] for f in result["findings"]],
               "top": None if top is None else {"id": top["id"], "demo": top["demo"]},
               # where its recorded steps do not stand for its timed ones, a sentence each
               "warnings": recorded.recorded_warnings(summary, result, "samples/s")}
        first, before = (rows[0], rows[-1]) if rows else (None, None)
        row["vs_previous"] = (None if before is None
                              else row["samples_per_s"] / before["samples_per_s"])
        row["vs_first"] = None if first is None else row["samples_per_s"] / first["samples_per_s"]
        row["chain"] = None
        if index + 1 < len(rungs):
            row["chain"] = chain_link(row, rungs[index + 1][1], summaries[index + 1])
        rows.append(row)
    return rows


def chain_link(row: dict, next_fix: str, next_summary: dict | None = None) -> dict:
    """Whether this rung's top verdict names `next_fix` (FIX_DEMO), or why no rule could on
    this device (CPU_SILENT_FIXES), or why the next rung made no change here (its summary says
    its BF16 kept FP32: KEPT_FP32_WHY)."""
    wanted = FIX_DEMO.get(next_fix)
    if next_fix == "bf16" and (next_summary or {}).get("extra", {}).get("bf16_kept_fp32"):
        return {"status": "skipped", "next_fix": next_fix, "why": KEPT_FP32_WHY}
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
        where = "" if link["why"] == KEPT_FP32_WHY else " on a CPU"
        return f"skipped{where} ({link['why']})"
    named = link["named"] or "nothing"
    if link["status"] == "holds":
        return f"names the next fix ({link['next_fix']}: see {named})"
    return f"names {named}, not the next fix ({link['next_fix']}: {link['wanted']})"


def format_waterfall(rows: list[dict]) -> str:
    """The waterfall as text: a line per rung with its samples/s, its gain over the rung before
    and over rung 0, its verdicts, and the chain; then its warnings, a line each."""
    lines = [f"ladder: {len(rows)} rungs on {rows[0]['device']}" if rows else "ladder: no rungs"]
    for row in rows:
        top = f"{row['top']['id']} ({row['top']['demo']})" if row["top"] else "none"
        lines.append(
            f"{row['rung']:<24} {row['samples_per_s']:>9.1f} samples/s (batch "
            f"{row['batch_size']})  vs the rung before: {ratio_words(row['vs_previous'])}; "
            f"vs rung 0: {ratio_words(row['vs_first'])}")
        lines.append(f"{'':<24} verdicts: {', '.join(row['verdicts']) or 'none'}; top: {top}; "
                     f"chain: {chain_words(row['chain'])}")
        lines += [f"{'':<24} warning: {warning}" for warning in row["warnings"]]
    return "\n".join(lines)


def waterfall_headline(rows: list[dict]) -> str:
    """The speed ladder in a line, for a table of results: its gain from rung 0 to the last rung
    and how many links of the chain hold ("38.65x more samples/s from rung 0 to rung 6; the
    analyzer named the next fix on 5 of 6 rungs")."""
    links = [row["chain"] for row in rows[:-1]]
    holding = sum(link["status"] == "holds" for link in links)
    return (f"{ratio_words(rows[-1]['vs_first'])} from rung 0 to rung {rows[-1]['k']}; the "
            f"analyzer named the next fix on {holding} of {len(links)} rungs")


# --- The memory ladder: which rungs fit the budget. ------------------------------------------

def memory_rows(folder: Path) -> list[dict]:
    """One row per rung of a memory ladder: rung, k, fix, device, device_name, batch_size,
    micro_batches (gradient accumulation's; 1 without), dtype (the weights'), ran (False: it ran
    out of memory at the cap, and its numbers are None), budget_mb, fits, peak_mb and peak_of
    (the peak held against the budget, and what it is), peak_memory_mb (the summary's peak
    memory: tensors), samples_per_s, and memory_vs_previous and speed_vs_previous (ratios of
    peak_memory_mb and of samples/s to the rung before, where both ran)."""
    rows = []
    for k, fix, path in rung_folders(folder, MEMORY_RECORDS):
        record, ran = rung_record(path)
        budget, config = record["memory_budget"] or {}, record.get("config", {})
        row = {"rung": path.name, "k": k, "fix": fix, "device": record["device"],
               "device_name": record["device_name"], "batch_size": record["batch_size"],
               "micro_batches": config.get("accumulation_micro_batches", 1),
               "dtype": config.get("dtype", "float32"), "ran": ran,
               "budget_mb": budget.get("budget_mb"), "fits": bool(budget.get("fits")),
               "peak_mb": budget.get("peak_mb"), "peak_of": budget.get("peak_of"),
               "peak_memory_mb": record.get("peak_memory_mb"),
               "peak_memory_source": record.get("peak_memory_source"),
               "samples_per_s": record.get("samples_per_s"), "error": record.get("error")}
        before = rows[-1] if rows else None
        row["memory_vs_previous"] = ratio(row["peak_memory_mb"],
                                          before and before["peak_memory_mb"])
        row["speed_vs_previous"] = ratio(row["samples_per_s"], before and before["samples_per_s"])
        rows.append(row)
    return rows


def batch_words(batch_size: int, micro_batches: int) -> str:
    """"batch 8", or "batch 8 in 4 micro-batches" where the rung accumulates gradients."""
    return f"batch {batch_size}" + (f" in {micro_batches} micro-batches" if micro_batches > 1
                                    else "")


def peak_memory_words(peak_memory_mb: float | None) -> str:
    """"peak memory 1,262.2 MB", or "peak memory n/a" for a run without it."""
    return ("peak memory n/a" if peak_memory_mb is None
            else f"peak memory {peak_memory_mb:,.1f} MB")


def ratio(now: float | None, before: float | None) -> float | None:
    return None if not now or not before else now / before


def gb(mb: float) -> str:
    """A budget in GB as the flag takes it: "0.9 GB", "16 GB"."""
    return f"{mb / trace.MB_PER_GB:g} GB"


def memory_words(ratio_: float | None) -> str:
    """A change of peak memory with its direction: "0.50x the peak memory", "the same peak
    memory" within rounding; "-" with nothing to compare."""
    if ratio_ is None:
        return "-"
    if round(ratio_, 2) == 1:
        return "the same peak memory"
    return f"{ratio_:.2f}x the peak memory"


def first_fitting(rows: list[dict]) -> dict | None:
    """The first rung that fits its budget, from which every later one fits too; None if the
    last rung does not fit."""
    fitting = None
    for row in reversed(rows):
        if not row["fits"]:
            break
        fitting = row
    return fitting


def fits_headline(rows: list[dict]) -> str:
    """The memory ladder in a line, for a table of results: the first rung that fits the budget
    and the peak it holds there, and what the rungs before it did ("rung2_checkpointing fits
    16 GB at 11,444.2 MB; the 2 rungs before it ran out of memory at the cap")."""
    budget = gb(rows[0]["budget_mb"])
    fitting = first_fitting(rows)
    if fitting is None:
        return f"no rung fits {budget}"
    before = [row for row in rows if row["k"] < fitting["k"]]
    words = f"{fitting['rung']} fits {budget} at {fitting['peak_mb']:,.1f} MB"
    if before:
        stopped = sum(not row["ran"] for row in before)
        words += (f"; the {len(before)} rungs before it " if len(before) > 1
                  else "; the rung before it ")
        words += ("ran out of memory at the cap" if stopped == len(before) else
                  f"went over the budget, {stopped} out of memory at the cap" if stopped else
                  "went over the budget")
    return words


def fits_words(row: dict) -> str:
    if not row["ran"]:
        return "out of memory at the cap"
    return ("fits" if row["fits"] else "over the budget") + f", {row['peak_mb']:,.1f} MB"


def format_memory_table(rows: list[dict]) -> str:
    """The memory ladder as text: the budget and what is held against it, then a line per rung
    (fits or not, its peak memory and its speed, each against the rung before), then the first
    rung that fits."""
    if not rows:
        return "memory ladder: no rungs"
    first = rows[0]
    of = next((row["peak_of"] for row in rows if row["ran"]), first["peak_of"])
    budgets = {row["budget_mb"] for row in rows}
    said = (f"budget {gb(first['budget_mb'])}" if len(budgets) == 1 else "budgets differ: "
            + ", ".join(f"{row['rung']} {gb(row['budget_mb'])}" for row in rows))
    lines = [(f"memory ladder: {len(rows)} rungs on {first['device']} ({first['device_name']}); "
              f"{said}, held against {of}")]
    for row in rows:
        batch = batch_words(row["batch_size"], row["micro_batches"])
        if not row["ran"]:
            lines.append(f"{row['rung']:<24} {fits_words(row)} | {batch} | no run: {row['error']}")
            continue
        memory = peak_memory_words(row["peak_memory_mb"])
        if row["memory_vs_previous"] is not None:
            memory += f" (vs the rung before: {memory_words(row['memory_vs_previous'])})"
        speed = f"{row['samples_per_s']:,.1f} samples/s"
        if row["speed_vs_previous"] is not None:
            speed += f" (vs the rung before: {ratio_words(row['speed_vs_previous'])})"
        lines.append(f"{row['rung']:<24} {fits_words(row)} | {batch} | {memory} | {speed}")
    fitting = first_fitting(rows)
    lines.append("first rung that fits: " + (f"{fitting['rung']}" if fitting
                                               else "none: the last rung is over the budget too"))
    source = next((row["peak_memory_source"] for row in rows if row["ran"]), None)
    if source:
        lines.append(f"peak memory: {source}")
    return "\n".join(lines)
