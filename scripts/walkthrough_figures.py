"""Draw the picture at the top of every walkthrough: demos/<demo>/trace.png, bad above fixed.

For each pair, from the committed reference traces (traces/reference/h100/<demo>/{bad,fixed}):
one figure, bad above fixed on one shared time axis (the same ms scale for both, each variant
from its own first profiled step), zoomed to where the pair's bottleneck shows (ZOOMS says where
and why, per demo). Each row is the share of every column of time it is busy, as
common/report.py's timeline draws it: the CPU regions that matter (data, enumerate(DataLoader),
forward, backward, optimizer), the host's syncs or collective calls where they are the lesson,
and the GPU's kernels; dashed lines are step boundaries as the GPU ran them. Where memory is the
lesson, a third panel draws memory allocated over the same window, from the trace's [memory]
events. Every number in a title is read from the trace or its summary.json. Imports no torch.

Examples:
  .venv/bin/python scripts/walkthrough_figures.py                  every demo, into demos/
  .venv/bin/python scripts/walkthrough_figures.py item_sync --out-root /tmp/figures
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file, from any directory

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only: no display, no GUI toolkit
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from common import analyze, compare, intervals, report, syncs, trace, trace_steps  # noqa: E402
from common.intervals import Spans  # noqa: E402
from common.kernel_names import ATTENTION_PATTERN, uses_tensor_cores  # noqa: E402
from common.trace_columns import DATALOADER_REGION  # noqa: E402

DEMOS = ("dataloader_workers", "small_batch", "mixed_precision", "activation_checkpointing",
         "launch_overhead", "item_sync", "naive_attention", "unfused_optimizer", "padding_waste",
         "ddp_no_sync", "host_roundtrip", "llm_decode", "tokenizer_bound")
DEFAULT_REFERENCE = ROOT / "traces" / "reference" / "h100"
DEFAULT_OUT_ROOT = ROOT / "demos"
FIGURE_NAME = "trace.png"
VARIANTS = compare.VARIANTS  # ("bad", "fixed"): bad drawn above fixed
FIGURE_WIDTH_IN = 10.0  # the width a README shows at full size on a laptop screen
# ~900 px wide: sharp enough in a README, and each PNG stays well under 120 KB (the walkthroughs
# carry ten of them in the repository).
FIGURE_DPI = 90
ROW_HEIGHT_IN = 0.42  # one row of a variant's panel: its label in 8 pt fits with room to spare
PANEL_EXTRA_IN = 0.75  # a panel's title and margins, on top of its rows
MEMORY_PANEL_IN = 1.9  # the memory panel: two curves and a legend
# Columns across the window: about one per pixel of the axes at FIGURE_DPI, as report's
# TIMELINE_COLUMNS is at its wider figures (a busy share per column, so a kernel narrower than a
# pixel shows as the sliver it is).
COLUMNS = 800
ROW_FILL = 0.8  # a fully busy column fills this much of its row's height (rows stay apart)
# PNG metadata: none that changes between runs or versions (matplotlib writes its version as
# "Software" by default), so regenerating on the same matplotlib writes identical bytes.
PNG_METADATA = {"Software": None}
BEYOND_COLOR = "#eeeeee"  # the part of the window after a variant's last profiled step
SYNC_COLOR = "#ef6c00"  # report.IDLE_COLORS["host_sync"]: the host waiting for the GPU
# The GPU idle after a host sync (idle cause host_sync), shaded behind the GPU row: a pale
# SYNC_COLOR, so the kernels drawn over it stay readable.
SYNC_GAP_COLOR = "#ffcc80"
COLLECTIVE_COLOR = "#00838f"  # teal: apart from the regions' blues, which it sits between
GPU_COLOR = "#2e7d32"  # report's GPU row
# A row split in two by kernel name: the row that is the lesson dark, the rest a pale green.
TENSOR_CORE_COLOR = "#1b5e20"
CUDA_CORE_COLOR = "#9ccc65"

# --- What each figure shows. ------------------------------------------------------------------
# Rows, by key: CPU regions (report.TIMELINE_ROWS: data, DataLoader, forward, backward,
# optimizer), and these.
SYNC_ROW = "syncs"  # the host's cuda*Synchronize and blocking-copy calls (runtime_is_sync)
COLLECTIVE_ROW = "collectives"  # the host's <backend>:<collective> calls (collective_spans)
GPU_ROW = "gpu"  # every kernel, merged (report's "GPU kernels" row)
GPU_OPTIMIZER_ROW = "gpu_optimizer"  # the optimizer region as the GPU ran it (gpu_user_annotation)
TENSOR_CORE_ROW = "tensor_cores"  # kernels whose names say tensor cores (kernel_names)
CUDA_CORE_ROW = "cuda_cores"  # every other kernel
ATTENTION_ROW = "attention"  # fused attention kernels (kernel_names.ATTENTION_PATTERN)
NOT_ATTENTION_ROW = "not_attention"  # every other kernel
# A row of the user's record_function ranges of one name (the trace's user_annotation spans, as
# the analyzer's host regions read them): "region:tokenize".
REGION_ROW_PREFIX = "region:"
CPU_ROWS = report.TIMELINE_ROWS
ROW_LABELS = {DATALOADER_REGION: "enumerate(DataLoader)", SYNC_ROW: "host waits (sync)",
              COLLECTIVE_ROW: "all-reduce calls", GPU_ROW: "GPU kernels",
              GPU_OPTIMIZER_ROW: "GPU: optimizer", TENSOR_CORE_ROW: "GPU: tensor-core kernels",
              CUDA_CORE_ROW: "GPU: kernels not on\ntensor cores",
              ATTENTION_ROW: "GPU: attention kernels", NOT_ATTENTION_ROW: "GPU: other kernels"}
ROW_COLORS = {**report.REGION_COLORS, SYNC_ROW: SYNC_COLOR, COLLECTIVE_ROW: COLLECTIVE_COLOR,
              GPU_ROW: GPU_COLOR, GPU_OPTIMIZER_ROW: report.REGION_COLORS["optimizer"],
              TENSOR_CORE_ROW: TENSOR_CORE_COLOR, CUDA_CORE_ROW: CUDA_CORE_COLOR,
              ATTENTION_ROW: TENSOR_CORE_COLOR, NOT_ATTENTION_ROW: CUDA_CORE_COLOR}
# Rows that split the kernels by name: the row -> which kernel names are its; and each
# complement row -> the row whose kernels it leaves out.
KERNEL_CLASSES = {TENSOR_CORE_ROW: uses_tensor_cores,
                  ATTENTION_ROW: lambda name: bool(ATTENTION_PATTERN.search(name.lower()))}
KERNEL_COMPLEMENTS = {CUDA_CORE_ROW: TENSOR_CORE_ROW, NOT_ATTENTION_ROW: ATTENTION_ROW}
# Anchors: where a variant's time axis starts. HOST: its first profiled step as it began on the
# CPU or the GPU, whichever came first (report.timeline_figure's origin): a CPU that runs ahead
# shows its regions before the kernels they launched. GPU: its first profiled step as the GPU
# ran it (the analyzer's extended steps), for GPU-bound pairs, where the CPU runs seconds ahead
# and the lesson is how long the GPU takes.
HOST, GPU = "host", "gpu"


@dataclass(frozen=True)
class Zoom:
    """The window drawn, the same for both variants in ms from each one's anchor: [start_ms,
    start_ms + width_ms], or, with width_ms None, from 0 to the end of `steps` whole steps of
    variant `of`: the later of its host steps' and its GPU steps' end (a step is over when both
    are), or with until=HOST the host steps' end (where the allocations, timed on the host, are
    the lesson and the GPU's catching up is not)."""
    anchor: str
    rows: tuple[str, ...]
    start_ms: float = 0.0
    width_ms: float | None = None
    steps: int = 1
    of: str = "bad"
    until: str = GPU
    memory: bool = False  # a memory-over-time panel under the two variants
    what: str = ""  # the window in words, for the figure's title


