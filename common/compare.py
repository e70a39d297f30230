"""A pair's bad and fixed runs side by side.

    python -m common.compare DEMO_DIR [--json]

DEMO_DIR holds bad/ and fixed/, each with the summary.json and the trace a demo script wrote
(traces/<demo>/). Throughput, step time and peak memory come from the summary (the unprofiled
timed phase; peak memory as the harness measured it); the GPU and host numbers and the verdicts
come from the trace the summary names (trace_file), through common.analyze. Both runs must share
their conditions (device, device_name, preset, torch_version): a pair that does not is an error,
not a comparison. A run whose profiled steps ran much slower than its timed ones
(profiler_overhead_ratio above trace.PROFILER_OVERHEAD_WARN_RATIO) gets a warning: its trace
exaggerates the CPU's share. Imports no torch.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from common import analyze, trace
from common.metrics import TimeByName, time_by_name

VARIANTS = ("bad", "fixed")


THROUGHPUT_LABELS = {"samples_per_s": "samples/s", "tokens_per_s": "real tokens/s"}


class CompareError(ValueError):
    """A demo directory that cannot be compared; the message says which file and why."""


# What both runs of a pair must share for their numbers to be compared: (summary.json field, how
# the message says it, what to rerun with). A pair measured on two devices, machines, presets or
# torch versions would credit the fix with the difference (the harness's flags: --device picks the
# device and, with --smoke, the preset).
SAME_CONDITIONS = (
    ("device", "ran on", "rerun both with the same --device"),
    ("device_name", "ran on", "rerun both on the same machine"),
    ("preset", "used preset", "rerun both with the same --device and --smoke"),
    ("torch_version", "ran torch", "rerun both with the same torch"),
)


def finished_pairs(root: Path) -> list[str]:
    """The demos under `root` (a run_demos.sh output folder) whose bad/ and fixed/ both hold a
    summary, sorted; [] when root is no folder."""
    if not root.is_dir():
        return []
    return sorted(d.name for d in root.iterdir()
                  if d.is_dir() and all((d / v / trace.SUMMARY_FILE).is_file() for v in VARIANTS))


def read_summary(demo_dir: Path, variant: str) -> dict:
    """DEMO_DIR/<variant>/summary.json, checked to be a demo summary."""
    run_dir = Path(demo_dir) / variant
    if not run_dir.is_dir():
        raise CompareError(f"{run_dir}: no such directory (run demos/<demo>/{variant}.py first)")
    summary_path = run_dir / trace.SUMMARY_FILE
    try:
        summary = json.loads(summary_path.read_text())
    except OSError:
        raise CompareError(f"{summary_path}: missing (the run did not finish)") from None
    except ValueError as error:
        raise CompareError(f"{summary_path}: not JSON ({error})") from None
    if not isinstance(summary, dict) or "samples_per_s" not in summary:
        raise CompareError(f"{summary_path}: not a demo summary (no samples_per_s)")
    return summary


def check_same_conditions(demo_dir: Path, bad: dict, fixed: dict) -> None:
    """CompareError naming the first condition (SAME_CONDITIONS) the two summaries differ in."""
    for key, verb, remedy in SAME_CONDITIONS:
        if bad.get(key) != fixed.get(key):
            raise CompareError(f"{demo_dir}: {key} differs: bad {verb} {bad.get(key)}, fixed "
                               f"{verb} {fixed.get(key)}; {remedy}")


def analyze_variant(demo_dir: Path, variant: str, summary: dict) -> dict:
    """{"summary": summary, "analysis": analyze_trace of the trace the summary names (or, with no
    trace_file in it, the run's newest trace), "detail": its analyze.Analysis (not JSON)}."""
    run_dir = Path(demo_dir) / variant
    trace_path = run_dir
    if summary.get("trace_file"):
        trace_path = run_dir / str(summary["trace_file"])
        if not trace_path.is_file():  # never another trace in its place: it may be a stale one
            raise CompareError(f"{run_dir / trace.SUMMARY_FILE} names {summary['trace_file']}, "
                               f"which is missing from {run_dir}")
    try:
        analysis = analyze.analyze(trace_path)
    except trace.TraceError as error:
        raise CompareError(str(error)) from None
    # "detail" (not JSON) is dropped by compare() unless keep_detail: the report draws from it.
    return {"summary": summary, "analysis": analysis.result, "detail": analysis}


def ratio(new, old) -> float | None:
    return new / old if new is not None and old else None


def profiler_overhead_ratio(summary: dict) -> float | None:
    """Profiled step p50 / timed step p50, as the harness writes it (profiler_overhead_ratio), or
    from the two p50s when only they are there; None for an older summary without them."""
    if summary.get("profiler_overhead_ratio") is not None:
        return summary["profiler_overhead_ratio"]
    return ratio(summary.get("profiled_step_ms_p50"), summary.get("step_ms_p50"))


def profiler_warnings(comparison: dict) -> list[str]:
    """One sentence per variant whose profiled steps ran more than PROFILER_OVERHEAD_WARN_RATIO
    times its timed p50: the profiler's per-operator cost (record_shapes, profile_memory) then
    inflates the trace's CPU time, and only the unprofiled numbers stand."""
    warnings = []
    for variant in VARIANTS:
        overhead = comparison["profiler_overhead_ratio"][variant]
        if overhead is not None and overhead > trace.PROFILER_OVERHEAD_WARN_RATIO:
            warnings.append(f"{variant}: profiled steps ran {overhead:.2f}x the timed step p50 "
                            f"(warn above {trace.PROFILER_OVERHEAD_WARN_RATIO}x): the trace "
                            f"exaggerates CPU time; trust {comparison['speedup_of']}")
    return warnings


def compare(demo_dir: Path, keep_detail: bool = False) -> dict:
    """Both variants, and fixed ÷ bad for throughput and peak memory."""
    demo_dir = Path(demo_dir)
    if not demo_dir.is_dir():
        raise CompareError(f"{demo_dir}: no such directory (a demo's output folder, "
                           f"e.g. traces/dataloader_workers, holding bad/ and fixed/)")
    summaries = {variant: read_summary(demo_dir, variant) for variant in VARIANTS}
    check_same_conditions(demo_dir, *(summaries[v] for v in VARIANTS))  # before the slow part
    runs = {variant: analyze_variant(demo_dir, variant, summaries[variant])
            for variant in VARIANTS}
    changed = what_changed(*(time_by_name(runs[v]["detail"].columns, runs[v]["detail"].window,
                                          runs[v]["detail"].steps.size,
                                          host_window=runs[v]["detail"].host_window)
                             for v in VARIANTS))
    if not keep_detail:
        for variant in VARIANTS:
            del runs[variant]["detail"]
    bad, fixed = (runs[v]["summary"] for v in VARIANTS)
    # A pair whose batches vary in length (padding_waste) is judged by real tokens/s: its samples
    # differ in size from step to step, and padding is work that trains nothing.
    by_tokens = bad.get("tokens_per_s") is not None and fixed.get("tokens_per_s") is not None
    throughput = "tokens_per_s" if by_tokens else "samples_per_s"
    comparison = {
        "demo": bad.get("demo", demo_dir.name), **runs,
        "speedup": ratio(fixed[throughput], bad[throughput]),
        "speedup_of": THROUGHPUT_LABELS[throughput],
        "peak_memory_ratio": ratio(fixed.get("peak_memory_mb"), bad.get("peak_memory_mb")),
        # Per variant, null where an older summary lacks them.
        "data_wait_pct": {v: runs[v]["summary"].get("data_wait_pct") for v in VARIANTS},
        "profiler_overhead_ratio": {v: profiler_overhead_ratio(runs[v]["summary"])
                                    for v in VARIANTS}}
    comparison["what_changed"] = changed
    # A pair run as several ranks (ddp_no_sync): every rank's step and collective time.
    comparison["ranks"] = {v: (analyze.analyze_ranks(demo_dir / v) or {}).get("cross_rank")
                           for v in VARIANTS}
    comparison["warnings"] = profiler_warnings(comparison) + [
        f"{v}: {line}" for v in VARIANTS for line in runs[v]["analysis"]["warnings"]]
    return comparison


WHAT_CHANGED_SHOWN = 8  # operators and kernels listed each, the largest change in ms/step first


def what_changed(bad: TimeByName, fixed: TimeByName) -> dict[str, list[dict]]:
    """The operators and kernels whose total time per step changed most from bad to fixed (HTA's
    trace_diff, per step): name, ms per step and calls per step in each (0 where a name is
    absent). Operator times are self times (metrics.self_time_us: the operators a parent holds on
    its thread are taken off its time)."""
    changed = {}
    for kind in ("operators", "kernels"):
        before, after = getattr(bad, kind), getattr(fixed, kind)
        rows = []
        for name in before.keys() | after.keys():
            bad_ms, bad_calls = before.get(name, (0.0, 0.0))
            fixed_ms, fixed_calls = after.get(name, (0.0, 0.0))
            rows.append({"name": name, "bad_ms_per_step": bad_ms, "fixed_ms_per_step": fixed_ms,
                         "bad_calls_per_step": bad_calls, "fixed_calls_per_step": fixed_calls})
        rows.sort(key=lambda row: (-abs(row["fixed_ms_per_step"] - row["bad_ms_per_step"]),
                                   row["name"]))
        changed[kind] = rows[:WHAT_CHANGED_SHOWN]
    return changed


def gpu_value(name: str):
    return lambda run: (run["analysis"]["gpu"] or {}).get(name)


# (label, how to read it from one variant, format). Summary numbers first, then the trace's.
ROWS = [
    ("samples/s", lambda run: run["summary"]["samples_per_s"], ".1f"),
    ("real tokens/s", lambda run: run["summary"].get("tokens_per_s"), ".0f"),
    ("padding %", lambda run: run["summary"].get("padding_pct"), ".1f"),
    ("step p50 ms", lambda run: run["summary"].get("step_ms_p50"), ".1f"),
    ("step p95 ms", lambda run: run["summary"].get("step_ms_p95"), ".1f"),
    ("peak memory MB", lambda run: run["summary"].get("peak_memory_mb"), ".1f"),
    ("data wait %", lambda run: run["summary"].get("data_wait_pct"), ".1f"),
    ("profiled/timed step", lambda run: profiler_overhead_ratio(run["summary"]), ".2f"),
    ("DataLoader %", lambda run: run["analysis"]["dataloader_pct"], ".1f"),
    ("optimizer ms/step", lambda run: (run["analysis"].get("optimizer") or {}).get("ms_per_step"),
     ".1f"),
    ("GPU utilization %", gpu_value("utilization_pct"), ".1f"),
    ("GPU idle %", gpu_value("idle_pct"), ".1f"),
    *((f"GPU idle: {analyze.IDLE_CAUSE_LABELS[cause]} %",
       lambda run, cause=cause: (gpu_value("idle_by_cause_pct")(run) or {}).get(cause), ".1f")
      for cause in analyze.IDLE_CAUSES),
    ("kernels/step", gpu_value("kernels_per_step"), ".0f"),
    ("median kernel us", gpu_value("median_kernel_us"), ".1f"),
    ("launches/step", gpu_value("launches_per_step"), ".0f"),
    ("syncs/step", gpu_value("syncs_per_step"), ".1f"),
    ("tensor cores % of kernel time", gpu_value("tensor_core_pct"), ".0f"),
    ("tensor cores % of GEMM time", gpu_value("tensor_core_gemm_pct"), ".0f"),
]


# Rows shown as n/a rather than left out when neither summary has them: the harness's newer
# fields, absent from older summaries (the reader learns the run predates them).
ALWAYS_SHOWN_ROWS = ("data wait %", "profiled/timed step")
# Rows with no fixed ÷ bad: a share of near-zero waits (0.03 % against 0.02 %) or a ratio of two
# ratios reads as a change where there is none.
NO_RATIO_ROWS = ("data wait %", "profiled/timed step",
                 *(f"GPU idle: {analyze.IDLE_CAUSE_LABELS[c]} %" for c in analyze.IDLE_CAUSES))


def table_rows(comparison: dict) -> list[tuple[str, str, str, str]]:
    """(label, bad, fixed, fixed ÷ bad) as text; rows with no value in either variant are left
    out (a CPU run has no GPU rows), but for ALWAYS_SHOWN_ROWS."""
    rows = []
    for label, read, spec in ROWS:
        bad, fixed = (read(comparison[v]) for v in VARIANTS)
        if bad is None and fixed is None and label not in ALWAYS_SHOWN_ROWS:
            continue
        shown = ["n/a" if x is None else f"{x:{spec}}" for x in (bad, fixed)]
        change = None if label in NO_RATIO_ROWS else ratio(fixed, bad)
        rows.append((label, *shown, "" if change is None else f"{change:.2f}x"))
    verdicts = [", ".join(f["id"] for f in comparison[v]["analysis"]["findings"]) or "none"
                for v in VARIANTS]
    rows.append(("verdicts", *verdicts, ""))
    return rows


def conditions(comparison: dict) -> str:
    """The run's conditions: device, torch, preset, batch, timed steps."""
    bad, fixed = (comparison[v]["summary"] for v in VARIANTS)
    batch = (str(bad.get("batch_size")) if bad.get("batch_size") == fixed.get("batch_size")
             else f"{bad.get('batch_size')} (bad) / {fixed.get('batch_size')} (fixed)")
    return (f"{bad.get('device')} ({bad.get('device_name')}), torch {bad.get('torch_version')}, "
            f"preset {bad.get('preset')}, batch {batch}, {bad.get('steps')} timed steps, "
            f"run {bad.get('created_utc', 'n/a')}")


def notes(comparison: dict) -> list[str]:
    """Notes a demo's summary carries (e.g. why a CPU cannot show the effect)."""
    found = []
    for variant in VARIANTS:
        summary = comparison[variant]["summary"]
        for key in ("note", "notes"):
            value = summary.get(key)
            for text in ([value] if isinstance(value, str) else value or []):
                if text and text not in found:
                    found.append(str(text))
    return found


def format_text(comparison: dict) -> str:
    rows = [("", "bad", "fixed", "fixed/bad")] + table_rows(comparison)
    lines = [f"{comparison['demo']}: {conditions(comparison)}"]
    lines += analyze.text_table(rows, right=(1, 2, 3))
    if comparison["speedup"] is not None:
        lines.append(f"  fixed / bad: {comparison['speedup']:.2f}x {comparison['speedup_of']}"
                     + (f", {comparison['peak_memory_ratio']:.2f}x peak memory"
                        if comparison["peak_memory_ratio"] is not None else ""))
    for variant in VARIANTS:
        for found in comparison[variant]["analysis"]["findings"]:
            lines.append(f"  {variant}: [{found['severity']}] {found['id']}: {found['evidence']}")
    lines += [f"  {line}" for line in rank_lines(comparison)]
    lines += what_changed_lines(comparison["what_changed"])
    lines += [f"  warning: {text}" for text in comparison["warnings"]]
    lines += [f"  note: {text}" for text in notes(comparison)]
    return "\n".join(lines)



def rank_lines(comparison: dict) -> list[str]:
    """Per variant of a multi-rank pair: each rank's step time and time in collectives."""
    lines = []
    for variant, cross in comparison.get("ranks", {}).items():
        if cross:
            lines.append(f"{variant} by rank (step ms / in collectives ms per step): " + ", ".join(
                f"rank {rank} {cross['step_ms_by_rank'][rank]:.1f} / "
                f"{cross['collective_ms_per_step_by_rank'][rank]:.1f}"
                for rank in cross["step_ms_by_rank"]))
    return lines


NAME_SHOWN_CHARS = 70  # kernel names run to thousands of characters (C++ templates)


def short_name(name: str) -> str:
    return name if len(name) <= NAME_SHOWN_CHARS else name[:NAME_SHOWN_CHARS - 3] + "..."


def what_changed_rows(changed: dict) -> list[tuple[str, str, str, str, str]]:
    """(kind, name, bad ms/step, fixed ms/step, calls/step bad -> fixed) as text."""
    rows = []
    for kind, label in (("operators", "operator"), ("kernels", "kernel")):
        for row in changed[kind]:
            rows.append((label, short_name(row["name"]), f"{row['bad_ms_per_step']:.2f}",
                         f"{row['fixed_ms_per_step']:.2f}",
                         f"{row['bad_calls_per_step']:.1f} -> {row['fixed_calls_per_step']:.1f}"))
    return rows


def what_changed_lines(changed: dict) -> list[str]:
    rows = what_changed_rows(changed)
    if not rows:
        return []
    rows = [("", "what changed most (time per step)", "bad ms", "fixed ms", "calls/step")] + rows
    return analyze.text_table(rows, right=(2, 3))


def main(argv: list[str] | None = None) -> int:
    parser = trace.OneLineArgumentParser(
        prog="python -m common.compare",
        description="A demo's bad and fixed runs side by side: throughput, step time, data "
                    "wait, profiler overhead, GPU utilization and idle (by cause), kernels, "
                    "syncs, peak memory, the verdicts and the operators and kernels whose time "
                    "changed most.",
        epilog="Exit code 2 when DEMO_DIR/bad or DEMO_DIR/fixed lacks a summary or a trace, or "
               "when the two ran on a different device, machine, preset or torch version.")
    parser.add_argument("demo_dir", metavar="DEMO_DIR", type=Path,
                        help="e.g. traces/dataloader_workers (holds bad/ and fixed/)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object, with speedup (fixed / bad, of speedup_of: "
                             "samples/s, or real tokens/s for a pair that counts them) and "
                             "peak_memory_ratio, "
                             "data_wait_pct and profiler_overhead_ratio per variant, "
                             "what_changed (operators and kernels), warnings")
    flags = parser.parse_args(argv)
    try:
        comparison = compare(flags.demo_dir)
    except CompareError as error:
        print(f"compare: {error}", file=sys.stderr)
        return 2
    return analyze.print_output(json.dumps(comparison, indent=2) if flags.json
                                else format_text(comparison))


if __name__ == "__main__":
    sys.exit(main())
