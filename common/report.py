"""The bad-vs-fixed report: REPORT.md and a self-contained report.html under the output root.

    python -m common.report [OUT] [DEMO ...]

For each pair: the comparison table (common.compare), the verdicts, a per-step time breakdown,
a timeline of each variant (GPU busy, or the CPU's step regions on a CPU-only trace) and, where
memory is the point, memory over time. For each ladder (rung runs, common/ladder.py): its
waterfall as compare prints it, and as a chart (waterfall_figure, which the ladder's walkthrough
shows too). The HTML inlines its plots as PNG data URIs and needs no network (the TensorBoard
plugin's charts load from the internet). The PNGs are also written to
OUT/report_files/ for REPORT.md. Imports no torch.

./scripts/run_demos.sh rewrites both files at the end of every run, from that run only: a pair
that failed is listed as failed, with no numbers; pairs not run this time are named as left over
from earlier runs, never shown as current; report_files/ is emptied of old plots first.
"""
from __future__ import annotations

import base64
import html
import json
import os
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display, no GUI toolkit
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from common import analyze, compare, intervals, ladder, trace, trace_steps  # noqa: E402
from common.trace_columns import DATALOADER_REGION  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
REPORT_MD = "REPORT.md"
REPORT_HTML = "report.html"
FIGURES_DIR = "report_files"
# Pairs whose lesson is memory: their sections get a memory-over-time plot and the memory view
# (any pair whose trace draws a MEMORY_VERDICTS verdict gets them too).
MEMORY_CURVE_DEMOS = ("activation_checkpointing", "mixed_precision", "naive_attention",
                      "memory_leak", "fragmentation")
MEMORY_VERDICTS = ("activation_memory", "memory_growth")
FIGURE_DPI = 110  # ~1100 px wide figures: sharp in a browser, ~50 KB each
# The timeline draws each row as the share of each column of time it is busy, the column's height
# in the row: a kernel narrower than a pixel then shows as the sliver it is (a span drawn a pixel
# wide would paint a GPU 18 % busy as full), and 100 000 kernels cost no more than ten. About one
# column per pixel of the axes at FIGURE_DPI.
TIMELINE_COLUMNS = 1000
# Room above the tallest stacked bar, as a share of it: matplotlib pins the axis to the top bar's
# own bottom edge (a "sticky edge"), which cut the tallest stacks off at the frame.
BAR_HEADROOM = 0.08
ROLE_COLORS = {"kernel": "#2e7d32", "memcpy": "#f9a825", "memset": "#8d6e63",
               "runtime": "#6a1b9a", "dataloader": "#c62828", "cpu_exec": "#1565c0",
               "other": "#bdbdbd"}
REGION_COLORS = {DATALOADER_REGION: "#c62828", "data": "#ef9a9a", "forward": "#1565c0",
                 "backward": "#64b5f6", "optimizer": "#6a1b9a"}
VARIANT_COLORS = {"bad": "#c62828", "fixed": "#2e7d32"}
WHAT_CHANGED_NOTE = ("operators by self time, kernels by total time, the largest changes "
                     "first: python -m common.compare")
TIMELINE_ROWS = ("data", DATALOADER_REGION, "forward", "backward", "optimizer")


# A section's kind: a bad and a fixed run, a ladder's rungs, or the memory ladder's (which fit)
PAIR, LADDER, MEMORY_LADDER = "pair", "ladder", "memory_ladder"
LADDER_KINDS = (LADDER, MEMORY_LADDER)


@dataclass
class Section:
    demo: str
    status: str  # "ok", or why there are no numbers: "failed", "missing", "stale"
    reason: str = ""
    comparison: dict | None = None
    figures: list[tuple[str, Path]] = field(default_factory=list)  # (caption, png)
    kind: str = PAIR
    # A ladder's ladder.ladder_rows (kind LADDER, "ok"), or ladder.memory_rows (MEMORY_LADDER)
    ladder_rows: list[dict] | None = None


# --- Plots. ---------------------------------------------------------------------------------------

def breakdown_figure(analyses: dict[str, analyze.Analysis], title: str):
    """Stacked bars, one per profiled step of each variant: where its time goes (ms), with the
    TensorBoard plugin's priority (kernel > memcpy > memset > runtime > DataLoader > CPU >
    other)."""
    labels, rows = [], []
    for variant, analysis in analyses.items():
        for index, row in enumerate(analysis.breakdown_ms, start=1):
            labels.append(f"{variant}\nstep {index}")
            rows.append(row)
    table = np.array(rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(labels) + 2), 4.2))
    bottom = np.zeros(len(labels))
    for index, role in enumerate(trace_steps.BREAKDOWN_ROLES):
        if table[:, index].any():
            ax.bar(labels, table[:, index], bottom=bottom, color=ROLE_COLORS[role],
                   label=role.replace("_", " "))
            bottom += table[:, index]
    ax.set_ylim(0, bottom.max() * (1 + BAR_HEADROOM) or 1.0)
    ax.set_ylabel("ms per step")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


IDLE_COLORS = {"busy": "#2e7d32", "dataloader": "#c62828", "host_sync": "#ef6c00",
               "before_first_op": "#90caf9",
               "launch": "#6a1b9a", "other": "#bdbdbd", "unrecorded": "#e0e0e0"}
# Host regions (idle causes by name), in turn: reds and browns, near the DataLoader's (host work).
HOST_REGION_COLORS = ("#8d6e63", "#f06292", "#a1887f", "#ad1457", "#d7ccc8")


# Causes by name (host regions, host operators) under this share of the window in every run are
# drawn as one part: a legend of a dozen operators at 0.1-0.3 % each says nothing a bar can show.
NAMED_CAUSE_SHOWN_MIN_PCT = 1.0  # % of the window
FOLDED_PART = "named host work, each under 1 %"


def idle_parts(analyses: dict[str, analyze.Analysis]) -> dict[str, list[float]]:
    """Per part of the idle bars, each run's width (% of its window): "busy" (utilization), then
    each idle cause in analyze.idle_causes' order, the named ones under NAMED_CAUSE_SHOWN_MIN_PCT
    in every run summed into FOLDED_PART, where the first of them stood."""
    idle = [a.result["gpu"]["idle_by_cause_pct"] for a in analyses.values()]
    parts = {"busy": [a.result["gpu"]["utilization_pct"] for a in analyses.values()]}
    for cause in analyze.idle_causes(*idle):  # every run's host regions too, after the DataLoader
        widths = [i.get(cause, 0.0) for i in idle]
        if cause in analyze.IDLE_CAUSES or max(widths) >= NAMED_CAUSE_SHOWN_MIN_PCT:
            parts[cause] = widths
        else:
            folded = parts.setdefault(FOLDED_PART, [0.0] * len(widths))
            parts[FOLDED_PART] = [a + b for a, b in zip(folded, widths)]
    return parts