ZOOMS = {
    # Whole steps: bad's step is 2.3 s, nearly all of it the DataLoader decoding images in the
    # training process with the GPU idle; fixed runs its three profiled steps in a fifth of that
    # window with the GPU busy. One of bad's steps is the smallest window that shows both.
    "dataloader_workers": Zoom(HOST, (DATALOADER_REGION, "forward", "backward", "optimizer",
                                      GPU_ROW), steps=1, what="one step of bad"),
    # One step each (about 20 ms in both): at batch 8 the GPU row is slivers with gaps, at 256
    # it is nearly solid, in the same time.
    "small_batch": Zoom(HOST, ("forward", "backward", "optimizer", GPU_ROW), steps=1,
                        what="one step of bad"),
    # GPU bound: the CPU runs seconds ahead, so the GPU's own steps are the time axis. One of
    # bad's FP32 steps on the GPU (1.8 s): fixed's BF16 steps fit in it several times over,
    # and its kernels are the tensor-core ones.
    "mixed_precision": Zoom(GPU, (CUDA_CORE_ROW, TENSOR_CORE_ROW), steps=1,
                            what="one step of bad, as the GPU ran it"),
    # Memory is the lesson: the allocations follow the CPU (the caching allocator records them
    # when the host asks), so the host's regions and the memory curve share the axis. One of
    # fixed's host steps (the longer, recomputing), in which bad's forward builds the saved
    # activations up to its peak and its backward frees them; the GPU runs seconds behind and
    # is busy throughout.
    "activation_checkpointing": Zoom(HOST, ("forward", "backward", "optimizer", GPU_ROW),
                                     steps=1, of="fixed", until=HOST, memory=True,
                                     what="one host step of fixed, with memory allocated"),
    # fixed (a CUDA graph) runs a whole step in about 5 ms; in the same 5 ms bad's CPU has not
    # finished launching the forward pass, and its GPU row is thin slivers of tiny kernels.
    "launch_overhead": Zoom(HOST, ("forward", "backward", "optimizer", GPU_ROW), steps=1,
                            of="fixed", what="one step of fixed"),
    # A few blocks of the backward pass, 3.5 ms from 12 ms into the first step (the backward
    # runs from about 6.7 to 25 ms in bad, 10 to 23 ms in fixed): in bad each block's gradient
    # hook ends in a host wait, the GPU row has a gap after each (shaded), and a block takes
    # longer than fixed's, which fits more blocks in the same 3.5 ms. At a whole step (about
    # 26 ms, 78 ms for the three) bad and fixed look the same: both are launch bound.
    "item_sync": Zoom(HOST, ("backward", SYNC_ROW, GPU_ROW), start_ms=12.0, width_ms=3.5,
                      what="3.5 ms of the backward pass"),
    # Memory is the lesson (the [s, s] score matrices), and the host runs ahead of the GPU:
    # bad's three host steps, each with its peak of score matrices; fixed's three fit in a
    # quarter of that. Up to the host's end: after it the GPU only catches up, with no new
    # allocations.
    # No GPU row: in this window bad's GPU runs only kernels of steps before the profiled ones
    # (its first profiled step starts on the GPU after the host's third has ended), so it says
    # nothing of the steps drawn; the step times are in the titles.
    "naive_attention": Zoom(HOST, ("forward", "backward", "optimizer"), steps=3,
                            until=HOST, memory=True,
                            what="the three host steps of bad, with memory allocated"),
    # One step of bad: its optimizer region (a kernel per parameter per operation) takes most
    # of the step on the GPU; fixed's fused optimizer is a sliver, and its next step starts.
    "unfused_optimizer": Zoom(HOST, ("forward", "backward", "optimizer", GPU_OPTIMIZER_ROW,
                                     GPU_ROW), steps=1, what="one step of bad"),
    # GPU bound in both: the GPU is busy throughout, padding shows as longer steps (each kernel
    # computes the padded tokens too), not as gaps; most of all in attention, whose work grows
    # with the square of the padded length. One of bad's steps on the GPU.
    "padding_waste": Zoom(GPU, (ATTENTION_ROW, NOT_ATTENTION_ROW, GPU_ROW), steps=1,
                          what="one step of bad, as the GPU ran it"),
    # One step of bad on rank 0: four micro-batches, each backward pass waiting in its
    # all-reduces; fixed all-reduces only in the last micro-batch's backward.
    "ddp_no_sync": Zoom(HOST, ("forward", "backward", COLLECTIVE_ROW, "optimizer", GPU_ROW),
                        steps=1, what="one step of bad, rank 0"),
    # One step of bad: its forward holds the loss's round trips, each a host wait with the GPU
    # idle after it; fixed's whole step fits in bad's forward. Chosen before the pair had a GPU
    # run (it is not in the H100 reference yet): check it against the first one.
    "host_roundtrip": Zoom(HOST, ("forward", SYNC_ROW, "backward", "optimizer", GPU_ROW),
                           steps=1, what="one step of bad"),
    # 5 ms of decoding, from 10 ms into the first request (after the 128-token prompt's pass):
    # bad's GPU row a comb of kernel slivers, a token's ~170 kernels each launched on its own;
    # fixed's a dense block a token (one CUDA graph launch each), many tokens in the same 5 ms.
    # Chosen before the pair had a GPU run (not in the H100 reference yet): check it then.
    "llm_decode": Zoom(HOST, ("region:decode", GPU_ROW), start_ms=10.0, width_ms=5.0,
                       what="5 ms of decoding"),
    # One batch of bad: the tokenize region holds most of it with the GPU idle, the model's
    # forward a short burst after it; fixed's whole batch fits in bad's tokenizing. Chosen
    # before the pair had a GPU run: check it then.
    "tokenizer_bound": Zoom(HOST, ("region:tokenize", "forward", GPU_ROW), steps=1,
                            what="one batch of bad"),
}


