"""Two runs side by side: a demo's bad and fixed, or any before and after.

    python -m common.compare DEMO_DIR [--json]
    python -m common.compare BEFORE AFTER [--json]

DEMO_DIR holds bad/ and fixed/, each with the summary.json and the trace a demo script wrote
(traces/<demo>/). Throughput, step time and peak memory come from the summary (the unprofiled
timed phase; peak memory as the harness measured it); the GPU and host numbers and the verdicts
come from the trace the summary names (trace_file), through common.analyze. Both runs must share
their conditions (device, device_name, preset, torch_version): a pair that does not is an error,
not a comparison. A run whose recorded steps do not stand for its timed ones gets a warning
(common/recorded.py): profiled steps much slower than the timed ones, or a data wait that the
trace understates or exaggerates.

BEFORE and AFTER are any two traces, or run folders (the newest trace in each; a summary.json
beside it, as harness.profile_loop writes for your own loop, adds its timed numbers): step time,
the parts of the step as per-step changes in ms, the GPU's idle time by cause, the verdicts
before and after, what changed, and what still bounds the step. Two runs on different devices
are compared with a warning, not refused: the change then includes the hardware. Imports no
torch.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from common import analyze, ladder, recorded, trace
from common.idle_causes import compiling_operators
from common.trace_steps import BREAKDOWN_ROLES, TimeByName, time_by_name

VARIANTS = ("bad", "fixed")  # a demo's two runs
BEFORE_AFTER = ("before", "after")  # any two runs


THROUGHPUT_LABELS = {"samples_per_s": "samples/s", "tokens_per_s": "real tokens/s",
                     "requests_per_s": "requests/s"}
GENERATED_TOKENS_LABEL = "generated tokens/s"  # tokens_per_s of a generation run
# An inference pair's latency, by the summary key its rated_by names: the p50 is the headline.
LATENCY_LABELS = {"latency_ms": "p50 latency", "per_token_ms": "p50 per-token latency"}


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
        raise CompareError(f"{run_dir}: no such directory (run demos/<demo>/{variant}.py first)"
                           f"{trace.missing_run_hint(run_dir)}")
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


def analyze_run(path: Path, summary: dict) -> dict:
    """{"summary": summary, "analysis": analyze_trace of the trace the summary names (or, with no
    trace_file in it, the run folder's newest trace; or the trace file `path`), "detail": its
    analyze.Analysis (not JSON)}."""
    trace_path = path
    if summary.get("trace_file") and path.is_dir():
        trace_path = path / str(summary["trace_file"])
        if not trace_path.is_file():  # never another trace in its place: it may be a stale one
            raise CompareError(f"{path / trace.SUMMARY_FILE} names {summary['trace_file']}, "
                               f"which is missing from {path}")
    try:
        analysis = analyze.analyze(trace_path)
    except trace.TraceError as error:
        raise CompareError(str(error)) from None
    # "detail" (not JSON) is dropped by compare() unless keep_detail: the report draws from it.
    return {"summary": summary, "analysis": analysis.result, "detail": analysis}


def ratio(new, old) -> float | None:
    return new / old if new is not None and old else None


def prints_as_one(ratio: float) -> bool:
    """A ratio that prints as 1.00x (two decimals): every output says "the same" for it."""
    return f"{ratio:.2f}" == "1.00"


def change_words(change: float | None, better: int = 0) -> str:
    """A ratio (new ÷ old) in words with its direction: "11.30x higher", "5.88x lower" (the
    old value over the new, so that both read as a factor above 1), "the same" where it prints
    as 1.00x, and ", better" or ", worse" where the row says which way is good (`better`: +1
    higher is better, -1 lower is better, 0 neither). A factor above RATIO_SHOWN_MAX reads "over
    1000x": beyond it the digits say nothing a reader can use."""
    if change is None:
        return ""
    if prints_as_one(change):
        return "the same"
    if change == 0:
        return "down to 0"
    factor = change if change > 1 else 1 / change
    shown = f"over {RATIO_SHOWN_MAX:.0f}x" if factor > RATIO_SHOWN_MAX else f"{factor:.2f}x"
    return shown + (" higher" if change > 1 else " lower") + better_words(change > 1, better)


def better_words(higher: bool, better: int) -> str:
    """", better" or ", worse" for a change upwards (`higher`) or downwards, where the row says
    which way is good (`better`: +1 higher, -1 lower, 0 neither)."""
    if not better:
        return ""
    return ", better" if higher == (better > 0) else ", worse"


def row_change(label: str, values: tuple, spec: str, better: int, steps: tuple) -> str:
    """A table row's change in words, as its values print (`spec`). A share (a label with "%")
    changes by points: "95.4 points less", never a ratio of two shares. Any other row: a ratio
    (change_words), except where a side prints as zero at its precision: "down to ~0" / "up from
    ~0" ("down to 0" where it is exactly zero). A count per step from fewer than FEW_STEPS
    recorded steps (`steps`, each variant's) says so: one event in three steps reads 0.3/step."""
    old, new = values
    if old is None or new is None:
        return ""
    old_shown, new_shown = (float(f"{x:{spec}}") for x in values)
    if "%" in label:
        points = new_shown - old_shown
        digits = spec.lstrip(".").rstrip("f")
        words = ("the same" if f"{abs(points):.{digits}f}" == f"{0:.{digits}f}" else
                 f"{abs(points):.{digits}f} points {'more' if points > 0 else 'less'}"
                 + better_words(points > 0, better))
    elif old_shown == 0 and new_shown == 0:
        words = "the same"
    elif new_shown == 0:
        words = ("down to 0" if new == 0 else "down to ~0") + better_words(False, better)
    elif old_shown == 0:
        words = ("up from 0" if old == 0 else "up from ~0") + better_words(True, better)
    else:
        words = change_words(ratio(new, old), better)
    recorded = [n for n in steps if n is not None]
    # The harness records 3 steps: a sync every tenth step (item_sync/fixed) reads 0.3/step there.
    if label in COUNT_ROWS and recorded and min(recorded) < FEW_STEPS and words:
        words += f" ({min(recorded)} recorded steps)"
    return words


def headline(comparison: dict) -> str:
    """The result in a few words, direction included: "11.30x more samples/s, 0.17x the peak
    memory"; "" where the runs have no timed summaries."""
    parts = []
    speedup, unit = comparison.get("speedup"), comparison.get("speedup_of")
    if speedup is not None:  # "the same" where it prints as 1.00x, as change_words says it
        parts.append(f"the same {unit}" if prints_as_one(speedup)
                     else f"{speedup:.2f}x more {unit}" if speedup > 1
                     else f"{speedup:.2f}x the {unit} (slower)")
    latency = comparison.get("latency_ratio")
    if latency:  # lower is better: "3.40x lower p50 latency", or "1.20x higher ... (worse)"
        factor = 1 / latency if latency <= 1 else latency
        parts.append(f"the same {comparison['latency_of']}" if prints_as_one(factor)
                     else f"{factor:.2f}x lower {comparison['latency_of']}" if latency <= 1
                     else f"{factor:.2f}x higher {comparison['latency_of']} (worse)")
    memory = comparison.get("peak_memory_ratio")
    if memory is not None:
        parts.append(f"{memory:.2f}x the peak memory")
    return ", ".join(parts)


def profiler_warnings(comparison: dict) -> list[str]:
    """Per variant, each way its recorded steps fail to stand for its timed ones
    (recorded.recorded_warnings: the profiled steps' p50, the data wait); only the unprofiled
    numbers stand."""
    return [f"{variant}: {line}" for variant in comparison.get("variants", VARIANTS)
            for line in recorded.recorded_warnings(comparison[variant]["summary"],
                                                   comparison[variant]["analysis"],
                                                   comparison["speedup_of"])]


def compare(demo_dir: Path, keep_detail: bool = False) -> dict:
    """Both variants, and fixed ÷ bad for throughput and peak memory."""
    demo_dir = Path(demo_dir)
    if demo_dir.is_file():
        raise CompareError(f"{demo_dir}: one trace; compare takes a demo's folder (holding bad/ "
                           f"and fixed/) or two runs: python -m common.compare BEFORE AFTER")
    if not demo_dir.is_dir():
        raise CompareError(f"{demo_dir}: no such directory (a demo's output folder, "
                           f"e.g. traces/dataloader_workers, holding bad/ and fixed/)"
                           f"{trace.missing_run_hint(demo_dir)}")
    summaries = {variant: read_summary(demo_dir, variant) for variant in VARIANTS}
    check_same_conditions(demo_dir, *(summaries[v] for v in VARIANTS))  # before the slow part
    runs = {variant: analyze_run(demo_dir / variant, summaries[variant]) for variant in VARIANTS}
    comparison = side_by_side(runs, summaries["bad"].get("demo", demo_dir.name), keep_detail)
    # A pair run as several ranks (ddp_no_sync): every rank's step and collective time.
    comparison["ranks"] = {v: (analyze.analyze_ranks(demo_dir / v) or {}).get("cross_rank")
                           for v in VARIANTS}
    return comparison


def run_summary(path: Path) -> dict:
    """The summary.json in a run folder (a demo's, or harness.profile_loop's for your own loop);
    {} for a trace file, or a folder of traces from elsewhere."""
    summary_path = path / trace.SUMMARY_FILE
    if not (path.is_dir() and summary_path.is_file()):
        return {}
    try:
        summary = json.loads(summary_path.read_text())
    except ValueError as error:
        raise CompareError(f"{summary_path}: not JSON ({error})") from None
    return summary if isinstance(summary, dict) and "samples_per_s" in summary else {}


def compare_runs(before: Path, after: Path, keep_detail: bool = False) -> dict:
    """Any two runs (trace files or run folders), before and after a change."""
    paths = dict(zip(BEFORE_AFTER, (Path(before), Path(after))))
    for path in paths.values():
        if not path.exists():
            raise CompareError(f"{path}: no such file or directory (a trace, "
                               f".pt.trace.json[.gz], or a folder holding one)"
                               f"{trace.missing_run_hint(path)}")
    summaries = {label: run_summary(path) for label, path in paths.items()}
    if not all(summaries.values()):  # timed numbers only where both runs have them
        summaries = dict.fromkeys(BEFORE_AFTER, {})
    runs = {label: analyze_run(path, summaries[label]) for label, path in paths.items()}
    comparison = side_by_side(runs, "before vs after", keep_detail)
    comparison["ranks"] = dict.fromkeys(BEFORE_AFTER)
    comparison["warnings"] = before_after_warnings(comparison) + comparison["warnings"]
    return comparison


def side_by_side(runs: dict, title: str, keep_detail: bool) -> dict:
    """The comparison of two analysed runs ({label: analyze_run's}), in the order given: the
    second over the first for throughput and peak memory, what changed, the parts of the step
    per step, what still bounds the later one, and the warnings."""
    labels = tuple(runs)
    details = [runs[label]["detail"] for label in labels]
    changed = what_changed(*(time_by_name(d.columns, d.window, d.steps.size,
                                          host_window=d.host_window,
                                          compiling=compiling_operators(d.columns))
                             for d in details),
                           labels=labels)
    frames = frames_changed(details, labels)
    if frames is not None:
        changed["frames"] = frames
    if not keep_detail:
        for label in labels:
            del runs[label]["detail"]
    old, new = (runs[label]["summary"] for label in labels)
    # A pair whose batches vary in length (padding_waste) is judged by real tokens/s: its samples
    # differ in size from step to step, and padding is work that trains nothing. An inference
    # pair by what it is for (its summaries' rated_by): generated tokens/s and the per-token
    # time for generation, requests/s and latency for serving.
    rated_by = old.get("rated_by") if old.get("rated_by") == new.get("rated_by") else None
    by_tokens = old.get("tokens_per_s") is not None and new.get("tokens_per_s") is not None
    throughput = (rated_by["throughput"] if rated_by
                  else "tokens_per_s" if by_tokens else "samples_per_s")
    latency = rated_by["latency"] if rated_by else None
    comparison = {
        "demo": title, "variants": labels, **runs,
        "speedup": ratio(new.get(throughput), old.get(throughput)),
        "speedup_of": (GENERATED_TOKENS_LABEL if rated_by and throughput == "tokens_per_s"
                       else THROUGHPUT_LABELS[throughput]),
        # new ÷ old p50 latency (lower is better), for an inference pair; null for training
        "latency_ratio": (ratio((new.get(latency) or {}).get("p50"),
                                (old.get(latency) or {}).get("p50")) if latency else None),
        "latency_of": LATENCY_LABELS.get(latency),
        "peak_memory_ratio": ratio(new.get("peak_memory_mb"), old.get("peak_memory_mb")),
        # Per variant, null where an older summary lacks them.
        "data_wait_pct": {v: runs[v]["summary"].get("data_wait_pct") for v in labels},
        "profiler_overhead_ratio": {v: recorded.profiler_overhead_ratio(runs[v]["summary"])
                                    for v in labels},
        "gpu_busy_ratio": {v: recorded.gpu_busy_ratio(runs[v]["summary"], runs[v]["analysis"])
                           for v in labels},
        "step_parts_ms": {v: step_parts_ms(runs[v]["analysis"]) for v in labels},
        "still_bounds": still_bounds(runs[labels[-1]]["analysis"]),
        "what_changed": changed}
    comparison["warnings"] = profiler_warnings(comparison) + [
        f"{v}: {line}" for v in labels for line in runs[v]["analysis"]["warnings"]]
    return comparison


def step_parts_ms(analysis: dict) -> dict[str, float]:
    """The step's parts in ms per step: the breakdown (each instant once: kernel, memcpy,
    memset, runtime, DataLoader, CPU exec, other) and, on a GPU trace, its idle time by cause
    (GPU idle: dataloader, GPU idle: tokenize (a host region, by name), ...), each idle share of
    the window as ms of the mean step; on a CPU-only trace, the host regions' time (host region:
    tokenize), which lies across the breakdown's parts (mostly "other")."""
    parts = dict(analysis["step_breakdown_ms"])
    gpu = analysis["gpu"]
    if gpu:
        step_ms = analysis["window_ms"] / analysis["steps"]
        parts.update({f"GPU idle: {cause}": pct / 100.0 * step_ms
                      for cause, pct in gpu["idle_by_cause_pct"].items()})
    else:
        parts.update({f"host region: {name}": region["ms_per_step"]
                      for name, region in (analysis.get("host_regions") or {}).items()})
    return parts


# On a GPU trace, what holds the step: the GPU's own work, or the cause of its idle time
# (idle_causes.IDLE_CAUSES), in words.
BOUND_WORDS = {
    "busy": "the GPU's own work: faster kernels (precision, fusion, attention) shorten the step",
    "dataloader": "the GPU waiting for the DataLoader",
    "host_sync": "the GPU drained for host syncs (.item(), .cpu(), a blocking copy)",
    "before_first_op": "the GPU waiting for its first op of the window",
    "launch": "the GPU waiting for the host to enqueue work (Python, dispatch, launch calls)",
    "other": "the GPU waiting with work queued (another stream, an event, another rank)",
    "unrecorded": "work launched before the recording, which the trace does not hold"}
# A host region's cause (idle_causes.host_regions), by its name.
REGION_BOUND_WORDS = "the GPU waiting for host work in region {name}"
# On a CPU-only trace, what each part of the step breakdown means.
PART_WORDS = {
    "dataloader": "waiting for batches", "cpu_exec": "the CPU's operators",
    "other": "the host outside operators (Python, waits)", "runtime": "runtime calls",
    "kernel": "kernels", "memcpy": "copies", "memset": "memsets"}


def still_bounds(analysis: dict) -> str:
    """What holds the step now. On a GPU trace the largest of the GPU's busy share and each idle
    cause's; on a CPU trace the largest part of the step breakdown; then the verdicts that fired
    (ids), which say what to do."""
    gpu = analysis["gpu"]
    regions = analysis.get("host_regions") or {}
    if gpu:
        shares = {"busy": gpu["utilization_pct"], **gpu["idle_by_cause_pct"]}
        largest = max(shares, key=shares.get)
        words = BOUND_WORDS.get(largest) or REGION_BOUND_WORDS.format(name=largest)
        text = f"{words} ({shares[largest]:.0f} % of the steps)"
    else:
        parts = analysis["step_breakdown_ms"]
        largest = max(parts, key=parts.get)
        total_ms = sum(parts.values()) or 1.0
        text = f"{PART_WORDS[largest]} ({100.0 * parts[largest] / total_ms:.0f} % of the steps)"
        if regions:  # the largest host region, which the parts above split (mostly "other")
            name, region = next(iter(regions.items()))
            text += f"; host region {name} holds {region['pct']:.0f} % of the steps"
    verdicts = ", ".join(found["id"] for found in analysis["findings"])
    return text + (f"; verdicts: {verdicts}" if verdicts else "; no verdict fired")


# Below this many profiled steps, one slow step moves the p50 (3 steps: the p50 is one step)
# and a difference in step time is not a result; torch.profiler's default schedule records
# 3 (ours too, for timing we use the unprofiled phase). 5 is the smallest count whose p50 has two
# steps on each side.
FEW_STEPS = 5


def before_after_warnings(comparison: dict) -> list[str]:
    """Why two runs' step times may not compare: few steps, a wide spread (the timed phase's
    where a summary has it, else the trace's), other hardware."""
    warnings = []
    for label in comparison["variants"]:
        summary, analysis = comparison[label]["summary"], comparison[label]["analysis"]
        if not summary and analysis["steps"] < FEW_STEPS:
            warnings.append(f"{label}: {analysis['steps']} step(s) in the trace (fewer than "
                            f"{FEW_STEPS}): its step time is a sample of one or two, so compare "
                            f"the parts of the step, not its total")
        p50, p95 = ((summary["step_ms_p50"], summary["step_ms_p95"]) if summary
                    else (analysis["step_ms"]["p50"], analysis["step_ms"]["p95"]))
        if p50 and p95 / p50 > recorded.STEP_SPREAD_MAX:
            warnings.append(f"{label}: steps vary (p95 {p95:.1f} ms is {p95 / p50:.2f}x the p50 "
                            f"{p50:.1f} ms; warn above {recorded.STEP_SPREAD_MAX}x): one run's "
                            f"mean says little, measure more steps")
    old, new = (comparison[label]["analysis"] for label in comparison["variants"])
    if (old["device"], old["gpu_name"]) != (new["device"], new["gpu_name"]):
        warnings.append(f"the runs are on different devices ({old['device']} "
                        f"{old['gpu_name'] or ''} vs {new['device']} {new['gpu_name'] or ''}): "
                        f"every change includes the hardware's")
    return warnings


WHAT_CHANGED_SHOWN = 8  # operators and kernels listed each, the largest change in ms/step first


def what_changed(bad: TimeByName, fixed: TimeByName,
                 labels: tuple[str, str] = VARIANTS) -> dict[str, list[dict]]:
    """The operators and kernels whose total time per step changed most from bad to fixed (HTA's
    trace_diff, per step): name, ms per step and calls per step in each (0 where a name is
    absent), keyed by `labels` ("bad_ms_per_step", or "before_..." for any two runs). Operator
    times are self times (trace_steps.self_time_us: the operators a parent holds on its thread are
    taken off its time); kernels are those the recorded steps ran (trace_steps.kernels_of_steps);
    compiling is torch.compile's ranges and what they hold, by self time (no operator)."""
    return {kind: changed_rows(getattr(bad, kind), getattr(fixed, kind), labels)
            for kind in ("operators", "kernels", "compiling")}


def changed_rows(before: dict, after: dict, labels: tuple[str, str]) -> list[dict]:
    """{name: (ms per step, calls per step)} twice -> the WHAT_CHANGED_SHOWN rows whose time
    changed most."""
    old, new = labels
    rows = []
    for name in before.keys() | after.keys():
        bad_ms, bad_calls = before.get(name, (0.0, 0.0))
        fixed_ms, fixed_calls = after.get(name, (0.0, 0.0))
        rows.append({"name": name, f"{old}_ms_per_step": bad_ms, f"{new}_ms_per_step": fixed_ms,
                     f"{old}_calls_per_step": bad_calls, f"{new}_calls_per_step": fixed_calls})
    rows.sort(key=lambda row: (-abs(row[f"{new}_ms_per_step"] - row[f"{old}_ms_per_step"]),
                               row["name"]))
    return rows[:WHAT_CHANGED_SHOWN]


def frames_changed(details: list, labels: tuple[str, str]) -> list[dict] | None:
    """Python frames by self time per step (analyze's frame_times), where a run's trace has them
    (--with-stack); None where neither has."""
    times = [d.frames.times if d.frames else {} for d in details]
    return changed_rows(*times, labels) if any(times) else None


def inference(run: dict) -> bool:
    return run["summary"].get("unit") == "request"


def gpu_value(name: str):
    return lambda run: (run["analysis"]["gpu"] or {}).get(name)


# (label, how to read it from one variant, format, which way is better: +1 higher, -1 lower, 0
# neither). Summary numbers first (the timed phase), then the trace's.
ROWS = [
    ("samples/s", lambda run: None if inference(run) else run["summary"].get("samples_per_s"),
     ".1f", 1),
    ("real tokens/s", lambda run: None if inference(run) else run["summary"].get("tokens_per_s"),
     ".0f", 1),
    # An inference run's (summary unit "request"): throughput, latency on the host clock, and
    # for generation the tokens' times on the device's clock.
    ("requests/s", lambda run: run["summary"].get("requests_per_s"), ".2f", 1),
    (GENERATED_TOKENS_LABEL, lambda run: run["summary"].get("tokens_per_s") if inference(run)
     else None, ".0f", 1),
    *((f"{label} ms", lambda run, key=key, q=q: (run["summary"].get(key) or {}).get(q), ".2f", -1)
      for label, key, q in (("latency p50", "latency_ms", "p50"),
                            ("latency p99", "latency_ms", "p99"),
                            ("first token p50", "time_to_first_token_ms", "p50"),
                            ("per token p50", "per_token_ms", "p50"),
                            ("per token p99", "per_token_ms", "p99"))),
    ("padding %", lambda run: run["summary"].get("padding_pct"), ".1f", -1),
    ("step p50 ms", lambda run: run["summary"].get("step_ms_p50"), ".1f", -1),
    ("step p95 ms", lambda run: run["summary"].get("step_ms_p95"), ".1f", -1),
    ("peak memory MB", lambda run: run["summary"].get("peak_memory_mb"), ".1f", -1),
    # The caching allocator's peak (torch.cuda.max_memory_reserved; a GPU run's only).
    ("peak reserved MB", lambda run: run["summary"].get("peak_reserved_mb"), ".1f", -1),
    ("data wait %", lambda run: run["summary"].get("data_wait_pct"), ".1f", -1),
    ("profiled/timed step", lambda run: recorded.profiler_overhead_ratio(run["summary"]), ".2f", 0),
    # The recorded steps' time, for runs without a timed phase (traces from elsewhere).
    ("trace step p50 ms", lambda run: None if run["summary"] else run["analysis"]["step_ms"]["p50"],
     ".1f", -1),
    ("trace step p95 ms", lambda run: None if run["summary"] else run["analysis"]["step_ms"]["p95"],
     ".1f", -1),
    ("trace peak memory MB",
     lambda run: None if run["summary"] else run["analysis"]["peak_memory_mb"], ".1f", -1),
    # Memory allocated at the recorded steps' ends, its least-squares slope (memory.py; null
    # from fewer than memory.GROWTH_FIT_MIN_STEPS steps or without memory events).
    ("memory growth MB/step",
     lambda run: (run["analysis"].get("memory") or {}).get("growth_mb_per_step"), ".2f", -1),
    ("DataLoader %", lambda run: run["analysis"]["dataloader_pct"], ".1f", -1),
    # The optimizer's two sides, each one definition applied to both runs (metrics.
    # optimizer_metrics): the CPU's time in its region outside runtime calls, and the region's
    # span on the GPU timeline.
    *((f"optimizer {side} ms/step",
       lambda run, key=key: (run["analysis"].get("optimizer") or {}).get(key), ".1f", -1)
      for side, key in (("CPU", "cpu_ms_per_step"), ("GPU", "gpu_ms_per_step"))),
    ("GPU utilization %", gpu_value("utilization_pct"), ".1f", 1),
    ("GPU idle %", gpu_value("idle_pct"), ".1f", -1),  # the window's: what the rows below split
    *((f"GPU idle: {analyze.IDLE_CAUSE_LABELS[cause]} %",
       lambda run, cause=cause: (gpu_value("idle_by_cause_pct")(run) or {}).get(cause), ".1f", -1)
      for cause in analyze.IDLE_CAUSES),
    ("kernels/step", gpu_value("kernels_per_step"), ".0f", 0),
    ("median kernel us", gpu_value("median_kernel_us"), ".1f", 0),
    ("launches/step", gpu_value("launches_per_step"), ".0f", 0),
    ("syncs/step", gpu_value("syncs_per_step"), ".1f", -1),
    ("tensor cores % of kernel time", gpu_value("tensor_core_pct"), ".0f", 1),
    ("tensor cores % of GEMM time", gpu_value("tensor_core_gemm_pct"), ".0f", 1),
]


# Rows that count events per recorded step in the trace: from a few steps, the count says how many.
COUNT_ROWS = ("kernels/step", "launches/step", "syncs/step")
# A factor above this reads "over 1000x": a share near zero on one side gave "5161.05x lower".
RATIO_SHOWN_MAX = 1000.0
# Rows shown as n/a rather than left out when neither summary has them: the harness's newer
# fields, absent from older summaries (the reader learns the run predates them). Not for runs
# with no summary at all (traces from elsewhere): they have no timed phase to miss.
ALWAYS_SHOWN_ROWS = ("data wait %", "profiled/timed step")
# Rows with no change column: a ratio of two ratios (the profiler's overhead) reads as a change
# of the run where there is none.
NO_CHANGE_ROWS = ("profiled/timed step",)


def change_header(comparison: dict) -> str:
    old, new = comparison["variants"]
    return f"{new} vs {old}"


def table_rows(comparison: dict) -> list[tuple[str, str, str, str]]:
    """(label, bad, fixed, the change in words) as text; rows with no value in either variant
    are left out (a CPU run has no GPU rows), but for ALWAYS_SHOWN_ROWS where the runs have
    summaries."""
    labels = comparison["variants"]
    has_summaries = any(comparison[v]["summary"] for v in labels)
    rows = []
    for label, read, spec, better in ROWS:
        bad, fixed = (read(comparison[v]) for v in labels)
        if bad is None and fixed is None and not (label in ALWAYS_SHOWN_ROWS and has_summaries):
            continue
        shown = ["n/a" if x is None else f"{x:{spec}}" for x in (bad, fixed)]
        steps = tuple(comparison[v]["analysis"]["steps"] for v in labels)
        change = "" if label in NO_CHANGE_ROWS else row_change(label, (bad, fixed), spec, better,
                                                               steps)
        rows.append((label, *shown, change))
    verdicts = [analyze.verdict_ids(comparison[v]["analysis"]) for v in labels]
    rows.append(("verdicts", *verdicts, ""))
    return rows


AUTOCAST_NAMES = {"bfloat16": "BF16", "float16": "FP16"}  # torch dtype -> how tables say it


# What TF32 was allowed for (the summary's config, harness.tf32_in_force), in a label's words.
TF32_WORDS = {(True, False): "TF32 matmuls", (False, True): "TF32 convolutions",
              (True, True): "TF32 matmuls and convolutions"}


def precision(summary: dict, analysis: dict | None = None) -> str:
    """A run's math precision: "BF16 autocast" from its summary's config, or "BF16 weights"
    where the model itself was cast (config "dtype": the serving pairs on a GPU); else FP32, with
    TF32 where the trace holds TF32 kernels (gpu.tf32_pct; `analysis`), for what the config
    allowed ("FP32, TF32 convolutions": cuDNN's default, the ResNet pairs on a GPU), or "FP32,
    TF32 kernels" where the config does not say. Without `analysis`, the config alone."""
    config = summary.get("config") or {}
    dtype = config.get("autocast_dtype")
    if dtype:
        return f"{AUTOCAST_NAMES.get(dtype, dtype)} autocast"
    if config.get("dtype") in AUTOCAST_NAMES:  # the weights themselves in 16 bits
        return f"{AUTOCAST_NAMES[config['dtype']]} weights"
    allowed = (bool(config.get("tf32_matmul")), bool(config.get("tf32_cudnn")))
    if analysis is None:
        return "FP32, TF32 matmuls" if allowed[0] else "FP32"
    if not (analysis.get("gpu") or {}).get("tf32_pct"):
        return "FP32"
    return f"FP32, {TF32_WORDS.get(allowed, 'TF32 kernels')}"


def conditions(comparison: dict) -> str:
    """The run's conditions: device, torch, preset, batch, timed steps (from the summaries);
    for runs without them, each trace's device and recorded steps."""
    labels = comparison["variants"]
    bad, fixed = (comparison[v]["summary"] for v in labels)
    if not bad:
        return "; ".join(
            f"{v}: {run['analysis']['trace']} ({run['analysis']['device']}"
            + (f", {run['analysis']['gpu_name']}" if run["analysis"]["gpu_name"] else "")
            + f", {run['analysis']['steps']} recorded step(s))"
            for v, run in ((v, comparison[v]) for v in labels))
    batch = (str(bad.get("batch_size")) if bad.get("batch_size") == fixed.get("batch_size")
             else f"{bad.get('batch_size')} ({labels[0]}) / {fixed.get('batch_size')} "
                  f"({labels[1]})")
    # One run date, the first variant's, where both ran the same day; else each its own (a
    # variant run again on a later day: the H100 reference's dataloader_workers/fixed).
    when = [summary.get("created_utc") or "n/a" for summary in (bad, fixed)]
    run = (f"run {when[0]}" if when[0][:10] == when[1][:10]
           else f"runs {when[0]} ({labels[0]}) and {when[1]} ({labels[1]})")
    return (f"{bad.get('device')} ({bad.get('device_name')}), torch {bad.get('torch_version')}, "
            f"preset {bad.get('preset')}, batch {batch}, {bad.get('steps')} timed steps, {run}")


def notes(comparison: dict) -> list[str]:
    """Notes a demo's summary carries (e.g. why a CPU cannot show the effect)."""
    found = []
    for variant in comparison["variants"]:
        summary = comparison[variant]["summary"]
        for key in ("note", "notes"):
            value = summary.get(key)
            for text in ([value] if isinstance(value, str) else value or []):
                if text and text not in found:
                    found.append(str(text))
    return found


def step_parts_rows(comparison: dict) -> list[tuple[str, str, str, str]]:
    """(part, ms per step in each run, the change in ms): the step's parts (step_parts_ms),
    those under 0.05 ms in both left out."""
    labels = comparison["variants"]
    old, new = (comparison["step_parts_ms"][v] for v in labels)
    rows = []
    for part in old.keys() | new.keys():
        a, b = old.get(part, 0.0), new.get(part, 0.0)
        if max(a, b) >= 0.05:
            rows.append((part, f"{a:.2f}", f"{b:.2f}", f"{b - a:+.2f} ms"))
    # The host regions' rows (GPU idle: <region>, host region: <region>) after the DataLoader's,
    # in the order of precedence of the idle causes.
    order = [*BREAKDOWN_ROLES, f"GPU idle: {analyze.IDLE_CAUSES[0]}", None,
             *(f"GPU idle: {c}" for c in analyze.IDLE_CAUSES[1:])]

    def place(row: tuple) -> tuple[int, str]:
        return (order.index(row[0] if row[0] in order else None), row[0])
    return sorted(rows, key=place)


def format_text(comparison: dict) -> str:
    labels = comparison["variants"]
    rows = [("", *labels, change_header(comparison))] + table_rows(comparison)
    lines = [f"{comparison['demo']}: {conditions(comparison)}"]
    lines += analyze.text_table(rows, right=(1, 2))
    if headline(comparison):
        lines.append(f"  {change_header(comparison)}: {headline(comparison)}")
    if labels == BEFORE_AFTER:  # no demo's walkthrough beside it: the parts of the step
        parts = [("per step, ms", *labels, "change")] + step_parts_rows(comparison)
        lines += analyze.text_table(parts, right=(1, 2, 3))
    for variant in labels:
        for found in comparison[variant]["analysis"]["findings"]:
            lines.append(f"  {variant}: [{found['severity']}] {found['id']}: {found['evidence']}")
    if labels == BEFORE_AFTER:
        lines.append(f"  still bounds the step ({labels[1]}): {comparison['still_bounds']}")
    lines += [f"  {line}" for line in rank_lines(comparison)]
    lines += what_changed_lines(comparison["what_changed"], labels)
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


def short_name(name: str, keep_end: bool = False) -> str:
    """At most NAME_SHOWN_CHARS: the start, or for a Python frame (`keep_end`) the start and the
    end, where the file and line of "... called at demos/host_roundtrip/bad.py:28" are."""
    if len(name) <= NAME_SHOWN_CHARS:
        return name
    if not keep_end:
        return name[:NAME_SHOWN_CHARS - 3] + "..."
    tail = NAME_SHOWN_CHARS // 2
    return name[:NAME_SHOWN_CHARS - 3 - tail] + "..." + name[-tail:]


def what_changed_rows(changed: dict, labels: tuple[str, str] = VARIANTS
                      ) -> list[tuple[str, str, str, str, str]]:
    """(kind, name, bad ms/step, fixed ms/step, calls/step bad -> fixed) as text."""
    old, new = labels
    rows = []
    for kind, label in (("operators", "operator"), ("kernels", "kernel"),
                        ("compiling", "compiling"), ("frames", "python")):
        for row in changed.get(kind, []):
            rows.append((label, short_name(row["name"], keep_end=label == "python"),
                         f"{row[f'{old}_ms_per_step']:.2f}",
                         f"{row[f'{new}_ms_per_step']:.2f}",
                         f"{row[f'{old}_calls_per_step']:.1f} -> "
                         f"{row[f'{new}_calls_per_step']:.1f}"))
    return rows


def what_changed_lines(changed: dict, labels: tuple[str, str] = VARIANTS) -> list[str]:
    rows = what_changed_rows(changed, labels)
    if not rows:
        return []
    rows = [("", "what changed most (time per step)", f"{labels[0]} ms", f"{labels[1]} ms",
             "calls/step")] + rows
    return analyze.text_table(rows, right=(2, 3))


def main(argv: list[str] | None = None) -> int:
    parser = trace.OneLineArgumentParser(
        prog="python -m common.compare",
        usage="%(prog)s [--json] DEMO_DIR\n       %(prog)s [--json] BEFORE AFTER\n       "
              "%(prog)s [--json] LADDER_DIR",
        description="Two runs side by side. DEMO_DIR: a demo's bad and fixed runs (throughput, "
                    "step time, data wait, profiler overhead, GPU utilization and idle by cause, "
                    "kernels, syncs, peak memory, the verdicts, what changed). BEFORE AFTER: any "
                    "two traces or run folders, yours or anyone's: the same from the traces, "
                    "the parts of the step as per-step changes, and what still bounds the step. "
                    "LADDER_DIR: the ladder's rungs (rung0_baseline/, rung1_workers/, ...): "
                    "each rung's samples/s, its gain over the rung before and over rung 0, its "
                    "verdicts, and whether its top verdict names the next rung's fix; the "
                    "memory ladder's: each rung's peaks against the budget, whether it fits, "
                    "and its samples/s.",
        epilog="Exit code 2 when a path holds no readable trace, when DEMO_DIR/bad or "
               "DEMO_DIR/fixed lacks a summary or a trace, or when a demo's two runs ran on a "
               "different device, machine, preset or torch version.")
    parser.add_argument("paths", metavar="PATH", type=Path, nargs="+",
                        help="DEMO_DIR (e.g. traces/dataloader_workers, holding bad/ and fixed/), "
                             "or BEFORE AFTER (each a .pt.trace.json[.gz] or a folder holding one)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object: variants (the two labels), each run's summary and "
                             "analysis, speedup (the second run over the first, of speedup_of: "
                             "samples/s, or real tokens/s for a pair that counts them; null "
                             "without summaries), peak_memory_ratio, data_wait_pct and "
                             "profiler_overhead_ratio and gpu_busy_ratio (the GPU's "
                             "busy time a recorded step over the timed step p50) per run, "
                             "step_parts_ms per run, "
                             "still_bounds, what_changed (operators, kernels, compiling), warnings")
    flags = parser.parse_args(argv)
    if len(flags.paths) > 2:
        parser.error(f"one DEMO_DIR or two runs (BEFORE AFTER), not {len(flags.paths)} paths")
    try:  # a rung or run without its trace, or runs that differ: one line, exit 2
        if len(flags.paths) == 1 and ladder.is_memory_ladder(flags.paths[0]):
            rows = ladder.memory_rows(flags.paths[0])
            return analyze.print_output(json.dumps({"memory_ladder": rows}, indent=2)
                                        if flags.json else ladder.format_memory_table(rows))
        if len(flags.paths) == 1 and ladder.is_ladder(flags.paths[0]):  # rungs, not a pair
            rows = ladder.ladder_rows(flags.paths[0])
            return analyze.print_output(json.dumps({"ladder": rows}, indent=2) if flags.json
                                        else ladder.format_waterfall(rows))
        comparison = (compare(flags.paths[0]) if len(flags.paths) == 1
                      else compare_runs(*flags.paths))
    except (CompareError, trace.TraceError) as error:
        print(f"compare: {error}", file=sys.stderr)
        return 2
    return analyze.print_output(json.dumps(comparison, indent=2) if flags.json
                                else format_text(comparison))


if __name__ == "__main__":
    sys.exit(main())