def idle_figure(analyses: dict[str, analyze.Analysis], title: str):
    """One bar per variant, 100 % of its profiled steps: the GPU busy (kernels, copies, memsets)
    and its idle time by cause (gpu.idle_by_cause_pct; idle_parts)."""
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.7 * len(analyses)))
    labels = list(analyses)
    left = np.zeros(len(labels))
    parts = idle_parts(analyses)
    regions = iter(HOST_REGION_COLORS * len(parts))
    for part, widths in parts.items():
        name = ("GPU busy" if part == "busy" else "unrecorded: work launched before the recording"
                if part == "unrecorded" else f"idle: {FOLDED_PART}" if part == FOLDED_PART
                else f"idle: {analyze.idle_cause_label(part)}")
        color = IDLE_COLORS.get(part) or next(regions)
        ax.barh(labels, widths, left=left, color=color, label=name)
        left += widths
    ax.set_xlim(0, 100)
    ax.invert_yaxis()  # bad on top
    ax.set_xlabel("% of the profiled steps")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def busy_share(spans: intervals.Spans, edges_us: np.ndarray) -> np.ndarray:
    """For each column between consecutive edges, the share of it that `spans` cover (0..1)."""
    covered = intervals.covered_length(intervals.merge(spans), edges_us[:-1], edges_us[1:])
    return covered / np.diff(edges_us)


def timeline_figure(analyses: dict[str, analyze.Analysis], title: str):
    """One row per variant's CPU regions (in its host steps) and, when the trace has GPU work, a
    GPU-busy row (union of kernels, in the steps that follow the GPU), each drawn as the share of
    every column of time it is busy (TIMELINE_COLUMNS). Same time scale for every variant, from
    the earlier of its first host step's and first extended step's start: a CPU that runs ahead
    of the GPU shows its regions before the kernels they launched."""
    def extent(a: analyze.Analysis) -> tuple[float, float]:
        return min(a.host_window[0], a.window[0]), max(a.host_window[1], a.window[1])

    longest_ms = max((high - low) / trace_steps.US_PER_MS
                     for low, high in map(extent, analyses.values()))
    edges_ms = np.linspace(0, longest_ms, TIMELINE_COLUMNS + 1)
    fig, axes = plt.subplots(len(analyses), 1, figsize=(11, 1.0 + 1.7 * len(analyses)),
                             squeeze=False)
    for ax, (variant, analysis) in zip(axes[:, 0], analyses.items()):
        origin = extent(analysis)[0]
        rows = [(name, analysis.regions[name], analysis.host_window) for name in TIMELINE_ROWS
                if name in analysis.regions and analysis.regions[name].size]
        has_gpu = analysis.result["gpu"] is not None
        if has_gpu:
            rows.append(("GPU kernels", analysis.kernel_busy, analysis.window))
        for y, (name, spans, window) in enumerate(rows):
            share = busy_share(intervals.clip(spans, *window),
                               origin + edges_ms * trace_steps.US_PER_MS)
            # Rows grow up from their baseline (y + 0.4: the y axis runs top down).
            ax.fill_between(edges_ms, y + 0.4, y + 0.4 - 0.8 * np.r_[share, share[-1]],
                            step="post", lw=0, color=REGION_COLORS.get(name, "#2e7d32"))
        for edge in np.r_[analysis.steps.start, analysis.steps.end[-1:]]:
            ax.axvline((edge - origin) / trace_steps.US_PER_MS, color="#616161", lw=0.8, ls="--",
                       zorder=0)  # behind the rows: a row shows all it paints
        ax.set_yticks(range(len(rows)), [name for name, _, _ in rows], fontsize=8)
        ax.set_ylim(max(len(rows), 1) - 0.4, -0.6)  # first row on top
        ax.set_xlim(0, longest_ms)
        gpu = analysis.result["gpu"]
        ax.set_title(f"{variant}: GPU utilization {gpu['utilization_pct']:.1f} %" if has_gpu
                     else f"{variant}: CPU-only trace, no GPU timeline - the CPU's step regions",
                     fontsize=9, loc="left")
    column_us = longest_ms / TIMELINE_COLUMNS * trace_steps.US_PER_MS
    axes[-1, 0].set_xlabel(f"ms since the first profiled step (dashed: step boundaries, as the "
                           f"GPU ran them; a row's height: the share of each {column_us:.3g} µs "
                           f"it is busy)")
    fig.suptitle(title, fontsize=10)
    return fig


def memory_figure(analyses: dict[str, analyze.Analysis], title: str):
    """Allocated memory over time for each variant (the trace's device). None if no trace has
    [memory] events (the profiler records them only with profile_memory=True)."""
    if not any(a.memory_mb.size for a in analyses.values()):
        return None
    fig, ax = plt.subplots(figsize=(11, 3.6))
    for variant, analysis in analyses.items():
        if not analysis.memory_mb.size:
            continue
        # Allocations are recorded when the CPU asks for them: time them from the host steps.
        ms = (analysis.memory_ts - analysis.host_window[0]) / trace_steps.US_PER_MS
        device = "GPU" if analysis.result["gpu"] else "CPU"
        ax.step(ms, analysis.memory_mb, where="post", lw=1.2,
                color=VARIANT_COLORS.get(variant),
                label=f"{variant} ({device}, peak {format_mb(analysis.memory_mb.max())})")
    ax.set_xlabel("ms since the first profiled step began on the CPU")
    ax.set_ylabel("allocated MB")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return fig


# The parts of the memory at the allocated peak (memory.peak_breakdown_mb), in the order stacked,
# with their words and colours: what was there before the recorded steps (a GPU's weights and
# optimizer state; a CPU trace counts only what was allocated while the profiler recorded), what
# earlier steps kept, and what the peak's own step allocated, by phase.
PEAK_PARTS = (("before_steps", "held before the recorded steps (0 on a CPU)", "#9e9e9e"),
              ("kept", "kept from earlier steps", "#c62828"),
              ("forward", "forward", "#1565c0"), ("backward", "backward", "#64b5f6"),
              ("optimizer", "optimizer", "#6a1b9a"), ("other", "other", "#bdbdbd"))


def has_memory_view(analyses: dict[str, analyze.Analysis]) -> bool:
    """Whether any variant's trace has memory events in its recorded steps (metrics["memory"])."""
    return any(a.result.get("memory") for a in analyses.values())