# --- Headlines: what each panel's title says, every number from the trace or the summary. ------

def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} %"


def gpu_idle_pct(result: dict) -> float:
    return 100.0 - result["gpu"]["utilization_pct"]


def step_ms(result: dict) -> float:
    return result["step_ms"]["mean"]


def headline_dataloader_workers(variant: str, result: dict, summary: dict) -> str:
    workers = (summary.get("config") or {}).get("num_workers")
    idle = result["gpu"]["idle_by_cause_pct"]["dataloader"]
    if idle >= 1:
        return (f"{variant} (num_workers={workers}): GPU idle {pct(gpu_idle_pct(result))} of the "
                f"steps, {pct(idle)} waiting for the DataLoader")
    return (f"{variant} (num_workers={workers}): GPU busy "
            f"{pct(result['gpu']['utilization_pct'])} of the steps, "
            f"{idle:.1f} % waiting for the DataLoader")


def headline_small_batch(variant: str, result: dict, summary: dict) -> str:
    return (f"{variant} (batch {summary['batch_size']}): GPU busy "
            f"{pct(result['gpu']['utilization_pct'])} of the steps, median kernel "
            f"{result['gpu']['median_kernel_us']:.0f} µs, {summary['samples_per_s']:,.0f} "
            f"samples/s")


def headline_mixed_precision(variant: str, result: dict, summary: dict) -> str:
    return (f"{variant} ({compare.precision(summary, result)}): {step_ms(result):,.0f} ms per "
            f"step on the GPU, "
            f"{pct(result['gpu']['tensor_core_pct'])} of kernel time on tensor cores")


def headline_memory(variant: str, result: dict, summary: dict) -> str:
    return (f"{variant}: peak {result['peak_memory_mb']:,.0f} MB allocated, "
            f"{step_ms(result):,.0f} ms per step")


def headline_launch_overhead(variant: str, result: dict, summary: dict) -> str:
    compiled = (summary.get("config") or {}).get("torch_compile")
    how = f"torch.compile({compiled})" if compiled else "eager"
    return (f"{variant} ({how}): {result['gpu']['launches_per_step']:,.0f} launch calls and "
            f"{step_ms(result):.1f} ms per step, GPU busy "
            f"{pct(result['gpu']['utilization_pct'])}")


def headline_item_sync(variant: str, result: dict, summary: dict) -> str:
    gpu = result["gpu"]
    return (f"{variant}: {gpu['syncs_per_step']:.1f} host syncs per step; the GPU idles "
            f"{gpu['idle_by_cause_pct']['host_sync']:.1f} % of the steps in gaps a sync "
            f"returns in")


def headline_unfused_optimizer(variant: str, result: dict, summary: dict) -> str:
    optimizer = result["optimizer"]
    return (f"{variant} ({(summary.get('config') or {}).get('optimizer')}): optimizer.step "
            f"{optimizer['ms_per_step']:.1f} ms per step ({pct(optimizer['pct'])} of the "
            f"steps), {optimizer['ops_per_step']:,.0f} operators per step")


def headline_padding_waste(variant: str, result: dict, summary: dict) -> str:
    return (f"{variant} ({summary['batch_size']} sequences a step): "
            f"{summary['padding_pct']:.0f} % of the tokens computed are padding; "
            f"{step_ms(result):.0f} ms per step, GPU busy "
            f"{pct(result['gpu']['utilization_pct'])}, {summary['tokens_per_s']:,.0f} real "
            f"tokens/s")


def headline_ddp_no_sync(variant: str, result: dict, summary: dict) -> str:
    dist = result["distributed"]
    return (f"{variant} (rank {dist['rank']} of {dist['world_size']}, {dist['backend']}): "
            f"{dist['collectives_per_step']:.0f} collective calls per step, "
            f"{dist['collective_ms_per_step']:,.0f} ms of the {step_ms(result):,.0f} ms step "
            f"in them")


def headline_host_roundtrip(variant: str, result: dict, summary: dict) -> str:
    gpu = result["gpu"]
    return (f"{variant}: {gpu['syncs_per_step']:.0f} host syncs and "
            f"{gpu['round_trips_per_step']:.0f} round trips per step; the GPU idles "
            f"{gpu['sync_idle_pct']:.1f} % of the steps in gaps a sync returns in")