def memory_view_figure(analyses: dict[str, analyze.Analysis], title: str):
    """The memory view the TensorBoard plugin used to give, from the trace: memory allocated (and,
    with a caching allocator, reserved, dashed) at each recorded step's end, every variant on one
    scale (a leak is a staircase, a healthy loop a flat line); and beside it what the allocated
    peak is made of. None when no variant has memory events in its steps."""
    if not has_memory_view(analyses):
        return None
    fig, (curve, parts) = plt.subplots(1, 2, figsize=(11, 3.6),
                                       gridspec_kw={"width_ratios": (2, 1)})
    names = []
    for variant, analysis in analyses.items():
        memory = analysis.result.get("memory")
        if not memory:
            continue
        names.append(variant)
        color = VARIANT_COLORS.get(variant)
        at_end = memory["allocated_mb_at_step_end"]
        steps = np.arange(1, len(at_end) + 1)
        growth = memory["growth_mb_per_step"]
        fit = ("" if growth is None else
               f", {growth:+.2f} MB/step, R² {memory['growth_fit_r2']:.2f}")
        curve.plot(steps, at_end, marker="o", ms=3, lw=1.2, color=color,
                   label=f"{variant}: allocated{fit}")
        reserved = memory["reserved_mb_at_step_end"]
        if reserved:
            curve.plot(steps, [np.nan if v is None else v for v in reserved], ls="--", lw=1.0,
                       color=color, label=f"{variant}: reserved")
        bottom = 0.0
        for key, words, part_color in PEAK_PARTS:
            value = memory["peak_breakdown_mb"].get(key) or 0.0
            parts.bar(variant, value, bottom=bottom, color=part_color,
                      label=words if variant == names[0] else None)
            bottom += value
    curve.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    curve.set_xlabel("recorded step")
    curve.set_ylabel("MB at the step's end")
    curve.set_ylim(bottom=0)
    curve.legend(fontsize=8)
    curve.set_title(title, fontsize=10)
    parts.set_ylabel("MB at the allocated peak")
    parts.set_title("what the peak is made of", fontsize=10)
    parts.set_xlim(-0.6, len(names) - 0.4 + 1.2)  # room on the right for the legend
    parts.legend(fontsize=7, loc="upper right")
    return fig


# --- The ladder's waterfall: samples/s per rung. -----------------------------------------------

WATERFALL_BEFORE_COLOR = "#b0bec5"  # what a rung kept of the rung before's: pale, the past
WATERFALL_GAIN_COLOR = VARIANT_COLORS["fixed"]  # what a rung's fix added: green, as a fix
WATERFALL_LOSS_COLOR = VARIANT_COLORS["bad"]  # what a rung lost against the one before: red
WATERFALL_ROW_IN = 0.62  # inches a rung: its bar, and up to three lines of 8 pt words beside it
WATERFALL_EXTRA_IN = 1.5  # inches for the title, the axis and its label, the legend
# The x axis runs past the fastest rung by at least this share of its samples/s, and further
# where a rung's words (three lines of up to ~65 characters at 8 pt, right of its bar) need it:
# fit_waterfall_words measures them.
WATERFALL_WORDS_ROOM = 1.0
WATERFALL_WORDS_PAD = 0.01  # the words' gap from their bar's end, as a share of the x axis
# Room kept right of the longest words, as a share of the axis: the final layout (save's
# tight_layout, after the x ticks change) may narrow the axis by a few pixels.
WATERFALL_WORDS_MARGIN = 0.02


def verdict_words(top: dict | None) -> str:
    """A rung's top verdict, and the pair that teaches its fix: "dataloader (see
    demos/dataloader_workers/)"; "none" where no actionable rule fired."""
    if top is None:
        return "none"
    return top["id"] + (f" (see demos/{top['demo']}/)" if top["demo"] else "")


def waterfall_bars(rows: list[dict]) -> list[dict]:
    """What the waterfall chart draws, a bar per rung of ladder.ladder_rows: its label (rung and
    batch), its samples/s (where the bar ends), the rung before's (where its change starts; None
    on rung 0), and its words: samples/s as ladder.format_waterfall prints it, the gain over
    rung 0 and over the rung before in ladder.ratio_words, and the top verdict."""
    bars = []
    for row in rows:
        before = bars[-1]["samples_per_s"] if bars else None
        speed = f"{row['samples_per_s']:.1f} samples/s"
        verdict = f"top verdict: {verdict_words(row['top'])}"
        if before is None:
            words = (f"{speed}, the baseline", verdict)
        else:
            words = (f"{speed}; vs rung 0: {ladder.ratio_words(row['vs_first'])}",
                     f"vs the rung before: {ladder.ratio_words(row['vs_previous'])}", verdict)
        bars.append({"label": f"{row['rung']}\n(batch {row['batch_size']})",
                     "samples_per_s": row["samples_per_s"], "before": before,
                     "words": "\n".join(words)})
    return bars


def waterfall_figure(rows: list[dict], title: str):
    """The ladder's waterfall (waterfall_bars): a bar of samples/s per rung, rung 0 on top, each
    after the first split at the rung before's samples/s (pale: what it kept of them; green:
    what this rung's fix added; hatched red: what it lost), with its gains and its top verdict
    in words beside it; the dashed line is rung 0's samples/s."""
    bars = waterfall_bars(rows)
    fig, ax = plt.subplots(figsize=(11, WATERFALL_EXTRA_IN + WATERFALL_ROW_IN * len(bars)))
    fastest = max((max(b["samples_per_s"], b["before"] or 0.0) for b in bars), default=1.0)
    right = fastest * (1 + WATERFALL_WORDS_ROOM)
    kept = "samples/s kept from the rung before"
    legend = {}
    for y, bar in enumerate(bars):
        now, before = bar["samples_per_s"], bar["before"]
        if before is None:  # rung 0: nothing before it to split at (its label says which it is)
            ax.barh(y, now, color=WATERFALL_BEFORE_COLOR)
        elif now >= before:
            legend[kept] = ax.barh(y, before, color=WATERFALL_BEFORE_COLOR)
            legend["gained by this rung's fix"] = ax.barh(y, now - before, left=before,
                                                          color=WATERFALL_GAIN_COLOR)
        else:
            legend[kept] = ax.barh(y, now, color=WATERFALL_BEFORE_COLOR)
            legend["lost by this rung"] = ax.barh(y, before - now, left=now, fill=False, lw=0.8,
                                                  hatch="///", edgecolor=WATERFALL_LOSS_COLOR)
        if y + 1 < len(bars):  # the step down to the next rung, where its change starts
            ax.plot([now, now], [y + 0.4, y + 0.6], color="#616161", lw=0.8)
        ax.text(max(now, before or 0.0) + WATERFALL_WORDS_PAD * right, y, bar["words"],
                va="center", ha="left", fontsize=8)
    if bars:
        ax.axvline(bars[0]["samples_per_s"], color="#616161", lw=0.8, ls="--", zorder=0)
    ax.set_yticks(range(len(bars)), [bar["label"] for bar in bars], fontsize=8)
    ax.set_ylim(len(bars) - 0.5, -0.5)  # rung 0 on top
    ax.set_xlim(0, right)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel("samples/s (each rung's timed steps, its summary.json; dashed: rung 0's)",
                  fontsize=8)
    # Top right: the first rungs are the slowest as a rule, their bars and words end soonest.
    ax.legend(list(legend.values()), list(legend), fontsize=8, loc="upper right")
    ax.set_title(title, fontsize=10, loc="left")
    fit_waterfall_words(fig, ax, bars)
    return fig