def headline_llm_decode(variant: str, result: dict, summary: dict) -> str:
    gpu, tokens = result["gpu"], summary["config"]["new_tokens"]
    graphs = gpu.get("graph_launches_per_step", 0.0)
    return (f"{variant}: {summary['tokens_per_s']:,.0f} generated tokens/s; a token is "
            f"{gpu['kernels_per_step'] / tokens:.0f} kernels from "
            f"{gpu['launches_per_step'] / tokens:.1f} launch calls"
            + (f" ({graphs / tokens:.1f} of them CUDA graph launches)" if graphs else ""))


def headline_tokenizer_bound(variant: str, result: dict, summary: dict) -> str:
    region = (result.get("host_regions") or {}).get("tokenize") or {}
    return (f"{variant}: tokenizing {region.get('ms_per_step', 0.0):,.1f} ms of a "
            f"{step_ms(result):,.1f} ms batch; the GPU idles {region.get('gpu_idle_pct') or 0:.0f} "
            f"% of the steps while it runs")


HEADLINES = {"dataloader_workers": headline_dataloader_workers,
             "small_batch": headline_small_batch,
             "mixed_precision": headline_mixed_precision,
             "activation_checkpointing": headline_memory,
             "launch_overhead": headline_launch_overhead,
             "item_sync": headline_item_sync,
             "naive_attention": headline_memory,
             "unfused_optimizer": headline_unfused_optimizer,
             "padding_waste": headline_padding_waste,
             "host_roundtrip": headline_host_roundtrip,
             "llm_decode": headline_llm_decode,
             "tokenizer_bound": headline_tokenizer_bound,
             "ddp_no_sync": headline_ddp_no_sync}


# --- The data a figure draws. ------------------------------------------------------------------

class FigureError(ValueError):
    """A reference folder or demo that cannot be drawn; the message says which and why."""


@dataclass
class Panel:
    """One variant's part of the figure, in ms since its anchor."""
    variant: str
    headline: str
    origin_us: float  # the anchor, in the trace's µs
    end_ms: float  # the end of the variant's profiled steps (the later of host and GPU)
    step_edges_ms: np.ndarray  # step boundaries: the host's with zoom.until HOST, else the GPU's
    rows: dict[str, np.ndarray]  # row key -> busy share of each column (0..1), top row first
    gpu_busy_pct: float  # kernels' share of the window's part before end_ms
    sync_gaps_ms: Spans  # GPU idle gaps starting in that part that a host sync returns in

    @property
    def sync_gaps(self) -> int:
        return self.sync_gaps_ms.size
    memory_ms: np.ndarray = field(default_factory=lambda: np.empty(0))
    memory_mb: np.ndarray = field(default_factory=lambda: np.empty(0))


@dataclass
class FigureData:
    demo: str
    zoom: Zoom
    window_ms: tuple[float, float]
    edges_ms: np.ndarray  # COLUMNS + 1 column edges across the window
    panels: dict[str, Panel]  # bad, fixed


def trace_of(run_dir: Path) -> Path:
    """The run's trace: the one its summary.json names (rank 0's, where the folder holds one
    trace per rank), else its newest."""
    summary = json.loads((run_dir / trace.SUMMARY_FILE).read_text())
    named = summary.get("trace_file")
    if named and (run_dir / named).is_file():
        return run_dir / named
    return trace.newest_trace(run_dir)


def origin_of(analysis: analyze.Analysis, anchor: str) -> float:
    if anchor == GPU:
        return analysis.window[0]
    return min(analysis.host_window[0], analysis.window[0])


def step_end_ms(analysis: analyze.Analysis, zoom: Zoom) -> float:
    """When zoom.steps whole steps are over, in ms since the anchor: the later of the host
    step's and the GPU step's end, or the host step's with zoom.until HOST."""
    index = min(zoom.steps, analysis.steps.size) - 1
    host = analysis.columns.steps if analysis.columns.steps.size else analysis.steps
    end = host.end[min(index, host.size - 1)]
    if zoom.until != HOST:
        end = max(end, analysis.steps.end[index])
    return (end - origin_of(analysis, zoom.anchor)) / trace_steps.US_PER_MS