def fit_waterfall_words(fig, ax, bars: list[dict]) -> None:
    """Widen the x axis until every rung's words end inside it: a word line's width is fixed in
    points, so its share of the axis is measured once the layout is set; a bar ending at `end`
    with words of that share fits where end / right + pad + share + margin <= 1. The words then
    move to their bar's end plus the pad of the new axis."""
    fig.tight_layout()  # the axis' width as save() will lay it out
    renderer = fig.canvas.get_renderer()
    axis_px = ax.get_window_extent(renderer).width
    right = ax.get_xlim()[1]
    ends = [max(bar["samples_per_s"], bar["before"] or 0.0) for bar in bars]
    for end, text in zip(ends, ax.texts):
        room = (1 - WATERFALL_WORDS_PAD - WATERFALL_WORDS_MARGIN
                - text.get_window_extent(renderer).width / axis_px)
        if room <= 0:
            raise ValueError(f"the waterfall's words are wider than its axis: {text.get_text()!r}")
        right = max(right, end / room)
    ax.set_xlim(0, right)
    for end, text in zip(ends, ax.texts):
        text.set_x(end + WATERFALL_WORDS_PAD * right)


# --- The memory ladder: each rung's peak against the budget. --------------------------------

MEMORY_FITS_COLOR = VARIANT_COLORS["fixed"]  # a rung within the budget: green, as a fix
MEMORY_OVER_COLOR = VARIANT_COLORS["bad"]  # over it: red
# A rung that ran out of memory at a GPU's cap has no peak: its bar reaches past the budget line
# by this share of the budget, hatched, to say "more than this" without a number.
MEMORY_OUT_OF_MEMORY_REACH = 1.15
MEMORY_WORDS_ROOM = 0.9  # the x axis runs past the largest bar by this share of it, for words
# Behind the words beside each bar: a bar just short of the budget has its words across the
# dashed line, and a white backing (no edge, a point of padding) keeps them unstruck.
MEMORY_WORDS_BACKING = {"facecolor": "white", "edgecolor": "none", "pad": 1.0}


def memory_ladder_bars(rows: list[dict]) -> list[dict]:
    """What the memory ladder's chart draws, a bar per rung of ladder.memory_rows: its label
    (rung, batch), where its bar ends (the peak held against the budget; a reach past the budget
    for a rung that ran out of memory), whether it fits, and its words, as
    ladder.format_memory_table says them."""
    bars = []
    for row in rows:
        batch = ladder.batch_words(row["batch_size"], row["micro_batches"])
        if row["ran"]:
            words = (f"{ladder.fits_words(row)}; {ladder.peak_memory_words(row['peak_memory_mb'])}",
                     f"{row['samples_per_s']:,.1f} samples/s")
            end = row["peak_mb"]
        else:
            words = ("out of memory at the cap", "no numbers")
            end = row["budget_mb"] * MEMORY_OUT_OF_MEMORY_REACH
        bars.append({"label": f"{row['rung']}\n({batch})", "end_mb": end, "ran": row["ran"],
                     "fits": row["fits"], "words": "\n".join(words)})
    return bars


def memory_ladder_figure(rows: list[dict], title: str):
    """The memory ladder's chart (memory_ladder_bars): a bar per rung, rung 0 on top, of the peak
    held against the budget (green: it fits; red: over it; hatched red: out of memory at the
    cap, no peak), the budget a dashed line, each rung's peaks and speed in words beside it."""
    bars = memory_ladder_bars(rows)
    budget = rows[0]["budget_mb"]
    fig, ax = plt.subplots(figsize=(11, WATERFALL_EXTRA_IN + WATERFALL_ROW_IN * len(bars)))
    right = max([bar["end_mb"] for bar in bars] + [budget]) * (1 + MEMORY_WORDS_ROOM)
    legend = {}
    for y, bar in enumerate(bars):
        if not bar["ran"]:
            legend["out of memory at the cap"] = ax.barh(
                y, bar["end_mb"], fill=False, hatch="///", lw=0.8, edgecolor=MEMORY_OVER_COLOR)
        else:
            key = "fits the budget" if bar["fits"] else "over the budget"
            legend[key] = ax.barh(y, bar["end_mb"], color=MEMORY_FITS_COLOR if bar["fits"]
                                  else MEMORY_OVER_COLOR)
        ax.text(bar["end_mb"] + WATERFALL_WORDS_PAD * right, y, bar["words"], va="center",
                ha="left", fontsize=8, bbox=MEMORY_WORDS_BACKING)
    legend[f"the budget, {ladder.gb(budget)}"] = ax.axvline(budget, color="#616161", lw=1.0,
                                                            ls="--", zorder=0)
    ax.set_yticks(range(len(bars)), [bar["label"] for bar in bars], fontsize=8)
    ax.set_ylim(len(bars) - 0.5, -0.5)  # rung 0 on top
    ax.set_xlim(0, right)
    ax.tick_params(axis="x", labelsize=8)
    of = next((row["peak_of"] for row in rows if row["ran"]), "")
    ax.set_xlabel(f"MB at the peak: {of}", fontsize=8)
    ax.legend(list(legend.values()), list(legend), fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=10, loc="left")
    return fig


def format_mb(value: float) -> str:
    """Three significant figures at most, never an exponent (smoke runs allocate under 1 MB)."""
    return f"{value:.0f} MB" if value >= 100 else f"{value:.{1 if value >= 10 else 2}f} MB"


def plot_memory_over_time(traces: dict[str, Path], out_png: Path,
                          title: str = "Memory allocated over the profiled steps") -> Path | None:
    """Memory over time of one or more traces (label -> trace file or run directory), each for
    its device: the GPU if the trace has GPU work, else the CPU. Writes out_png; returns it, or
    None when no trace has [memory] events."""
    fig = memory_figure({label: analyze.analyze(path) for label, path in traces.items()}, title)
    return None if fig is None else save(fig, Path(out_png))


def save(fig, out_png: Path, dpi: int = FIGURE_DPI, metadata: dict | None = None) -> Path:
    """Write `fig` as a PNG and close it; `metadata`: matplotlib's PNG metadata (the walkthrough
    figures drop the Software tag, so a redraw of the same data is byte-identical)."""
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out_png, dpi=dpi, metadata=metadata)
    plt.close(fig)
    return out_png


# --- Sections. ------------------------------------------------------------------------------------

def as_utc(when: datetime) -> datetime:
    """An aware time; one without a UTC offset is taken as UTC (comparing a naive time with an
    aware one raises TypeError)."""
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when


def created(summary: dict) -> datetime | None:
    """When the run wrote its summary: created_utc as an aware time, naive ones taken as UTC as
    the field's name says. None when it is missing or not an ISO 8601 time."""
    try:
        return as_utc(datetime.fromisoformat(summary["created_utc"]))
    except (KeyError, TypeError, ValueError):
        return None


def stale_reason(run: str, summary: dict, since: datetime | None) -> str:
    """Why the summary of run folder `run` cannot be shown as this run's (one written before
    `since`, or with no readable created_utc); "" where it can, or with no `since`."""
    if since is None:
        return ""
    run_started = as_utc(since).replace(microsecond=0)  # created_utc is whole seconds
    when = created(summary)
    if when is None:
        written = ("has no created_utc" if summary.get("created_utc") is None else
                   f"has created_utc {summary['created_utc']!r}, not an ISO 8601 time")
        return f"{run}/summary.json {written}: it cannot be shown to come from this run"
    if when < run_started:
        return f"{run}/summary.json is from {when}, before this run"
    return ""


def build_section(out_root: Path, demo: str, figures_dir: Path, failed: bool = False,
                  since: datetime | None = None) -> Section:
    if failed:
        return Section(demo, "failed", "a script of this pair failed in this run (see the log "
                                       "above the report); no numbers are shown")
    try:
        comparison = compare.compare(out_root / demo, keep_detail=True)
    except compare.CompareError as error:
        return Section(demo, "missing", str(error))
    for variant in compare.VARIANTS:
        stale = stale_reason(variant, comparison[variant]["summary"], since)
        if stale:
            return Section(demo, "stale", stale)
    analyses = {v: comparison[v].pop("detail") for v in compare.VARIANTS}
    section = Section(demo, "ok", comparison=comparison)
    section.figures.append((
        "Time per profiled step, by what runs (the TensorBoard plugin's Overview breakdown)",
        save(breakdown_figure(analyses, f"{demo}: time per profiled step (ms)"),
             figures_dir / f"{demo}_breakdown.png")))
    on_gpu = all(a.result["gpu"] for a in analyses.values())
    if on_gpu:
        section.figures.append((
            "Why the GPU is idle: its busy time and each idle cause, as a share of the profiled "
            "steps (gpu.idle_by_cause_pct; definitions in common/README.md)",
            save(idle_figure(analyses, f"{demo}: GPU busy and idle by cause"),
                 figures_dir / f"{demo}_idle.png")))
    section.figures.append((
        "Timeline of the profiled steps: the CPU's regions and the GPU's busy time (union of "
        "kernels)" if on_gpu else
        "Timeline of the profiled steps: the CPU's regions (data, DataLoader, forward, backward, "
        "optimizer). CPU-only traces: there is no GPU timeline to show",
        save(timeline_figure(analyses, f"{demo}: timeline"), figures_dir / f"{demo}_timeline.png")))
    memory_verdict = any(f["id"] in MEMORY_VERDICTS
                         for a in analyses.values() for f in a.result["findings"])
    if demo in MEMORY_CURVE_DEMOS or memory_verdict:
        fig = memory_figure(analyses, f"{demo}: memory allocated over the profiled steps")
        if fig is not None:
            section.figures.append(("Memory allocated over time (the profiler's memory events)",
                                    save(fig, figures_dir / f"{demo}_memory.png")))
        fig = memory_view_figure(analyses, f"{demo}: memory at each recorded step's end")
        if fig is not None:
            section.figures.append((
                "The memory view: allocated (and reserved, dashed) at each recorded step's end, "
                "and what the allocated peak is made of (metrics memory; definitions in "
                "common/README.md)", save(fig, figures_dir / f"{demo}_memory_view.png")))
    return section


WATERFALL_CAPTION = ("The waterfall: samples/s at each rung (each rung's timed steps), its gain "
                     "over the rung before and over rung 0, and its top verdict")


MEMORY_LADDER_CAPTION = ("Which rungs fit the memory budget: each rung's peak held against "
                         "it (its warm-up and timed steps), its peak memory and its samples/s")


def build_ladder_section(out_root: Path, name: str, figures_dir: Path, failed: bool = False,
                         since: datetime | None = None) -> Section:
    """A ladder's section: its rows (ladder.ladder_rows, every rung's trace analysed once) and
    the waterfall chart, or the memory ladder's (build_memory_ladder_section); or, as a pair's,
    why there are no numbers (a rung failed in this run, no ladder in the folder, a rung's
    summary older than `since`)."""
    if failed:
        return Section(name, "failed", "a rung of this ladder failed in this run (see the log "
                                       "above the report); no numbers are shown", kind=LADDER)
    folder = out_root / name
    if ladder.is_memory_ladder(folder):
        return build_memory_ladder_section(folder, figures_dir, since)
    rungs = ladder.rung_folders(folder)
    if len(rungs) < 2:
        return Section(name, "missing", f"{folder}: no ladder (two rung runs or more, "
                                        f"rung<K>_<fix>/ each with a {trace.SUMMARY_FILE})",
                       kind=LADDER)
    for _, _, path in rungs:
        stale = stale_reason(path.name, json.loads((path / trace.SUMMARY_FILE).read_text()),
                             since)
        if stale:
            return Section(name, "stale", stale, kind=LADDER)
    try:
        rows = ladder.ladder_rows(folder)
    except trace.TraceError as error:
        return Section(name, "missing", str(error), kind=LADDER)
    section = Section(name, "ok", kind=LADDER, ladder_rows=rows)
    title = (f"{name}: samples/s at each rung, each rung one fix after the one before "
             f"({rows[0]['device']})")
    section.figures.append((WATERFALL_CAPTION, save(waterfall_figure(rows, title),
                                                    figures_dir / f"{name}_waterfall.png")))
    return section


def build_memory_ladder_section(folder: Path, figures_dir: Path,
                                since: datetime | None = None) -> Section:
    """The memory ladder's section: ladder.memory_rows (from each rung's summary, or its record
    of running out of memory) and the chart of which rungs fit."""
    for _, _, path in ladder.rung_folders(folder, ladder.MEMORY_RECORDS):
        stale = stale_reason(path.name, ladder.rung_record(path)[0], since)
        if stale:
            return Section(folder.name, "stale", stale, kind=MEMORY_LADDER)
    rows = ladder.memory_rows(folder)
    section = Section(folder.name, "ok", kind=MEMORY_LADDER, ladder_rows=rows)
    title = (f"{folder.name}: the peak held against the budget at each rung, each rung one fix "
             f"after the one before ({rows[0]['device']})")
    section.figures.append((MEMORY_LADDER_CAPTION,
                            save(memory_ladder_figure(rows, title),
                                 figures_dir / f"{folder.name}_fits.png")))
    return section


def leftover_pairs(out_root: Path, reported: list[str]) -> list[str]:
    """Pair folders under out_root that this report does not cover (earlier runs)."""
    return [demo for demo in compare.finished_pairs(out_root) if demo not in reported]


def leftover_ladders(out_root: Path, reported: list[str]) -> list[str]:
    """Ladder folders (rung runs) under out_root that this report does not cover."""
    if not Path(out_root).is_dir():
        return []
    return sorted(path.name for path in Path(out_root).iterdir()
                  if path.name not in reported
                  and (ladder.is_ladder(path) or ladder.is_memory_ladder(path)))