def row_spans(analysis: analyze.Analysis, key: str) -> Spans:
    """What row `key` draws. The GPU rows hold every kernel in the trace, not only the profiled
    steps': where the GPU runs behind the host, the kernels of earlier steps that run in the
    window are its work then (report.timeline_figure clips them, and an idle GPU would show)."""
    columns = analysis.columns
    if key == SYNC_ROW:
        sync = columns.runtime_is_sync
        return Spans(columns.runtime.start[sync], columns.runtime.end[sync])
    if key == COLLECTIVE_ROW:
        return columns.collective_spans
    if key == GPU_ROW:
        return analysis.kernel_busy
    if key == GPU_OPTIMIZER_ROW:
        return columns.gpu_optimizer
    if key.startswith(REGION_ROW_PREFIX):
        named = columns.annotation_names == key.removeprefix(REGION_ROW_PREFIX)
        return Spans(columns.annotations.start[named], columns.annotations.end[named])
    if key in KERNEL_CLASSES or key in KERNEL_COMPLEMENTS:
        named = KERNEL_CLASSES[KERNEL_COMPLEMENTS.get(key, key)]
        chosen = np.array([named(n) for n in columns.kernel_name_table],
                          dtype=bool)[columns.kernel_name_id]
        keep = chosen if key in KERNEL_CLASSES else ~chosen
        return Spans(columns.kernels.start[keep], columns.kernels.end[keep])
    return analysis.regions.get(key, Spans.empty())


def host_sync_ends(analysis: analyze.Analysis) -> np.ndarray:
    """When each host sync returned (µs): the analyzer's own list (syncs.host_syncs)."""
    columns = analysis.columns
    host = trace_steps.host_steps(columns)
    found = syncs.host_syncs(columns, host, trace_steps.runtime_step_index(columns, host))
    return np.sort(found.end)


def sync_gaps(analysis: analyze.Analysis, low_us: float, high_us: float) -> Spans:
    """The GPU idle gaps (between the merged kernels, copies and memsets, as the analyzer's idle
    causes take them) that start in [low_us, high_us) and that a host sync returns in: the GPU
    drained its queue for the host and waited for its next launch (idle cause host_sync)."""
    columns = analysis.columns
    busy = intervals.merge(intervals.concat(columns.kernels, columns.memcpy, columns.memset))
    if not busy.size:
        return Spans.empty()
    gap = syncs.gap_of(host_sync_ends(analysis), busy)
    # Gap k runs from busy interval k-1's end to busy interval k's start; gap 0 opens the trace
    # and the one after the last interval closes it: neither lies between GPU work.
    synced = np.unique(gap[(gap > 0) & (gap < busy.size)])
    start, end = busy.end[synced - 1], busy.start[synced]
    inside = (start >= low_us) & (start < high_us)
    return Spans(start[inside], end[inside])


def panel_of(demo: str, zoom: Zoom, variant: str, analysis: analyze.Analysis, summary: dict,
             edges_ms: np.ndarray) -> Panel:
    origin = origin_of(analysis, zoom.anchor)
    edges_us = origin + edges_ms * trace_steps.US_PER_MS
    extent_end = max(analysis.host_window[1], analysis.window[1])
    end_ms = (extent_end - origin) / trace_steps.US_PER_MS
    rows = {}
    for key in zoom.rows:
        spans = row_spans(analysis, key)
        if key in CPU_ROWS and not spans.size:
            continue  # a region this run does not have (data in ddp_no_sync)
        if key in CPU_ROWS:  # the host's regions in its profiled steps, as report draws them
            spans = intervals.clip(spans, *analysis.host_window)
        rows[key] = report.busy_share(spans, edges_us)
    low_us = edges_us[0]
    high_us = min(edges_us[-1], extent_end)
    covered = high_us - low_us
    busy = intervals.union_in(analysis.kernel_busy, low_us, high_us)
    gaps = sync_gaps(analysis, low_us, high_us)
    steps = analysis.steps  # as the GPU ran them (extended steps)
    if zoom.until == HOST and analysis.columns.steps.size:
        steps = analysis.columns.steps  # ProfilerStep#N on the host
    memory_ms = (analysis.memory_ts - origin) / trace_steps.US_PER_MS if zoom.memory else np.empty(0)
    return Panel(variant=variant, headline=HEADLINES[demo](variant, analysis.result, summary),
                 origin_us=origin, end_ms=end_ms,
                 step_edges_ms=(np.r_[steps.start, steps.end[-1:]] - origin) / trace_steps.US_PER_MS,
                 rows=rows, gpu_busy_pct=100.0 * busy / covered if covered > 0 else 0.0,
                 sync_gaps_ms=Spans(*((side - origin) / trace_steps.US_PER_MS for side in
                                      (gaps.start, gaps.end))),
                 memory_ms=memory_ms,
                 memory_mb=analysis.memory_mb if zoom.memory else np.empty(0))