def demo_readme(demo: str, out_root: Path) -> str | None:
    readme = REPO_ROOT / "demos" / demo / "README.md"
    return os.path.relpath(readme, out_root.resolve()) if readme.is_file() else None


# --- Rendering. -----------------------------------------------------------------------------------

# The rows a section shows first; the rest are folded under ALL_ROWS_SUMMARY (one click away):
# a reader first wants how fast, how long a step, how much memory, how busy the GPU, and why.
PRIMARY_ROWS = ("samples/s", "real tokens/s", "requests/s", "generated tokens/s",
                "latency p50 ms", "per token p50 ms", "step p50 ms", "peak memory MB",
                "peak reserved MB", "memory growth MB/step", "GPU utilization %", "DataLoader %",
                "syncs/step", "verdicts")
ALL_ROWS_SUMMARY = "Every row (timing, idle by cause, kernels, tensor cores)"
# The words the report uses before it could define them, said once at its top.
TERMS = ("**Terms.** A *step* is one training iteration (`ProfilerStep#N` in the trace), or in "
         "an inference pair one request (`llm_decode`) or one batch of requests "
         "(`tokenizer_bound`), whose latency is the host's wait for its result; the "
         "*timed phase* is the run's steps without the profiler, where throughput and step time "
         "come from, and the *profiled steps* are the few the trace records. The *window* runs "
         "from the first profiled step's start to the last one's end on the GPU's clock; the "
         "*host window* over the same steps as the CPU ran them. A *preset* is a demo's sizes "
         "for a device (`cuda`, `cpu`, `smoke`). *Utilization*: the share of the window some "
         "kernel, copy or memset runs; *GPU idle*: the rest, split *by cause* (what the GPU "
         "waited for). Every term: `common/GLOSSARY.md`.")


def header_lines(out_root: Path, generated: str, leftovers: list[str]) -> list[str]:
    lines = [f"Generated {generated} from the runs under `{out_root}`. Throughput, step time and "
             "peak memory come from each script's unprofiled timed phase (summary.json); GPU "
             "numbers and verdicts from its trace (`python -m common.analyze`). Each change is "
             "said with its direction (\"11.30x higher, better\"). Definitions and thresholds: "
             "`common/README.md`."]
    if leftovers:
        lines.append("Not in this run (folders left from earlier runs, not shown): "
                     + ", ".join(f"`{name}`" for name in leftovers) + ".")
    return lines


def summary_rows(sections: list[Section]) -> list[tuple[str, str, str, str]]:
    """One row a pair: (demo, the result in words, bad's verdicts, fixed's verdicts); a pair
    without numbers says why."""
    rows = []
    for section in sections:
        if section.kind != PAIR:  # a ladder: ladder_summaries
            continue
        if section.status != "ok":
            rows.append((section.demo, f"no comparison ({section.status})", "", ""))
            continue
        c = section.comparison
        verdicts = [analyze.verdict_ids(c[v]["analysis"]) for v in compare.VARIANTS]
        rows.append((section.demo, compare.headline(c) or "n/a", *verdicts))
    return rows


def ladder_summaries(sections: list[Section]) -> list[tuple[str, str]]:
    """One (name, the result in words) a ladder: its last rung against rung 0, as the
    waterfall says it, or the memory ladder's first rung that fits; a ladder without numbers
    says why."""
    found = []
    for section in sections:
        if section.kind not in LADDER_KINDS:
            continue
        if section.status != "ok":
            found.append((section.demo, f"no {ladder_what(section)} ({section.status})"))
            continue
        if section.kind == MEMORY_LADDER:
            rows = section.ladder_rows
            fitting = ladder.first_fitting(rows)
            budget = ladder.gb(rows[0]["budget_mb"])
            found.append((section.demo, f"the first rung within the {budget} budget: "
                                        f"{fitting['rung'] if fitting else 'none'}"))
            continue
        first, last = section.ladder_rows[0], section.ladder_rows[-1]
        found.append((section.demo, f"{last['rung']} vs {first['rung']}: "
                                    f"{ladder.ratio_words(last['vs_first'])}"))
    return found


LADDER_INTRO = ("One training script in rungs, each one fix after the rung before: each rung's "
                "samples/s (its timed steps), its gain over the rung before and over rung 0, its "
                "verdicts, and whether its top verdict names the next rung's fix (the chain), as "
                "`python -m common.compare` prints them for the ladder's folder")
MEMORY_LADDER_INTRO = ("One model in rungs, each one fix after the rung before, against a memory "
                       "budget: whether each rung fits it, its peaks and its samples/s, as "
                       "`python -m common.compare` prints them for the ladder's folder")


def ladder_what(section: Section) -> str:
    return "table" if section.kind == MEMORY_LADDER else "waterfall"


def ladder_text(section: Section) -> str:
    """A ladder section's rows as compare prints them: the waterfall, or the memory table."""
    if section.kind == MEMORY_LADDER:
        return ladder.format_memory_table(section.ladder_rows)
    return ladder.format_waterfall(section.ladder_rows)


def ladder_intro(section: Section) -> str:
    return MEMORY_LADDER_INTRO if section.kind == MEMORY_LADDER else LADDER_INTRO


def split_rows(comparison: dict) -> tuple[list[tuple], list[tuple]]:
    """compare.table_rows, as (the PRIMARY_ROWS, the rest)."""
    rows = compare.table_rows(comparison)
    return ([row for row in rows if row[0] in PRIMARY_ROWS],
            [row for row in rows if row[0] not in PRIMARY_ROWS])


def markdown_table(rows: list[tuple]) -> list[str]:
    return (["| | bad | fixed | fixed vs bad |", "|---|---:|---:|---|"]
            + [f"| {label} | {bad} | {fixed} | {change} |" for label, bad, fixed, change in rows])


def render_markdown(sections: list[Section], out_root: Path, generated: str,
                    leftovers: list[str]) -> str:
    lines = ["# Bad vs fixed: the report", ""] + header_lines(out_root, generated, leftovers)
    lines += ["", "| pair | fixed vs bad | bad's verdicts | fixed's verdicts |",
              "|---|---|---|---|"]
    lines += [f"| [{demo}](#{demo}) | {result} | {bad} | {fixed} |"
              for demo, result, bad, fixed in summary_rows(sections)]
    ladders = ladder_summaries(sections)
    if ladders:
        lines += ["", "Ladders: " + "; ".join(f"[{name}](#{name}): {result}"
                                              for name, result in ladders) + "."]
    lines += ["", TERMS]
    for section in sections:
        lines += ["", f"## {section.demo}", ""]
        if section.kind in LADDER_KINDS:
            lines += ladder_markdown(section, out_root)
            continue
        if section.status != "ok":
            lines.append(f"**No comparison ({section.status}):** {section.reason}")
            continue
        comparison = section.comparison
        readme = demo_readme(section.demo, out_root)
        lines.append(compare.conditions(comparison)
                     + (f". Walkthrough: [{section.demo}/README.md]({readme})" if readme else ""))
        primary, rest = split_rows(comparison)
        lines += ["", f"**{compare.headline(comparison)}**", "", *markdown_table(primary)]
        if rest:  # GitHub renders a table inside <details> when blank lines surround it
            lines += ["", f"<details><summary>{ALL_ROWS_SUMMARY}</summary>", "",
                      *markdown_table(rest), "", "</details>"]
        lines.append("")
        lines += verdict_lines(comparison, markdown=True)
        for text in comparison["warnings"]:  # a quote each: consecutive "> " lines join up
            lines += [f"> **Warning:** {text}", ""]
        lines += [f"> {text}" for text in compare.notes(comparison)]
        lines += ["", *(f"- {line}" for line in compare.rank_lines(comparison))]
        changed = compare.what_changed_rows(comparison["what_changed"])
        if changed:
            lines += ["", f"What changed most, per step ({WHAT_CHANGED_NOTE}):", "",
                      "| | name | bad ms | fixed ms | calls/step |", "|---|---|---:|---:|---:|"]
            lines += [f"| {kind} | `{name.replace('|', '&#124;')}` | {bad} | {fixed} | {calls} |"
                      for kind, name, bad, fixed, calls in changed]
        memory = memory_view_lines(comparison)
        if memory:
            lines += ["", f"{MEMORY_VIEW_NOTE}:", "", "```text", *memory, "```"]
        compiled = compiled_view_lines(comparison)
        if compiled:
            lines += ["", f"{COMPILED_VIEW_NOTE}:", "", "```text", *compiled, "```"]
        for caption, png in section.figures:
            lines += ["", f"![{caption}]({png.relative_to(out_root).as_posix()})", f"*{caption}*"]
    return "\n".join(lines) + "\n"


def ladder_markdown(section: Section, out_root: Path) -> list[str]:
    """A ladder's section below its heading: what it is, the waterfall as compare prints it, and
    the chart; or why there are no numbers."""
    if section.status != "ok":
        return [f"**No {ladder_what(section)} ({section.status}):** {section.reason}"]
    readme = demo_readme(section.demo, out_root)
    lines = [ladder_intro(section) + (f". Walkthrough: [{section.demo}/README.md]({readme})"
                                      if readme else "") + ".",
             "", "```text", ladder_text(section), "```"]
    for caption, png in section.figures:
        lines += ["", f"![{caption}]({png.relative_to(out_root).as_posix()})", f"*{caption}*"]
    return lines


MEMORY_VIEW_NOTE = ("The memory view, from each trace's memory events (the analyzer's memory "
                    "lines: python -m common.analyze)")


def memory_view_lines(comparison: dict) -> list[str]:
    """Each variant's memory lines as the analyzer prints them (allocated at the steps' ends and
    its growth, what was kept and by which operator, the peak and its parts, the operators that
    allocate most); [] where no variant's trace has memory events in its steps."""
    return analyzer_view_lines(comparison, "memory", analyze.memory_lines)


COMPILED_VIEW_NOTE = ("torch.compile's regions, from each trace (the analyzer's compiled line: "
                      "python -m common.analyze)")


def compiled_view_lines(comparison: dict) -> list[str]:
    """Each variant's compiled line as the analyzer prints it (regions by frame and compile id,
    graph breaks and the eager operators inside regions, compiling in the steps); [] where no
    variant's trace has a compiled region in its steps."""
    return analyzer_view_lines(comparison, "compiled", analyze.compiled_lines)


def analyzer_view_lines(comparison: dict, key: str, lines_of) -> list[str]:
    """Each variant's `lines_of(its analysis[key])`, under the variant's name; [] where no
    variant's analysis has `key`."""
    lines = []
    for variant in compare.VARIANTS:
        found = comparison[variant]["analysis"].get(key)
        if found:
            lines += [f"{variant}:", *(f"  {line}" for line in lines_of(found))]
    return lines


def verdict_lines(comparison: dict, markdown: bool) -> list[str]:
    lines = []
    for variant in compare.VARIANTS:
        findings = comparison[variant]["analysis"]["findings"]
        if not findings:
            lines.append(f"- {variant}: no verdict (no bottleneck rule fired)")
        for found in findings:
            see = f" (see demos/{found['demo']}/)" if found["demo"] else ""
            name = f"**{found['id']}**" if markdown else found["id"]
            lines.append(f"- {variant}: [{found['severity']}] {name}: {found['evidence']}. "
                         f"Fix: {found['fix']}{see}")
    return lines


HTML_STYLE = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1180px;
       margin: 2em auto; padding: 0 1em; color: #212121; }