def figure_data(demo: str, reference: Path = DEFAULT_REFERENCE) -> FigureData:
    """What the demo's figure draws: its window and, per variant, each row's busy share per
    column, the GPU's busy share and the sync gaps in the window, and the memory curve."""
    if demo not in ZOOMS:
        raise FigureError(f"unknown demo {demo!r}; choose from: {', '.join(DEMOS)}")
    zoom = ZOOMS[demo]
    analyses, summaries = {}, {}
    for variant in VARIANTS:
        run_dir = Path(reference) / demo / variant
        if not (run_dir / trace.SUMMARY_FILE).is_file():
            raise FigureError(f"{run_dir}: no {trace.SUMMARY_FILE} (not a reference run)")
        summaries[variant] = json.loads((run_dir / trace.SUMMARY_FILE).read_text())
        try:
            analyses[variant] = analyze.analyze(trace_of(run_dir))
        except trace.TraceError as error:
            raise FigureError(f"{run_dir}: {error}") from None
    if zoom.width_ms is None:
        window = (0.0, step_end_ms(analyses[zoom.of], zoom))
    else:
        window = (zoom.start_ms, zoom.start_ms + zoom.width_ms)
    edges_ms = np.linspace(*window, COLUMNS + 1)
    panels = {v: panel_of(demo, zoom, v, analyses[v], summaries[v], edges_ms) for v in VARIANTS}
    return FigureData(demo=demo, zoom=zoom, window_ms=window, edges_ms=edges_ms, panels=panels)


# --- Drawing. ------------------------------------------------------------------------------------

def draw_panel(ax, data: FigureData, panel: Panel) -> None:
    low, high = data.window_ms
    keys = list(panel.rows)
    for y, key in enumerate(keys):
        share = panel.rows[key]
        # Rows grow up from their baseline (y + 0.4: the y axis runs top down).
        ax.fill_between(data.edges_ms, y + 0.4, y + 0.4 - ROW_FILL * np.r_[share, share[-1]],
                        step="post", lw=0, color=ROW_COLORS.get(
                            key, report.HOST_REGION_COLORS[0] if key.startswith(REGION_ROW_PREFIX)
                            else GPU_COLOR))
    if GPU_ROW in keys and SYNC_ROW in keys:  # the gaps the syncs leave on the GPU, shaded
        y = keys.index(GPU_ROW)
        for start, end in zip(panel.sync_gaps_ms.start, panel.sync_gaps_ms.end):
            ax.fill_between([start, end], y + 0.4, y - 0.4, color=SYNC_GAP_COLOR, lw=0,
                            zorder=0)
    for edge in panel.step_edges_ms[(panel.step_edges_ms >= low) & (panel.step_edges_ms <= high)]:
        ax.axvline(edge, color="#616161", lw=0.8, ls="--", zorder=0)  # behind the rows
    if panel.end_ms < high:  # past the profiled steps: nothing recorded, not an idle GPU
        ax.axvspan(max(panel.end_ms, low), high, color=BEYOND_COLOR, zorder=0, lw=0)
        ax.text((max(panel.end_ms, low) + high) / 2, (len(keys) - 1) / 2,
                f"{panel.variant}'s profiled steps end here", ha="center", va="center",
                fontsize=8, color="#757575")
    labels = [ROW_LABELS.get(key, key.removeprefix(REGION_ROW_PREFIX)) for key in keys]
    labels = [f"{label}\n(busy {panel.gpu_busy_pct:.0f} % here)" if key == GPU_ROW else label
              for label, key in zip(labels, keys)]
    if SYNC_ROW in keys:
        labels[keys.index(GPU_ROW)] += f"\n{panel.sync_gaps} idle after a sync"
    ax.set_yticks(range(len(keys)), labels, fontsize=8)
    ax.set_ylim(len(keys) - 0.4, -0.6)  # first row on top
    ax.set_xlim(low, high)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(panel.headline, fontsize=9, loc="left")