table { border-collapse: collapse; margin: 0.8em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.7em; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.failed { background: #fff3e0; padding: 0.6em 1em; border-left: 4px solid #ef6c00; }
figure { margin: 1em 0; } figcaption { color: #616161; font-size: 0.9em; }
img { max-width: 100%; } .note { color: #455a64; }
.warning { background: #fffde7; padding: 0.4em 1em; border-left: 4px solid #f9a825; }
"""


def html_table(rows: list[tuple]) -> str:
    e = html.escape
    return ("<table><tr><th></th><th>bad</th><th>fixed</th><th>fixed vs bad</th></tr>"
            + "".join(f"<tr><td>{e(label)}</td><td class=\"n\">{e(bad)}</td>"
                      f"<td class=\"n\">{e(fixed)}</td><td>{e(change)}</td></tr>"
                      for label, bad, fixed, change in rows) + "</table>")


def data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def render_html(sections: list[Section], out_root: Path, generated: str,
                leftovers: list[str]) -> str:
    e = html.escape
    parts = ["<!doctype html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
             "<title>Bad vs fixed: the report</title>", f"<style>{HTML_STYLE}</style></head><body>",
             "<h1>Bad vs fixed: the report</h1>"]
    parts += [f"<p>{e(line).replace('`', '')}</p>" for line in header_lines(out_root, generated,
                                                                              leftovers)]
    parts.append("<table><tr><th>pair</th><th>fixed vs bad</th><th>bad's verdicts</th>"
                 "<th>fixed's verdicts</th></tr>")
    parts += [f"<tr><td><a href=\"#{e(demo)}\">{e(demo)}</a></td><td>{e(result)}</td>"
              f"<td>{e(bad)}</td><td>{e(fixed)}</td></tr>"
              for demo, result, bad, fixed in summary_rows(sections)]
    parts.append("</table>")
    ladders = ladder_summaries(sections)
    if ladders:
        parts.append("<p>Ladders: " + "; ".join(f"<a href=\"#{e(name)}\">{e(name)}</a>: "
                                                f"{e(result)}" for name, result in ladders)
                     + ".</p>")
    parts.append(f"<p>{e(TERMS).replace('**', '').replace('*', '').replace('`', '')}</p>")
    for section in sections:
        parts.append(f"<h2 id=\"{e(section.demo)}\">{e(section.demo)}</h2>")
        if section.kind in LADDER_KINDS:
            parts += ladder_html(section, out_root)
            continue
        if section.status != "ok":
            parts.append(f"<p class=\"failed\"><b>No comparison ({e(section.status)}):</b> "
                         f"{e(section.reason)}</p>")
            continue
        comparison = section.comparison
        readme = demo_readme(section.demo, out_root)
        parts.append(f"<p>{e(compare.conditions(comparison))}"
                     + (f". Walkthrough: <a href=\"{e(readme)}\">{e(section.demo)}/README.md</a>"
                        if readme else "") + "</p>")
        primary, rest = split_rows(comparison)
        parts.append(f"<p><b>{e(compare.headline(comparison))}</b></p>")
        parts.append(html_table(primary))
        if rest:
            parts.append(f"<details><summary>{e(ALL_ROWS_SUMMARY)}</summary>{html_table(rest)}"
                         f"</details>")
        parts.append("<ul>")
        parts += [f"<li>{e(line[2:])}</li>" for line in verdict_lines(comparison, markdown=False)]
        parts.append("</ul>")
        parts += [f"<p class=\"warning\"><b>Warning:</b> {e(text)}</p>"
                  for text in comparison["warnings"]]
        parts += [f"<p class=\"note\">{e(text)}</p>" for text in compare.notes(comparison)]
        parts += [f"<p>{e(line)}</p>" for line in compare.rank_lines(comparison)]
        changed = compare.what_changed_rows(comparison["what_changed"])
        if changed:
            parts.append(f"<p>What changed most, per step ({e(WHAT_CHANGED_NOTE)}):</p><table>"
                         "<tr><th></th><th>name</th><th>bad ms</th><th>fixed ms</th>"
                         "<th>calls/step</th></tr>")
            parts += [f"<tr><td>{e(kind)}</td><td><code>{e(name)}</code></td>"
                      f"<td class=\"n\">{e(bad)}</td><td class=\"n\">{e(fixed)}</td>"
                      f"<td class=\"n\">{e(calls)}</td></tr>"
                      for kind, name, bad, fixed, calls in changed]
            parts.append("</table>")
        memory = memory_view_lines(comparison)
        if memory:
            parts.append(f"<p>{e(MEMORY_VIEW_NOTE)}:</p><pre>{e(chr(10).join(memory))}</pre>")
        compiled = compiled_view_lines(comparison)
        if compiled:
            parts.append(f"<p>{e(COMPILED_VIEW_NOTE)}:</p><pre>{e(chr(10).join(compiled))}</pre>")
        for caption, png in section.figures:
            parts.append(f"<figure><img alt=\"{e(caption)}\" src=\"{data_uri(png)}\">"
                         f"<figcaption>{e(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def ladder_html(section: Section, out_root: Path) -> list[str]:
    """ladder_markdown, as HTML (the chart inline)."""
    e = html.escape
    if section.status != "ok":
        return [f"<p class=\"failed\"><b>No {ladder_what(section)} ({e(section.status)}):</b> "
                f"{e(section.reason)}</p>"]
    readme = demo_readme(section.demo, out_root)
    parts = [f"<p>{e(ladder_intro(section).replace('`', ''))}"
             + (f". Walkthrough: <a href=\"{e(readme)}\">{e(section.demo)}/README.md</a>"
                if readme else "") + ".</p>",
             f"<pre>{e(ladder_text(section))}</pre>"]
    parts += [f"<figure><img alt=\"{e(caption)}\" src=\"{data_uri(png)}\">"
              f"<figcaption>{e(caption)}</figcaption></figure>" for caption, png in section.figures]
    return parts


def build_sections(out_root: Path, demos: list[str], failed: set[str] = frozenset(),
                   since: datetime | None = None, ladders: list[str] = ()) -> list[Section]:
    """One section per demo: its comparison (each trace analysed once) and plots; then one per
    ladder in `ladders`: its waterfall (build_ladder_section). `failed`: pairs and ladders whose
    run failed now (shown as failed, no numbers). `since`: when the run started; a summary
    older than that is stale and not shown."""
    figures_dir = Path(out_root) / FIGURES_DIR
    if figures_dir.is_dir():  # plots of an earlier run must not outlive it
        for old in figures_dir.glob("*.png"):
            old.unlink()
    return ([build_section(Path(out_root), demo, figures_dir, demo in failed, since)
             for demo in demos]
            + [build_ladder_section(Path(out_root), name, figures_dir, name in failed, since)
               for name in ladders])


def write_report(out_root: Path, demos: list[str] | None = None, failed: set[str] = frozenset(),
                 since: datetime | None = None, sections: list[Section] | None = None,
                 ladders: list[str] | None = None) -> tuple[Path, Path]:
    """Write OUT/REPORT.md and OUT/report.html for `demos` and `ladders` (default, with neither
    given: every pair folder with both summaries, and every ladder folder), from `sections` when
    the caller built them already (build_sections). A pair or ladder folder the report does not
    cover is named as left over from an earlier run."""
    out_root = Path(out_root)
    if demos is None and ladders is None:
        ladders = leftover_ladders(out_root, [])
    if demos is None:
        demos = leftover_pairs(out_root, [])
    if sections is None:
        sections = build_sections(out_root, demos, failed, since, ladders or [])
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    leftovers = (leftover_pairs(out_root, list(demos))
                 + leftover_ladders(out_root, [section.demo for section in sections]))
    out_root.mkdir(parents=True, exist_ok=True)
    markdown = out_root / REPORT_MD
    page = out_root / REPORT_HTML
    markdown.write_text(render_markdown(sections, out_root, generated, leftovers))
    page.write_text(render_html(sections, out_root, generated, leftovers))
    return markdown, page



def main(argv: list[str] | None = None) -> int:
    parser = trace.OneLineArgumentParser(
        prog="python -m common.report",
        description="Write REPORT.md and a self-contained report.html comparing bad and fixed "
                    "for the pairs under OUT (what ./scripts/run_demos.sh does after its runs).")
    parser.add_argument("out", metavar="OUT", type=Path, nargs="?",
                        default=REPO_ROOT / "traces", help="output root (default: traces/)")
    parser.add_argument("demos", metavar="DEMO", nargs="*",
                        help="pairs and ladders to report (default: every folder with bad/ and "
                             "fixed/ summaries, and every folder of ladder rungs)")
    flags = parser.parse_args(argv)
    if not flags.out.is_dir():
        print(f"report: {flags.out}: no such directory", file=sys.stderr)
        return 2
    ladders = [name for name in flags.demos if ladder.is_ladder(flags.out / name)
               or ladder.is_memory_ladder(flags.out / name)]
    pairs = [name for name in flags.demos if name not in ladders]
    markdown, page = (write_report(flags.out, pairs, ladders=ladders) if flags.demos
                      else write_report(flags.out))
    return analyze.print_output(f"wrote {markdown} and {page}")


if __name__ == "__main__":
    sys.exit(main())