def draw_memory(ax, data: FigureData) -> None:
    low, high = data.window_ms
    for panel in data.panels.values():
        if not panel.memory_mb.size:
            continue
        # The curve's value at `low`: the last event before it, then every event in the window.
        first = max(int(np.searchsorted(panel.memory_ms, low, side="right")) - 1, 0)
        last = int(np.searchsorted(panel.memory_ms, high, side="right"))
        ms, mb = panel.memory_ms[first:last], panel.memory_mb[first:last]
        ax.step(np.r_[max(ms[0], low), ms[1:], min(high, panel.end_ms)], np.r_[mb, mb[-1]],
                where="post", lw=1.2, color=report.VARIANT_COLORS[panel.variant],
                label=f"{panel.variant}: peak {report.format_mb(panel.memory_mb.max())}")
    ax.set_xlim(low, high)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("allocated MB", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("GPU memory allocated (the trace's [memory] events, timed when the host asks)",
                 fontsize=9, loc="left")


def fmt_ms(value: float) -> str:
    """Three significant figures, never an exponent: "2,405 ms", "19.8 ms", "3.5 ms"."""
    return f"{value:,.0f} ms" if abs(value) >= 100 else f"{value:.3g} ms"


def column_text(data: FigureData) -> str:
    column_us = (data.window_ms[1] - data.window_ms[0]) / COLUMNS * trace_steps.US_PER_MS
    return (fmt_ms(column_us / trace_steps.US_PER_MS) if column_us >= trace_steps.US_PER_MS
            else f"{column_us:.3g} µs")


def axis_label(data: FigureData) -> str:
    since = ("its first profiled step began on the GPU" if data.zoom.anchor == GPU
             else "its first profiled step began")
    lines = ("the host's step boundaries" if data.zoom.until == HOST
             else "step boundaries as the GPU ran them")
    return (f"ms since each variant's {since.removeprefix('its ')}, the same scale for both; "
            f"dashed: {lines}\n"
            f"a row's height: the share of each {column_text(data)} column it is busy")


def figure(data: FigureData):
    heights = [PANEL_EXTRA_IN + ROW_HEIGHT_IN * max(len(p.rows), 1) for p in data.panels.values()]
    if data.zoom.memory:
        heights.append(MEMORY_PANEL_IN)
    fig, axes = plt.subplots(len(heights), 1, sharex=True, squeeze=False,
                             figsize=(FIGURE_WIDTH_IN, sum(heights) + 0.6),
                             gridspec_kw={"height_ratios": heights})
    for ax, panel in zip(axes[:, 0], data.panels.values()):
        draw_panel(ax, data, panel)
    if data.zoom.memory:
        draw_memory(axes[-1, 0], data)
    axes[-1, 0].set_xlabel(axis_label(data), fontsize=8)
    width = data.window_ms[1] - data.window_ms[0]
    fig.suptitle(f"{data.demo}: bad above fixed, {data.zoom.what} "
                 f"({fmt_ms(width)} from {fmt_ms(data.window_ms[0])})", fontsize=10)
    return fig


def write_figure(demo: str, reference: Path = DEFAULT_REFERENCE,
                 out_root: Path = DEFAULT_OUT_ROOT) -> Path:
    """Draw demo's figure from the reference run into out_root/<demo>/trace.png; return it."""
    data = figure_data(demo, reference)
    out = Path(out_root) / demo / FIGURE_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = figure(data)
    fig.tight_layout()
    fig.savefig(out, dpi=FIGURE_DPI, metadata=PNG_METADATA)
    plt.close(fig)
    return out


def in_reference(demo: str, reference: Path) -> bool:
    return all((reference / demo / variant / trace.SUMMARY_FILE).is_file() for variant in VARIANTS)


def main(argv: list[str] | None = None) -> int:
    parser = trace.OneLineArgumentParser(  # a bad flag, folder or demo: one line, exit code 2
        prog="walkthrough_figures.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit code 2: an unknown demo, or a reference folder without the pair's runs "
               "(with no DEMO given, a pair the folder lacks is skipped, with a line).")
    parser.add_argument("demos", nargs="*", metavar="DEMO",
                        help=f"demos to draw (default: all {len(DEMOS)})")
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE, metavar="FOLDER",
                        help="a reference run: FOLDER/<demo>/{bad,fixed} "
                             "(default: traces/reference/h100)")
    parser.add_argument("--out-root", type=Path, default=DEFAULT_OUT_ROOT, metavar="DIR",
                        help="write DIR/<demo>/trace.png (default: demos)")
    flags = parser.parse_args(argv)
    unknown = [demo for demo in flags.demos if demo not in ZOOMS]
    if unknown:
        parser.error(f"unknown demo {unknown[0]!r}; choose from: {', '.join(DEMOS)}")
    if not flags.reference.is_dir():
        parser.error(f"{flags.reference}: no such directory")
    try:
        for demo in flags.demos or DEMOS:
            if not flags.demos and not in_reference(demo, flags.reference):
                print(f"skipped {demo}: no run of it under {flags.reference} (its picture waits "
                      f"for a reference run that has it)")
                continue
            out = write_figure(demo, flags.reference, flags.out_root)
            print(f"wrote {out} ({out.stat().st_size // 1024} KB)")
    except FigureError as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
