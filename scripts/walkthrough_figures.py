"""Draw the picture at the top of every walkthrough: demos/<demo>/trace.png, bad above fixed.

For each pair, from a committed reference run (traces/reference/h100/<demo>/{bad,fixed}, else
traces/reference/cpu/<demo>/{bad,fixed}: a GPU run replaces a CPU one as soon as it exists): one
figure, bad above fixed on one shared time axis (the same ms scale for both, each variant from
its own first profiled step), zoomed to where the pair's bottleneck shows (ZOOMS and CPU_ZOOMS
say where and why, per demo). Each row is the share of every column of time it is busy, as
common/report.py's timeline draws it: the CPU regions that matter (data, enumerate(DataLoader),
forward, backward, optimizer), the host's syncs or collective calls where they are the lesson,
the GPU's kernels, and on a CPU run the PyTorch operators; where torch.compile is the lesson, its
compiled regions by Dynamo frame (each one's frame/compile id written beside it), the compiled
graphs' calls and the operators run eagerly inside regions (common/compiled.py's definitions);
dashed lines are step boundaries.
Where memory is the lesson, a third panel draws memory allocated over the same window, from the
trace's [memory] events.
The optimization ladder (demos/ladder/, its rungs' runs in <reference>/ladder/rung<K>_<fix>/) is
drawn the same way, its first rung in bad's place and its last (every fix) in fixed's; and beside
it demos/ladder/waterfall.png, a bar of samples/s per rung (common/report.py's waterfall_figure,
which the report draws too). The memory ladder (demos/memory_ladder/) is drawn so too, with memory
allocated under its two rungs (rung 0 as first written, the last with every fix), and beside it
demos/memory_ladder/fits.png, each rung's peak held against the memory budget
(common/report.py's memory_ladder_figure, which the report draws too).

Every number in a title is one that `python -m common.compare` or `python -m common.analyze`
prints for the run, as they print it (one decimal for a percentage): the step p50, throughput,
GPU utilization and idle (with its causes, as the analyzer's "GPU idle" line names them) are
compare's table cells; the rest are the analyzer's. Where the profiled steps drawn took more
than 1.2x the timed step p50 (or less than 1/1.2 of it), the panel says so under its title.
Imports no torch.

Examples:
  .venv/bin/python scripts/walkthrough_figures.py                  every demo, into demos/
  .venv/bin/python scripts/walkthrough_figures.py item_sync --out-root /tmp/figures
  .venv/bin/python scripts/walkthrough_figures.py ladder          trace.png and waterfall.png
  .venv/bin/python scripts/walkthrough_figures.py memory_ladder   trace.png and fits.png
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file, from any directory

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only: no display, no GUI toolkit
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from common import (analyze, compare, compiled, intervals, ladder, recorded, report,  # noqa: E402
                    syncs, trace, trace_steps)
from common.idle_causes import compiling_operators, names_where  # noqa: E402
from common.intervals import Spans  # noqa: E402
from common.kernel_names import ATTENTION_PATTERN, uses_tensor_cores  # noqa: E402
from common.trace_columns import DATALOADER_REGION  # noqa: E402

DEMOS = ("dataloader_workers", "small_batch", "mixed_precision", "activation_checkpointing",
         "launch_overhead", "item_sync", "naive_attention", "unfused_optimizer", "padding_waste",
         "ddp_no_sync", "host_roundtrip", "llm_decode", "tokenizer_bound", "memory_leak",
         "recompiles", "ladder", "memory_ladder")
# Demos whose runs are a ladder's rungs (common/ladder.py), not a bad and a fixed run: the speed
# ladders (a waterfall of samples/s beside their picture) and the memory ladders (a chart of
# which rungs fit the memory budget beside theirs).
LADDERS = ("ladder",)
MEMORY_LADDERS = tuple(sorted(ladder.MEMORY_LADDERS))
REFERENCE_ROOT = ROOT / "traces" / "reference"
# Where a pair's picture is drawn from, the first folder that has both its runs: the H100 run,
# else a CPU run (for the pairs the H100 reference does not have yet).
DEFAULT_REFERENCES = (REFERENCE_ROOT / "h100", REFERENCE_ROOT / "cpu")
DEFAULT_OUT_ROOT = ROOT / "demos"
FIGURE_NAME = "trace.png"
WATERFALL_NAME = "waterfall.png"  # a ladder's bar of samples/s per rung, beside its trace.png
FITS_NAME = "fits.png"  # a memory ladder's bar of peak memory per rung against its budget
# ("bad", "fixed"): bad drawn above fixed. They name the panels' places too: a ladder's first
# rung takes bad's, its last rung fixed's (runs_drawn).
VARIANTS = compare.VARIANTS
FIGURE_WIDTH_IN = 10.0  # the width a README shows at full size on a laptop screen
# ~900 px wide: sharp enough in a README, and each PNG stays well under 120 KB (the walkthroughs
# carry one each in the repository).
FIGURE_DPI = 90
ROW_HEIGHT_IN = 0.42  # one row of a variant's panel: its label in 8 pt fits with room to spare
PANEL_EXTRA_IN = 0.75  # a panel's title and margins, on top of its rows
TITLE_LINE_IN = 0.2  # each further line of a panel's title (the profiled-vs-timed note)
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
BEYOND_TEXT_MIN = 0.25  # share of the window that part needs for its words to fit in it
SYNC_COLOR = "#ef6c00"  # report.IDLE_COLORS["host_sync"]: the host waiting for the GPU
# The GPU idle after a host sync (idle cause host_sync), shaded behind the GPU row: a pale
# SYNC_COLOR, so the kernels drawn over it stay readable.
SYNC_GAP_COLOR = "#ffcc80"
COLLECTIVE_COLOR = "#00838f"  # teal: apart from the regions' blues, which it sits between
GPU_COLOR = "#2e7d32"  # report's GPU row
# Kernels with no launch call in the trace, in the GPU row: launched before the recording began
# (a GPU that runs behind the host is still working through earlier steps), a pale GPU_COLOR.
EARLIER_KERNEL_COLOR = "#a5d6a7"
EARLIER_KERNELS_SHOWN_MIN = 2.0  # columns' worth of them in the window: two pixels, seen
OPERATOR_COLOR = "#455a64"  # a CPU run's operators: grey-blue, apart from the regions' colours
# Compiled regions, a colour per Dynamo frame (0, 1, ...; cycled beyond): indigo and teal, apart
# from forward's and backward's blues and from the graphs' green.
FRAME_COLORS = ("#3949ab", "#00897b", "#6d4c41")
GRAPH_CALL_COLOR = "#7cb342"  # a light green: compiled code running, as the GPU rows' green is work
# Eager operators inside compiled regions: report's colour for bad, the cost the lesson is about.
EAGER_IN_REGIONS_COLOR = report.VARIANT_COLORS["bad"]
REGION_ID_FONT_PT = 7  # the "F/C" beside each compiled region: under the rows' 8 pt labels
REGION_ID_PAD = 0.004  # its gap from the region's end, as a share of the window's width
NAMED_OPERATOR_COLOR = "#d84315"  # one operator picked out by name (the cache's aten::cat)
NOTE_COLOR = "#616161"  # the grey of the lines that qualify a title
NOTE_WIDTH = 120  # characters a line of the figure's note: what 10 pt fits across the figure
# Characters a line of a panel's headline: 9 pt across a panel beside its row labels fits about
# 130 (the ladder's, measured: 136 characters ran 0.2 in past the figure); wider labels leave less.
HEADLINE_WIDTH = 110
# A row split in two by kernel name: the row that is the lesson dark, the rest a pale green.
TENSOR_CORE_COLOR = "#1b5e20"
CUDA_CORE_COLOR = "#9ccc65"
# A panel's profiled steps and its headline's timed steps "differ" beyond this factor either way:
# compare's own threshold for its warning (profiled step p50 / timed step p50).
PROFILED_VS_TIMED_MAX = trace.PROFILER_OVERHEAD_WARN_RATIO

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
OPERATORS_ROW = "operators"  # every PyTorch operator on the host (cpu_op), merged: its gaps are
# time in no operator (Python, or a library outside PyTorch)
# A row of the user's record_function ranges of one name (the trace's user_annotation spans, as
# the analyzer's host regions read them): "region:tokenize".
REGION_ROW_PREFIX = "region:"
# A row of the compiled regions of one Dynamo frame ("Torch-Compiled Region: F/C" operators, read
# by compiled.REGION_NAME): "frame:1" is the frame Dynamo resumes after a graph break in frame 0.
# Each region's "F/C" is written beside it: a compile id that changes from call to call is a
# recompile.
FRAME_ROW_PREFIX = "frame:"
GRAPH_CALL_ROW = "compiled_graphs"  # compiled graphs run: operators of compiled.GRAPH_CALL_PREFIXES
# The operators common/compiled.py counts as eager inside compiled regions: the code between two
# graphs at a graph break, or a frame Dynamo declined to compile (past its recompile limit).
EAGER_IN_REGIONS_ROW = "eager_in_regions"
# A row of the operators whose name starts with the text after the prefix: "op:aten::cat".
OPERATOR_ROW_PREFIX = "op:"
CPU_ROWS = report.TIMELINE_ROWS
ROW_LABELS = {DATALOADER_REGION: "enumerate(DataLoader)", SYNC_ROW: "host waits for the GPU",
              COLLECTIVE_ROW: "all-reduce calls", GPU_ROW: "GPU kernels",
              GPU_OPTIMIZER_ROW: "GPU: optimizer", TENSOR_CORE_ROW: "GPU: tensor-core kernels",
              CUDA_CORE_ROW: "GPU: kernels not on\ntensor cores",
              ATTENTION_ROW: "GPU: attention kernels", NOT_ATTENTION_ROW: "GPU: other kernels",
              OPERATORS_ROW: "PyTorch operators\n(gaps: none runs)",
              GRAPH_CALL_ROW: "compiled graphs run\n(forward, backward)",
              EAGER_IN_REGIONS_ROW: "eager operators\ninside regions"}
ROW_COLORS = {**report.REGION_COLORS, SYNC_ROW: SYNC_COLOR, COLLECTIVE_ROW: COLLECTIVE_COLOR,
              GPU_ROW: GPU_COLOR, GPU_OPTIMIZER_ROW: report.REGION_COLORS["optimizer"],
              TENSOR_CORE_ROW: TENSOR_CORE_COLOR, CUDA_CORE_ROW: CUDA_CORE_COLOR,
              ATTENTION_ROW: TENSOR_CORE_COLOR, NOT_ATTENTION_ROW: CUDA_CORE_COLOR,
              OPERATORS_ROW: OPERATOR_COLOR, GRAPH_CALL_ROW: GRAPH_CALL_COLOR,
              EAGER_IN_REGIONS_ROW: EAGER_IN_REGIONS_COLOR}
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
# Words under the figure's title of a CPU run (the pairs the GPU reference lacks so far).
CPU_RUN_NOTE = "needs a CUDA GPU; not yet run on one"
# A pair whose whole lesson shows on a CPU says so instead (memory allocated step by step;
# Dynamo's compiled regions, which are the host's).
CPU_LESSON_NOTE = "its lesson shows on a CPU too; not yet run on a GPU"
# The ladder's first fix (DataLoader workers) shows on a CPU as on a GPU: rung 0's steps wait on
# its DataLoader, the last rung's do not. The memory ladder's fixes each cut the tensors a step
# allocates, which the profiler's [memory] events record on a CPU as on a GPU.
CPU_LESSON_DEMOS = ("memory_leak", "recompiles", "ladder", "memory_ladder")
# The memory ladder's picture comes from a CPU run even beside a GPU's: at the cuda preset rung 0
# stops at the 16 GB cap, leaving no trace to draw (in_reference).
CPU_LESSON_NOTES = {
    "memory_ladder": "its lesson shows on a CPU too; a GPU's rung 0 stops at the cap"}


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
    of: str = "bad"  # bad's place (a ladder's first rung) or fixed's (its last)
    until: str = GPU
    memory: bool = False  # a memory-over-time panel under the two variants
    what: str = ""  # the window in words, for the figure's title (no numbers: the axis has them)
    note: str = ""  # a line under the figure's title: what to read the picture by, in words
    labels: tuple[tuple[str, str], ...] = ()  # (row key, label) where a pair names a row its way
    # Arrows with words at the first host wait and the first GPU gap after one in bad's panel
    # (the rows SYNC_ROW and GPU_ROW): where the waits are the lesson.
    point_at_waits: bool = False


# Under a ladder's title: what its two panels are, and why the longer step can be the faster run.
LADDER_NOTE = ("rung 0: the script as first written; the last rung: the same with every fix "
               "(each rung's gain: waterfall.png). A larger batch is one of the fixes: a step "
               "takes longer and trains more samples a second")

# Under the memory ladder's title: what its two panels are, and where the rest of the ladder is.
MEMORY_LADDER_NOTE = ("rung 0: the model as first written; the last rung: the same with every fix "
                      "(BF16 weights, activation checkpointing, gradient accumulation in 4 "
                      "micro-batches, SDPA attention). Which rungs fit the memory budget: "
                      "fits.png")

ZOOMS = {
    # Whole steps: bad's step is over 2 s, nearly all of it the DataLoader decoding images in the
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
    "activation_checkpointing": Zoom(
        HOST, ("forward", "backward", "optimizer", GPU_ROW), steps=1, of="fixed", until=HOST,
        memory=True, what="one host step of fixed, with memory allocated",
        note="GPU bound: the host runs a step ahead of the GPU, which is busy throughout (pale: "
             "kernels of earlier steps); memory follows the host; dashed lines: the host's steps"),
    # fixed (a CUDA graph) runs a whole step in about 5 ms; in the same 5 ms bad's CPU has not
    # finished launching the forward pass, and its GPU row is thin slivers of tiny kernels.
    "launch_overhead": Zoom(HOST, ("forward", "backward", "optimizer", GPU_ROW), steps=1,
                            of="fixed", what="one step of fixed"),
    # Two blocks of the backward pass, 1.4 ms from 12.2 ms into the first step (the backward
    # runs from about 6.7 to 25 ms in bad, 10 to 23 ms in fixed): in bad each block's gradient
    # hook ends in a host wait (~10 µs: the GPU has nearly caught up, the pair is launch bound)
    # and the GPU idles ~60 µs after it, until the host launches again (shaded); fixed's blocks
    # run without. At this zoom a wait is a few pixels and a gap tens (at 3.5 ms they were two
    # and thirteen); the arrows name them. At a whole step (about 26 ms) bad and fixed look
    # alike: both are launch bound.
    "item_sync": Zoom(HOST, ("backward", SYNC_ROW, GPU_ROW), start_ms=12.2, width_ms=1.4,
                      what="two blocks of the backward pass",
                      labels=((SYNC_ROW, "host waits for the GPU\n(.item())"),
                              (GPU_ROW, "GPU kernels\n(shaded: idle after a wait)")),
                      point_at_waits=True),
    # Memory is the lesson (the [s, s] score matrices), and the host runs ahead of the GPU:
    # bad's three host steps (13, 21 and 72 ms on the host: the third waits for the GPU), each
    # with its peak of score matrices, end before the GPU starts the first of them; the GPU
    # then runs three steps of 72 ms, the step time the title gives. The window runs to the end
    # of bad's third step on the GPU, and the dashed lines are the steps as the GPU ran them.
    # fixed's host and GPU steps are over in a sixth of it.
    "naive_attention": Zoom(
        HOST, ("forward", "backward", "optimizer", GPU_ROW), steps=3, memory=True,
        what="bad's three profiled steps, host and GPU, with memory allocated",
        note="the host runs ahead: its three steps are over before the GPU starts the first "
             "of them (dashed lines: the steps as the GPU ran them; pale: kernels of earlier "
             "steps); memory follows the host"),
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
    # idle after it; fixed's three steps fit in bad's forward (H100: 19 ms of forward, the GPU
    # idle after syncs for most of it; fixed's step 3.1 ms).
    "host_roundtrip": Zoom(HOST, ("forward", SYNC_ROW, "backward", "optimizer", GPU_ROW),
                           steps=1, what="one step of bad"),
    # 5 ms of decoding, from 10 ms into the first request (after the 128-token prompt's pass):
    # bad's GPU row a comb of kernel slivers, a token's ~111 kernels each launched on its own;
    # fixed's a dense block a token (one CUDA graph launch each), many tokens in the same 5 ms.
    # So on the H100 reference: bad's kernels busy 16 % of the window, fixed's 70 %.
    "llm_decode": Zoom(HOST, ("region:decode", GPU_ROW), start_ms=10.0, width_ms=5.0,
                       what="5 ms of decoding"),
    # One batch of bad: the tokenize region holds most of it with the GPU idle, the model's
    # forward a short burst after it; fixed's three batches fit in bad's tokenizing (H100:
    # 1.7 s of tokenizing a batch, fixed's 184 ms a batch).
    "tokenizer_bound": Zoom(HOST, ("region:tokenize", "forward", GPU_ROW), steps=1,
                            what="one batch of bad"),
    # Memory is the lesson, over many steps: bad's recorded steps but the last (whose log region
    # is the epoch's end, an accuracy over every kept logit, as long as a few steps), each
    # leaving its logits behind, so the memory curve climbs a stair a step; fixed's curve rises
    # and falls to the same floor in each of its steps, on the same scale.
    "memory_leak": Zoom(HOST, ("forward", "backward", "optimizer", "region:log"), steps=23,
                        until=HOST, memory=True,
                        what="bad's first 23 recorded steps, with memory allocated"),
    # torch.compile's regions are the lesson, and they are the host's: bad's 8 recorded steps
    # (the preset's recorded_steps, CPU and CUDA alike), in which the depths it compiled and the
    # depths past the recompile limit alternate. A compiled depth: frame 0's region (forward up
    # to the .item()) holds frame 1's (the rest, its compile id a new one each depth), graphs
    # run end to end, a short step. A depth past the limit: no frame-1 region, the blocks'
    # operators run eagerly inside frame 0's region (red) and their backward eagerly too, a
    # step 2 to 3 times as long (6.2 to 8.7 ms against 2.5 to 2.7 ms on the CPU reference).
    # fixed's 8 steps, one region and one forward and one backward graph a step, end inside
    # bad's fourth (CPU), inside its eighth on the H100, where both are launch bound.
    "recompiles": Zoom(HOST, ("forward", "backward", FRAME_ROW_PREFIX + "0",
                              FRAME_ROW_PREFIX + "1", GRAPH_CALL_ROW, EAGER_IN_REGIONS_ROW),
                       steps=8, until=HOST,
                       what="bad's 8 recorded steps, both compiled whole (torch.compile)",
                       note="beside each compiled region, its frame/compile id; past the "
                            "recompile limit a depth runs its blocks eagerly (red; its backward "
                            "too); bad's samples/s counts its timed steps' compiling, the "
                            "recorded steps hold none",
                       labels=((FRAME_ROW_PREFIX + "0", "compiled regions,\nframe 0 (forward)"),
                               (FRAME_ROW_PREFIX + "1", "frame 1: forward\nafter the .item()"))),
    # The ladder as dataloader_workers draws its pair: rung 0 decodes its JPEGs in the training
    # process, the GPU idle meanwhile; the last rung (workers, a larger batch, BF16, compiled, a
    # fused optimizer) runs several steps in one of rung 0's: about three on the H100 reference.
    "ladder": Zoom(HOST, (DATALOADER_REGION, "forward", "backward", "optimizer", GPU_ROW),
                   steps=1, what="one step of rung 0", note=LADDER_NOTE),
    # The CPU window (CPU_ZOOMS), with the GPU row: memory follows the host on a GPU too, so one
    # host step of rung 0 holds its climb and its fall. Drawn only from a GPU run whose rung 0
    # ran: on the H100 reference it ran out of memory at the 16 GB cap (as rung 1 did), so the
    # picture comes from the CPU reference and the chart of what fits from the H100's
    # (in_reference, fits_reference_of).
    "memory_ladder": Zoom(HOST, ("forward", "backward", "optimizer", GPU_ROW), steps=1,
                          until=HOST, memory=True,
                          what="one host step of rung 0, with memory allocated",
                          note=MEMORY_LADDER_NOTE),
}

# The pairs whose picture comes from a CPU run until the GPU reference has them: what a CPU
# shows of the lesson (the host's side of it: no kernels, no waits).
CPU_ZOOMS = {
    # One step of the last rung, the longer (its batch is 4 times rung 0's: 64 samples in 394 ms
    # against 16 in 313 ms on the CPU reference), so each panel shows a whole step: rung 0's
    # opens with its DataLoader decoding (29 % of its steps), the last rung's has no wait.
    "ladder": Zoom(HOST, (DATALOADER_REGION, "forward", "backward", "optimizer"), steps=1,
                   of="fixed", what="one step of the last rung", note=LADDER_NOTE),
    # The same window as on a GPU: the allocations follow the host on both.
    "memory_leak": ZOOMS["memory_leak"],
    # One host step of rung 0, the longer (3.9 s against the last rung's 1.4 s on the CPU
    # reference, both at batch 8), so each panel shows a whole step: rung 0's forward builds its
    # saved activations (974 MB of its 1,262 MB peak, the analyzer's "memory peak" line), its
    # backward's gradients add the rest before it frees them; the last rung's curve stays at tens
    # of MB (a small tooth per micro-batch, flat at this scale), about three steps of it in the
    # same window.
    "memory_ladder": Zoom(HOST, ("forward", "backward", "optimizer"), steps=1, until=HOST,
                          memory=True, what="one host step of rung 0, with memory allocated",
                          note=MEMORY_LADDER_NOTE),
    # The same window as on a GPU: Dynamo's regions and the eager operators are the host's.
    "recompiles": ZOOMS["recompiles"],
    # One request of bad (at --smoke sizes: its prompt's pass, then 8 tokens): each token runs
    # every block's operators one by one, the KV cache's aten::cat among them; fixed's token is
    # one call of the compiled graph (its "Torch-Compiled Region"), and more than a request of
    # fixed fits in the same time.
    "llm_decode": Zoom(HOST, ("region:decode", OPERATORS_ROW, "op:aten::cat",
                              "op:Torch-Compiled Region"), steps=1,
                       what="one request of bad (its prompt, then a token at a time)",
                       labels=(("op:aten::cat", "aten::cat\n(the KV cache)"),
                               ("op:Torch-Compiled Region", "compiled region\n(a token a call)"))),
    # One batch of bad: the tokenize region holds the host with no operator running (Python
    # turning text into ids), then the model's operators; fixed tokenizes in Rust threads, a
    # short stretch before its forward.
    "tokenizer_bound": Zoom(HOST, ("region:tokenize", "forward", OPERATORS_ROW), steps=1,
                            what="one batch of bad"),
    # One step of bad: in its forward the Python loop of per_sample_weights runs between
    # operators (gaps in the operators row); fixed's operators run end to end.
    "host_roundtrip": Zoom(HOST, ("forward", OPERATORS_ROW, "backward", "optimizer"), steps=1,
                           what="one step of bad"),
}


# --- Headlines: what each panel's title says, every number as compare or analyze prints it. ---

@dataclass
class Run:
    """One variant's run as its headline reads it."""
    variant: str  # its folder, which names it in the figure: bad, fixed, or a rung (rung0_baseline)
    summary: dict
    result: dict  # analyze's JSON result
    analysis: analyze.Analysis
    cells: dict[str, str]  # compare's table, this variant's column: row label -> the text printed
    # The run drawn above this one, for a headline that measures against it (a ladder's last
    # rung against rung 0); None in the top panel.
    first: Run | None = None

    def cell(self, label: str) -> str:
        """Compare's cell for this variant in row `label`, as compare prints it ("n/a": none)."""
        return self.cells.get(label, "n/a")

    @property
    def config(self) -> dict:
        return self.summary.get("config") or {}


def as_printed(value: float | None, spec: str) -> str:
    """A number as the analyzer's human output prints it (analyze.format_human's spec)."""
    return "n/a" if value is None else f"{value:{spec}}"


def idle_row(cause: str) -> str:
    """Compare's row of one GPU idle cause, named as the analyzer's "GPU idle" line names it."""
    return f"GPU idle: {analyze.IDLE_CAUSE_LABELS[cause]} %"


def gpu_idle(run: Run, *causes: str) -> str:
    """"GPU idle 93.3 % of the steps: DataLoader 92.9": the window's idle (100 - utilization) and
    the causes named, in the words and digits of the analyzer's "GPU idle" line."""
    parts = ", ".join(f"{analyze.IDLE_CAUSE_LABELS[cause]} {run.cell(idle_row(cause))}"
                      for cause in causes)
    return f"GPU idle {run.cell('GPU idle %')} % of the steps" + (f": {parts}" if parts else "")


def headline_dataloader_workers(run: Run) -> str:
    return f"{run.variant} (num_workers={run.config.get('num_workers')}): " + gpu_idle(
        run, "dataloader")


def headline_small_batch(run: Run) -> str:
    return (f"{run.variant} (batch {run.summary['batch_size']}): GPU utilization "
            f"{run.cell('GPU utilization %')} % of the steps, median kernel "
            f"{run.cell('median kernel us')} µs, {run.cell('samples/s')} samples/s")


def headline_mixed_precision(run: Run) -> str:
    return (f"{run.variant} ({compare.precision(run.summary, run.result)}): step p50 "
            f"{run.cell('step p50 ms')} ms, tensor cores "
            f"{run.cell('tensor cores % of kernel time')} % of kernel time")


def headline_memory(run: Run) -> str:
    # The trace's peak (what the memory panel draws), as the analyzer prints it; the summary's
    # (torch.cuda.max_memory_allocated over every step) is compare's "peak memory MB".
    return (f"{run.variant}: peak memory {as_printed(run.result['peak_memory_mb'], '.0f')} MB in "
            f"the trace, step p50 {run.cell('step p50 ms')} ms")


def headline_launch_overhead(run: Run) -> str:
    compiled = run.config.get("torch_compile")
    how = f"torch.compile({compiled})" if compiled else "eager"
    return (f"{run.variant} ({how}): {run.cell('launches/step')} launches/step, step p50 "
            f"{run.cell('step p50 ms')} ms, GPU utilization {run.cell('GPU utilization %')} %")


def headline_item_sync(run: Run) -> str:
    return (f"{run.variant}: {run.cell('syncs/step')} syncs/step (of {run.result['steps']} "
            f"recorded steps); " + gpu_idle(run, "host_sync", "launch"))


def headline_unfused_optimizer(run: Run) -> str:
    optimizer = run.result["optimizer"] or {}
    return (f"{run.variant} ({run.config.get('optimizer')}): optimizer GPU "
            f"{run.cell('optimizer GPU ms/step')} ms/step, CPU "
            f"{run.cell('optimizer CPU ms/step')} ms/step, "
            f"{as_printed(optimizer.get('ops_per_step'), '.0f')} operators per step")


def headline_padding_waste(run: Run) -> str:
    return (f"{run.variant} ({run.summary['batch_size']} sequences a step): padding "
            f"{run.cell('padding %')} % of the tokens, {run.cell('real tokens/s')} real "
            f"tokens/s, GPU utilization {run.cell('GPU utilization %')} %")


def headline_ddp_no_sync(run: Run) -> str:
    dist = run.result["distributed"]
    return (f"{run.variant} (rank {dist['rank']} of {dist['world_size']}, {dist['backend']}): "
            f"{as_printed(dist['collectives_per_step'], '.1f')} collectives/step, "
            f"{as_printed(dist['collective_ms_per_step'], '.1f')} ms/step in them, step p50 "
            f"{run.cell('step p50 ms')} ms")


def headline_host_roundtrip(run: Run) -> str:
    if not run.result["gpu"]:  # a CPU run: the Python between the operators is what costs
        breakdown = run.result["step_breakdown_ms"]
        return (f"{run.variant}: {run.cell('samples/s')} samples/s, step p50 "
                f"{run.cell('step p50 ms')} ms; breakdown ms/step: cpu_exec "
                f"{as_printed(breakdown['cpu_exec'], '.1f')} (in operators), other "
                f"{as_printed(breakdown['other'], '.1f')} (no operator running)")
    return (f"{run.variant}: {run.cell('syncs/step')} syncs/step, "
            f"{as_printed(run.result['gpu']['round_trips_per_step'], '.1f')} round trips/step; "
            + gpu_idle(run, "host_sync"))


def operator_calls(run: Run, prefix: str) -> float:
    """Calls per step of the operators whose name starts with `prefix`, as compare's "what
    changed" counts them (trace_steps.time_by_name)."""
    analysis = run.analysis
    times = trace_steps.time_by_name(analysis.columns, analysis.window, analysis.steps.size,
                                     host_window=analysis.host_window,
                                     compiling=compiling_operators(analysis.columns))
    return sum(calls for name, (_, calls) in times.operators.items() if name.startswith(prefix))


def headline_llm_decode(run: Run) -> str:
    tokens = run.config.get("new_tokens")
    compiled = run.config.get("torch_compile")
    how = f"torch.compile({compiled})" if compiled else "eager"
    if not run.result["gpu"]:  # a CPU run: the operators a token runs, the cache's among them
        return (f"{run.variant} ({how}): {run.cell(compare.GENERATED_TOKENS_LABEL)} generated "
                f"tokens/s; a request ({tokens} new tokens) calls aten::cat "
                f"{as_printed(operator_calls(run, 'aten::cat'), '.1f')} times")
    return (f"{run.variant} ({how}): {run.cell(compare.GENERATED_TOKENS_LABEL)} generated "
            f"tokens/s, {run.cell('launches/step')} launches/step for {tokens} tokens, "
            f"GPU utilization {run.cell('GPU utilization %')} %")


def headline_tokenizer_bound(run: Run) -> str:
    region = (run.result.get("host_regions") or {}).get("tokenize")
    speed = f"{run.cell('requests/s')} requests/s"
    if region is None:  # operators open through most of it: the analyzer reports no region
        return (f"{run.variant}: {speed}; tokenize runs beside the model's operators (no host "
                f"region to the analyzer)")
    idle = ("" if region["gpu_idle_pct"] is None
            else f", GPU idle {as_printed(region['gpu_idle_pct'], '.1f')} % in it")
    return (f"{run.variant}: {speed}; tokenize holds the host "
            f"{as_printed(region['pct'], '.1f')} % of the steps "
            f"({as_printed(region['ms_per_step'], '.2f')} ms/step) outside any operator{idle}")


def headline_memory_leak(run: Run) -> str:
    memory = run.result["memory"]
    ends = memory["allocated_mb_at_step_end"]
    return (f"{run.variant}: allocated at step ends {ends[0]:,.1f} -> {ends[-1]:,.1f} MB, "
            f"{run.cell('memory growth MB/step')} MB/step (R^2 "
            f"{as_printed(memory['growth_fit_r2'], '.2f')})")


# How each variant of recompiles passes the depth to the compiled forward: the pair's one change.
DEPTH_PASSED_AS = {"bad": "depth: a Python int", "fixed": "depth: a mask tensor"}


def headline_recompiles(run: Run) -> str:
    """Samples/s as compare prints it; regions, graph breaks and the eager time inside regions
    as the analyzer's "compiled" line prints them (it prints no eager time where there is none)."""
    found = run.result["compiled"] or {}
    eager = found.get("eager_in_regions_ms_per_step") if found.get("eager_operators") else None
    return (f"{run.variant} ({DEPTH_PASSED_AS[run.variant]}): {run.cell('samples/s')} "
            f"samples/s; {as_printed(found.get('regions_per_step'), '.1f')} compiled "
            f"regions/step, graph breaks {as_printed(found.get('graph_breaks_per_step'), '.1f')}"
            f"/step, " + ("nothing eager in them" if eager is None
                          else f"eager inside them {as_printed(eager, '.2f')} ms/step"))


def workers_words(count: int | None) -> str:
    """A DataLoader's worker processes in words: "no workers", "1 worker", "4 workers"."""
    return "no workers" if count == 0 else f"{count} worker{'' if count == 1 else 's'}"


def headline_ladder(run: Run) -> str:
    """A rung: its batch and DataLoader workers; samples/s as compare prints it and, below rung
    0, its gain over rung 0 in the waterfall's words (ladder.ratio_words of its vs_first: rung 0
    is the top panel); the DataLoader's share of the steps as compare prints it (its "DataLoader
    %", on a GPU too). Each rung's verdicts are the waterfall's to say: a title of about 120
    characters is what fits across the panel."""
    gain = ("" if run.first is None else ", vs rung 0: " + ladder.ratio_words(
        run.summary["samples_per_s"] / run.first.summary["samples_per_s"]))
    return (f"{run.variant} (batch {run.summary['batch_size']}, "
            f"{workers_words(run.config.get('num_workers'))}): {run.cell('samples/s')} "
            f"samples/s{gain}; DataLoader {run.cell('DataLoader %')} % of the steps")


def headline_memory_ladder(run: Run) -> str:
    """A rung of the memory ladder: its batch (in micro-batches where it accumulates) and its
    weights' dtype; its peak memory and samples/s as compare's memory table prints them (the
    summary's, as ladder.format_memory_table formats them). Whether it fits the budget is
    fits.png's to say: the budget is held against the process's resident memory on a CPU, which
    the memory panel does not draw."""
    summary = run.summary
    batch = ladder.batch_words(summary["batch_size"],
                               run.config.get("accumulation_micro_batches", 1))
    return (f"{run.variant} ({batch}, {run.config.get('dtype', 'float32')} weights): "
            f"{ladder.peak_memory_words(summary.get('peak_memory_mb'))}, "
            f"{summary['samples_per_s']:,.1f} samples/s")


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
             "memory_leak": headline_memory_leak,
             "recompiles": headline_recompiles,
             "ladder": headline_ladder,
             "memory_ladder": headline_memory_ladder,
             "ddp_no_sync": headline_ddp_no_sync}


def profiled_vs_timed(run: Run) -> float | None:
    """The profiled steps' p50 ÷ the timed steps' p50 (summary.json, as compare reads it)."""
    return recorded.profiler_overhead_ratio(run.summary)


def timing_note(run: Run) -> str:
    """Where the steps drawn (profiled) took more than PROFILED_VS_TIMED_MAX times the timed
    step p50, or less than its inverse: a line that says so, with compare's numbers; else "".
    Not why: the profiler's cost per operator on a host-bound run, steps of varying length on
    another (padding_waste/fixed's buckets)."""
    ratio = profiled_vs_timed(run)
    if ratio is None or 1 / PROFILED_VS_TIMED_MAX <= ratio <= PROFILED_VS_TIMED_MAX:
        return ""
    return (f"the profiled steps drawn took {run.cell('profiled/timed step')}x the timed step "
            f"p50 of {run.cell('step p50 ms')} ms")


def device_line(summary: dict) -> str:
    """Which machine ran the pair, from its summary: the GPU's name, or "CPU run" and the CPU's."""
    torch_version = summary.get("torch_version")
    if summary.get("device") == "cpu":
        demo = summary.get("demo")
        note = CPU_LESSON_NOTES.get(demo, CPU_LESSON_NOTE if demo in CPU_LESSON_DEMOS else
                                    CPU_RUN_NOTE)
        return f"CPU run, {summary.get('device_name')}, torch {torch_version} ({note})"
    return f"{summary.get('device_name')}, torch {torch_version}"


# --- The data a figure draws. ------------------------------------------------------------------

class FigureError(ValueError):
    """A reference folder or demo that cannot be drawn; the message says which and why."""


@dataclass
class Panel:
    """One variant's part of the figure, in ms since its anchor."""
    variant: str
    headline: str
    note: str  # the profiled-vs-timed line under the headline ("" where they agree)
    run: Run
    origin_us: float  # the anchor, in the trace's µs
    end_ms: float  # the end of the variant's profiled steps (the later of host and GPU)
    step_edges_ms: np.ndarray  # step boundaries: the host's with zoom.until HOST, else the GPU's
    rows: dict[str, np.ndarray]  # row key -> busy share of each column (0..1), top row first
    gpu_busy_pct: float  # kernels' share of the window's part before end_ms (not drawn)
    sync_gaps_ms: Spans  # GPU idle gaps starting in that part that a host sync returns in
    syncs_ms: Spans = field(default_factory=Spans.empty)  # the host syncs in that part
    # The GPU row's part that is kernels with no launch call in the trace (launched before the
    # recording), per column (empty: no GPU row); and where the trace's first kernel is one of
    # them, its start (ms): before it the GPU ran work the trace does not hold (None: no such).
    earlier_kernels: np.ndarray = field(default_factory=lambda: np.empty(0))
    unrecorded_until_ms: float | None = None

    @property
    def sync_gaps(self) -> int:
        return self.sync_gaps_ms.size
    memory_ms: np.ndarray = field(default_factory=lambda: np.empty(0))
    memory_mb: np.ndarray = field(default_factory=lambda: np.empty(0))
    # The compiled regions ending in the window, in the frame rows: (row key, end in ms, "F/C").
    region_ids: list[tuple[str, float, str]] = field(default_factory=list)

    @property
    def title(self) -> str:
        return self.headline + (f"\n{self.note}" if self.note else "")


@dataclass
class FigureData:
    demo: str
    zoom: Zoom
    reference: Path  # the folder the runs came from (traces/reference/<machine>)
    device: str  # device_line of the runs
    window_ms: tuple[float, float]
    edges_ms: np.ndarray  # COLUMNS + 1 column edges across the window
    panels: dict[str, Panel]  # by place: bad's (on top), fixed's

    @property
    def title(self) -> str:
        top, below = (panel.variant for panel in self.panels.values())
        return "\n".join([f"{self.demo}: {top} above {below}, {self.zoom.what}", self.device,
                          *textwrap.wrap(self.zoom.note, NOTE_WIDTH)])


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


def named_operators(columns, prefix: str) -> np.ndarray:
    """Which of the trace's operators (cpu_ops) have a name that starts with `prefix`."""
    return names_where(columns.cpu_op_names, lambda name: name.startswith(prefix))


def compiled_regions(columns) -> list[dict]:
    """Every compiled region in the trace as common/compiled.py reads it (read_regions: frame,
    compile id, start, end, and its own eager operators): the same definition the analyzer sums
    over the recorded steps, here over the whole trace (the figure clips to its window)."""
    region, covers, _, _ = compiled.region_flags(columns)
    return compiled.read_regions(columns, region, covers, trace_steps.op_threads(columns))


def region_label(region: dict) -> str:
    """"F/C", or "?" where a release before torch 2.5 names neither."""
    return "?" if region["frame"] is None else f"{region['frame']}/{region['compile_id']}"


def eager_in_regions(columns) -> Spans:
    """The operators common/compiled.py counts as eager inside compiled regions (compiled_metrics
    sums them; the figure draws each)."""
    ops = columns.cpu_ops
    keep = np.array(sorted({i for r in compiled_regions(columns) for i in r["eager"]}), np.int64)
    return Spans(ops.start[keep], ops.end[keep])


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
    if key == OPERATORS_ROW:  # operators, not the regions an older trace writes as operators
        keep = ~columns.cpu_op_is_region if columns.cpu_op_is_region.size else slice(None)
        return Spans(columns.cpu_ops.start[keep], columns.cpu_ops.end[keep])
    if key.startswith(OPERATOR_ROW_PREFIX):
        keep = named_operators(columns, key.removeprefix(OPERATOR_ROW_PREFIX))
        return Spans(columns.cpu_ops.start[keep], columns.cpu_ops.end[keep])
    if key.startswith(FRAME_ROW_PREFIX):
        mine = [r for r in compiled_regions(columns)
                if region_label(r).split("/")[0] == key.removeprefix(FRAME_ROW_PREFIX)]
        return Spans(np.array([r["start"] for r in mine]), np.array([r["end"] for r in mine]))
    if key == GRAPH_CALL_ROW:
        keep = names_where(columns.cpu_op_names,
                           lambda name: name.startswith(compiled.GRAPH_CALL_PREFIXES))
        return Spans(columns.cpu_ops.start[keep], columns.cpu_ops.end[keep])
    if key == EAGER_IN_REGIONS_ROW:
        return eager_in_regions(columns)
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


def host_syncs_of(analysis: analyze.Analysis) -> Spans:
    """The host syncs, sorted by start (µs): the analyzer's own list (syncs.host_syncs)."""
    columns = analysis.columns
    host = trace_steps.host_steps(columns)
    found = syncs.host_syncs(columns, host, trace_steps.runtime_step_index(columns, host))
    order = np.argsort(found.start, kind="stable")
    return Spans(np.asarray(found.start)[order], np.asarray(found.end)[order])


def sync_gaps(analysis: analyze.Analysis, low_us: float, high_us: float) -> Spans:
    """The GPU idle gaps (between the merged kernels, copies and memsets, as the analyzer's idle
    causes take them) that start in [low_us, high_us) and that a host sync returns in: the GPU
    drained its queue for the host and waited for its next launch (idle cause host_sync)."""
    columns = analysis.columns
    busy = intervals.merge(intervals.concat(columns.kernels, columns.memcpy, columns.memset))
    if not busy.size:
        return Spans.empty()
    gap = syncs.gap_of(np.sort(host_syncs_of(analysis).end), busy)
    # Gap k runs from busy interval k-1's end to busy interval k's start; gap 0 opens the trace
    # and the one after the last interval closes it: neither lies between GPU work.
    synced = np.unique(gap[(gap > 0) & (gap < busy.size)])
    start, end = busy.end[synced - 1], busy.start[synced]
    inside = (start >= low_us) & (start < high_us)
    return Spans(start[inside], end[inside])


def to_ms(spans: Spans, origin_us: float) -> Spans:
    return Spans(*((side - origin_us) / trace_steps.US_PER_MS for side in (spans.start, spans.end)))


def panel_of(demo: str, zoom: Zoom, run: Run, edges_ms: np.ndarray) -> Panel:
    analysis = run.analysis
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
    has_gpu = bool(analysis.result["gpu"])
    gaps = sync_gaps(analysis, low_us, high_us) if has_gpu else Spans.empty()
    waits = host_syncs_of(analysis) if has_gpu else Spans.empty()
    in_window = (waits.end > low_us) & (waits.start < high_us)
    steps = analysis.steps  # as the GPU ran them (extended steps)
    if zoom.until == HOST and analysis.columns.steps.size:
        steps = analysis.columns.steps  # ProfilerStep#N on the host
    step_edges_ms = (np.r_[steps.start, steps.end[-1:]] - origin) / trace_steps.US_PER_MS
    memory_ms = ((analysis.memory_ts - origin) / trace_steps.US_PER_MS if zoom.memory
                 else np.empty(0))
    earlier, unrecorded_until_ms = np.empty(0), None
    kernels = analysis.columns.kernels
    if GPU_ROW in rows and kernels.size:
        launched = trace_steps.launching_call(analysis.columns,
                                              analysis.columns.kernel_correlation) >= 0
        earlier = report.busy_share(Spans(kernels.start[~launched], kernels.end[~launched]),
                                    edges_us)
        if earlier.sum() < EARLIER_KERNELS_SHOWN_MIN:  # too little to see: not drawn, not named
            earlier = np.zeros_like(earlier)
        first = int(np.argmin(kernels.start))
        if not launched[first]:
            unrecorded_until_ms = (kernels.start[first] - origin) / trace_steps.US_PER_MS
    region_ids = []
    if any(key.startswith(FRAME_ROW_PREFIX) for key in rows):
        for region in compiled_regions(analysis.columns):
            text = region_label(region)
            key, end = FRAME_ROW_PREFIX + text.split("/")[0], (
                region["end"] - origin) / trace_steps.US_PER_MS
            if key in rows and edges_ms[0] < end <= edges_ms[-1]:
                region_ids.append((key, float(end), text))
    return Panel(variant=run.variant, headline=HEADLINES[demo](run), note=timing_note(run),
                 run=run, origin_us=origin, end_ms=end_ms,
                 step_edges_ms=step_edges_ms,
                 rows=rows, gpu_busy_pct=100.0 * busy / covered if covered > 0 else 0.0,
                 sync_gaps_ms=to_ms(gaps, origin),
                 syncs_ms=to_ms(Spans(waits.start[in_window], waits.end[in_window]), origin),
                 earlier_kernels=earlier, unrecorded_until_ms=unrecorded_until_ms,
                 memory_ms=memory_ms,
                 memory_mb=analysis.memory_mb if zoom.memory else np.empty(0),
                 region_ids=region_ids)


def runs_drawn(demo: str, reference: Path) -> dict[str, str]:
    """The run folders under reference/demo that the figure draws, by the place each takes
    (VARIANTS: bad's on top, fixed's below): a pair's own bad and fixed; a ladder's (a speed or a
    memory ladder's) first rung and its last, every fix applied (as common/ladder.py finds them,
    rungs with a run's summary: a memory ladder's rung that ran out of memory at a GPU's cap has
    none, nor a trace to draw; {} where it holds under two rungs)."""
    if demo not in LADDERS + MEMORY_LADDERS:
        return {variant: variant for variant in VARIANTS}
    rungs = [path.name for _, _, path in ladder.rung_folders(Path(reference) / demo)]
    return dict(zip(VARIANTS, (rungs[0], rungs[-1]))) if len(rungs) >= 2 else {}


def in_reference(demo: str, reference: Path) -> bool:
    """Both runs the figure draws are in `reference`. A memory ladder's picture is rung 0's memory
    against the last rung's: where rung 0 ran out of memory at a GPU's cap (a record, no trace)
    the reference cannot draw it, and the next one that ran rung 0 does (its chart of which rungs
    fit comes from the first reference that has the ladder at all: fits_reference_of)."""
    folders = runs_drawn(demo, reference)
    if demo in MEMORY_LADDERS and folders:
        first = ladder.rung_folders(Path(reference) / demo, ladder.MEMORY_RECORDS)[0][2]
        if first.name != folders["bad"]:
            return False
    return bool(folders) and all((reference / demo / folder / trace.SUMMARY_FILE).is_file()
                                 for folder in folders.values())


def fits_reference_of(demo: str, references: tuple[Path, ...] = DEFAULT_REFERENCES
                      ) -> Path | None:
    """The first of `references` that holds demo's memory ladder (two rungs or more, run or out
    of memory): its chart of which rungs fit the budget, a GPU's first, whose cap enforces it."""
    return next((folder for folder in references if ladder.is_memory_ladder(Path(folder) / demo)),
                None)


def reference_of(demo: str, references: tuple[Path, ...] = DEFAULT_REFERENCES) -> Path | None:
    """The first of `references` that holds both of demo's runs; None where none does."""
    return next((folder for folder in references if in_reference(demo, folder)), None)


def zoom_of(demo: str, summaries: dict[str, dict]) -> Zoom:
    """The pair's zoom: its CPU zoom where its runs are CPU runs, else its GPU one."""
    if all(summary.get("device") == "cpu" for summary in summaries.values()):
        if demo not in CPU_ZOOMS:
            raise FigureError(f"{demo}: a CPU run, and no CPU picture is defined for it (its "
                              f"picture comes from a GPU run)")
        return CPU_ZOOMS[demo]
    return ZOOMS[demo]


def read_runs(demo: str, reference: Path) -> dict[str, Run]:
    """Both variants' summaries and analyses, and compare's table of them, as Runs, by place
    (runs_drawn)."""
    folders = runs_drawn(demo, reference)
    if not folders:
        raise FigureError(f"{Path(reference) / demo}: not a ladder (two rung runs or more, "
                          f"rung<K>_<fix>/ each with a {trace.SUMMARY_FILE})")
    runs = {}
    for variant, folder in folders.items():
        run_dir = Path(reference) / demo / folder
        if not (run_dir / trace.SUMMARY_FILE).is_file():
            raise FigureError(f"{run_dir}: no {trace.SUMMARY_FILE} (not a reference run)")
        summary = json.loads((run_dir / trace.SUMMARY_FILE).read_text())
        try:  # the trace its summary names (rank 0's, where the folder holds one per rank)
            runs[variant] = compare.analyze_run(run_dir, summary)
        except compare.CompareError as error:
            raise FigureError(f"{run_dir}: {error}") from None
    # Compare's table, as it prints it: the cells the headlines quote.
    table = compare.table_rows({"variants": VARIANTS, **runs})
    drawn = {}
    for index, variant in enumerate(VARIANTS):
        drawn[variant] = Run(variant=folders[variant], summary=runs[variant]["summary"],
                             result=runs[variant]["analysis"], analysis=runs[variant]["detail"],
                             cells={row[0]: row[1 + index] for row in table},
                             first=drawn.get(VARIANTS[0]))
    return drawn


def figure_data(demo: str, reference: Path | None = None) -> FigureData:
    """What the demo's figure draws: its window and, per variant, each row's busy share per
    column, the GPU's busy share and the sync gaps in the window, and the memory curve. From
    `reference`, or the first of DEFAULT_REFERENCES that has the pair."""
    if demo not in ZOOMS:
        raise FigureError(f"unknown demo {demo!r}; choose from: {', '.join(DEMOS)}")
    folder = Path(reference) if reference is not None else reference_of(demo)
    if folder is None:
        raise FigureError(f"{demo}: no run of it under "
                          f"{' or '.join(str(f) for f in DEFAULT_REFERENCES)}")
    runs = read_runs(demo, folder)
    zoom = zoom_of(demo, {v: run.summary for v, run in runs.items()})
    if zoom.width_ms is None:
        window = (0.0, step_end_ms(runs[zoom.of].analysis, zoom))
    else:
        window = (zoom.start_ms, zoom.start_ms + zoom.width_ms)
    edges_ms = np.linspace(*window, COLUMNS + 1)
    panels = {v: panel_of(demo, zoom, runs[v], edges_ms) for v in VARIANTS}
    return FigureData(demo=demo, zoom=zoom, reference=folder,
                      device=device_line(runs["bad"].summary), window_ms=window,
                      edges_ms=edges_ms, panels=panels)


# --- Drawing. ------------------------------------------------------------------------------------

def row_color(key: str) -> str:
    if key in ROW_COLORS:
        return ROW_COLORS[key]
    if key.startswith(FRAME_ROW_PREFIX):
        frame = key.removeprefix(FRAME_ROW_PREFIX)
        return FRAME_COLORS[int(frame) % len(FRAME_COLORS) if frame.isdigit() else 0]
    if key.startswith(REGION_ROW_PREFIX):
        return report.HOST_REGION_COLORS[0]
    if key.startswith(OPERATOR_ROW_PREFIX):
        return NAMED_OPERATOR_COLOR
    return GPU_COLOR


def row_label(zoom: Zoom, key: str) -> str:
    if key.startswith(FRAME_ROW_PREFIX) and key not in dict(zoom.labels):
        return f"compiled regions,\nframe {key.removeprefix(FRAME_ROW_PREFIX)}"
    return dict(zoom.labels).get(key) or ROW_LABELS.get(
        key, key.removeprefix(REGION_ROW_PREFIX).removeprefix(OPERATOR_ROW_PREFIX))


def point_at_waits(ax, data: FigureData, panel: Panel, keys: list[str]) -> None:
    """Words and an arrow at the first host wait and at the first GPU gap after a wait that lie
    inside the window: what the two rows' slivers are, named where they are."""
    low, high = data.window_ms
    width = high - low
    text_style = dict(fontsize=8, va="center", ha="left",
                      bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="#9e9e9e", lw=0.6),
                      arrowprops=dict(arrowstyle="->", color="#424242", lw=0.8))
    waits = panel.syncs_ms
    inside = np.flatnonzero((waits.start >= low) & (waits.end <= high))
    if inside.size:
        y = keys.index(SYNC_ROW)
        end = float(waits.end[inside[0]])
        ax.annotate("the host waits for the GPU", xy=(end, y), xytext=(end + 0.06 * width, y),
                    **text_style)
    gaps = panel.sync_gaps_ms
    inside = np.flatnonzero((gaps.start >= low) & (gaps.end <= high))
    if inside.size:
        y = keys.index(GPU_ROW)
        end = float(gaps.end[inside[0]])
        ax.annotate("then the GPU idles, until the host launches again", xy=(end, y - 0.2),
                    xytext=(end + 0.3 * width, y - 0.55), **text_style)


def draw_panel(ax, data: FigureData, panel: Panel) -> None:
    low, high = data.window_ms
    keys = list(panel.rows)
    for y, key in enumerate(keys):
        share = panel.rows[key]
        # Rows grow up from their baseline (y + 0.4: the y axis runs top down).
        ax.fill_between(data.edges_ms, y + 0.4, y + 0.4 - ROW_FILL * np.r_[share, share[-1]],
                        step="post", lw=0, color=row_color(key))
        if key == GPU_ROW and panel.earlier_kernels.any():  # over it, the earlier steps' part
            earlier = panel.earlier_kernels
            ax.fill_between(data.edges_ms, y + 0.4,
                            y + 0.4 - ROW_FILL * np.r_[earlier, earlier[-1]], step="post",
                            lw=0, color=EARLIER_KERNEL_COLOR)
    if GPU_ROW in keys and panel.unrecorded_until_ms is not None and \
            panel.unrecorded_until_ms > low + 0.02 * (high - low):
        y, until = keys.index(GPU_ROW), min(panel.unrecorded_until_ms, high)
        ax.fill_between([low, until], y + 0.4, y - 0.4, color=BEYOND_COLOR, lw=0, zorder=0)
        ax.text((low + until) / 2, y, "not in the trace", ha="center", va="center",
                fontsize=7, color="#757575")
    if GPU_ROW in keys and SYNC_ROW in keys:  # the gaps the syncs leave on the GPU, shaded
        y = keys.index(GPU_ROW)
        for start, end in zip(panel.sync_gaps_ms.start, panel.sync_gaps_ms.end):
            ax.fill_between([start, end], y + 0.4, y - 0.4, color=SYNC_GAP_COLOR, lw=0,
                            zorder=0)
        if data.zoom.point_at_waits:
            point_at_waits(ax, data, panel, keys)
    for key, end, text in panel.region_ids:  # each region's frame/compile id, after its end
        ax.text(end + REGION_ID_PAD * (high - low), keys.index(key), text, ha="left",
                va="center", fontsize=REGION_ID_FONT_PT, color=row_color(key))
    for edge in panel.step_edges_ms[(panel.step_edges_ms >= low) & (panel.step_edges_ms <= high)]:
        ax.axvline(edge, color="#616161", lw=0.8, ls="--", zorder=0)  # behind the rows
    if panel.end_ms < high:  # past the profiled steps: nothing recorded, not an idle GPU
        ax.axvspan(max(panel.end_ms, low), high, color=BEYOND_COLOR, zorder=0, lw=0)
    if high - max(panel.end_ms, low) > BEYOND_TEXT_MIN * (high - low):  # room for the words
        ax.text((max(panel.end_ms, low) + high) / 2, (len(keys) - 1) / 2,
                f"{panel.variant}'s profiled steps end here", ha="center", va="center",
                fontsize=8, color="#757575")
    labels = [row_label(data.zoom, key) for key in keys]
    if GPU_ROW in keys and panel.earlier_kernels.any():
        labels[keys.index(GPU_ROW)] += "\n(pale: launched\nbefore the recording)"
    ax.set_yticks(range(len(keys)), labels, fontsize=8)
    ax.set_ylim(len(keys) - 0.4, -0.6)  # first row on top
    ax.set_xlim(low, high)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(headline_lines(panel.headline), fontsize=9, loc="left",
                 pad=16 if panel.note else 6)
    if panel.note:  # under the headline, in grey: a qualification, not a second headline
        ax.text(0, 1.02, panel.note, transform=ax.transAxes, fontsize=8, color=NOTE_COLOR,
                ha="left", va="bottom")


def draw_memory(ax, data: FigureData) -> None:
    low, high = data.window_ms
    for place, panel in data.panels.items():
        if not panel.memory_mb.size:
            continue
        # The curve's value at `low`: the last event before it, then every event in the window.
        first = max(int(np.searchsorted(panel.memory_ms, low, side="right")) - 1, 0)
        last = int(np.searchsorted(panel.memory_ms, high, side="right"))
        ms, mb = panel.memory_ms[first:last], panel.memory_mb[first:last]
        ax.step(np.r_[max(ms[0], low), ms[1:], min(high, panel.end_ms)], np.r_[mb, mb[-1]],
                where="post", lw=1.2, color=report.VARIANT_COLORS[place],
                label=f"{panel.variant}: peak "
                      f"{as_printed(panel.run.result['peak_memory_mb'], '.0f')} MB")
    ax.set_xlim(low, high)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("allocated MB", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, loc="upper right")
    on_gpu = any(panel.run.result["gpu"] for panel in data.panels.values())
    ax.set_title(f"{'GPU' if on_gpu else 'CPU'} memory allocated (the trace's [memory] "
                 f"events, timed when the host asks)",
                 fontsize=9, loc="left")


def axis_label(data: FigureData) -> str:
    since = ("its first profiled step began on the GPU" if data.zoom.anchor == GPU
             else "its first profiled step began")
    has_gpu = any(panel.run.result["gpu"] for panel in data.panels.values())
    lines = ("the host's step boundaries" if data.zoom.until == HOST or not has_gpu
             else "step boundaries as the GPU ran them")
    return (f"ms since each variant's {since.removeprefix('its ')}, the same scale for both; "
            f"dashed: {lines}\n"
            f"a row's height: the share of each column of the window (about a pixel wide) it "
            f"is busy")


def headline_lines(headline: str) -> str:
    """A panel's headline in lines of at most HEADLINE_WIDTH characters, broken after its "; "
    clauses where it can; a clause longer than a line is broken at its spaces."""
    clauses = headline.split("; ")
    lines, line = [], ""
    for k, clause in enumerate(clauses):
        piece = clause + (";" if k < len(clauses) - 1 else "")
        joined = f"{line} {piece}" if line else piece
        if line and len(joined) > HEADLINE_WIDTH:
            lines.append(line)
            joined = piece
        line = joined
    lines.append(line)
    return "\n".join(textwrap.fill(line, HEADLINE_WIDTH) for line in lines)


def figure(data: FigureData):
    heights = [PANEL_EXTRA_IN + ROW_HEIGHT_IN * max(len(p.rows), 1)
               + TITLE_LINE_IN * headline_lines(p.headline).count("\n")
               + (TITLE_LINE_IN if p.note else 0.0) for p in data.panels.values()]
    if data.zoom.memory:
        heights.append(MEMORY_PANEL_IN)
    title_lines = data.title.count("\n") + 1
    fig, axes = plt.subplots(len(heights), 1, sharex=True, squeeze=False,
                             figsize=(FIGURE_WIDTH_IN,
                                      sum(heights) + 0.4 + TITLE_LINE_IN * title_lines),
                             gridspec_kw={"height_ratios": heights})
    for ax, panel in zip(axes[:, 0], data.panels.values()):
        draw_panel(ax, data, panel)
    if data.zoom.memory:
        draw_memory(axes[-1, 0], data)
    axes[-1, 0].set_xlabel(axis_label(data), fontsize=8)
    fig.suptitle(data.title, fontsize=10)
    return fig


def write_figure(demo: str, reference: Path | None = None,
                 out_root: Path = DEFAULT_OUT_ROOT) -> Path:
    """Draw demo's figure from its reference run into out_root/<demo>/trace.png; return it."""
    data = figure_data(demo, reference)
    return report.save(figure(data), Path(out_root) / demo / FIGURE_NAME, dpi=FIGURE_DPI,
                       metadata=PNG_METADATA)


def write_waterfall(demo: str, reference: Path, out_root: Path = DEFAULT_OUT_ROOT) -> Path:
    """Draw a ladder's waterfall from its rungs' runs under reference/demo into
    out_root/<demo>/waterfall.png (report.waterfall_figure: the chart the report draws); return
    it."""
    folder = Path(reference) / demo
    rows = ladder.ladder_rows(folder)
    if len(rows) < 2:
        raise FigureError(f"{folder}: not a ladder (two rung runs or more, rung<K>_<fix>/ each "
                          f"with a {trace.SUMMARY_FILE})")
    first = json.loads((folder / rows[0]["rung"] / trace.SUMMARY_FILE).read_text())
    title = (f"{demo}: samples/s at each rung, each rung one fix after the one before\n"
             f"{device_line(first)}")
    return report.save(report.waterfall_figure(rows, title), Path(out_root) / demo / WATERFALL_NAME,
                       dpi=FIGURE_DPI, metadata=PNG_METADATA)


def fits_figure(demo: str, reference: Path):
    """A memory ladder's chart from its rungs under reference/demo (ladder.memory_rows, the
    rows compare's memory table prints; report.memory_ladder_figure, the chart the report
    draws), the device line under its title."""
    folder = Path(reference) / demo
    rows = ladder.memory_rows(folder)
    if len(rows) < 2:
        raise FigureError(f"{folder}: not a memory ladder (two rungs or more, rung<K>_<fix>/ "
                          f"each with a {trace.SUMMARY_FILE} or a {trace.OUT_OF_MEMORY_FILE})")
    first = ladder.rung_record(folder / rows[0]["rung"])[0]
    title = (f"{demo}: the peak held against the memory budget at each rung, each rung one fix "
             f"after the one before\n{device_line(first)}")
    return report.memory_ladder_figure(rows, title)


def write_fits(demo: str, reference: Path, out_root: Path = DEFAULT_OUT_ROOT) -> Path:
    """Draw a memory ladder's chart (fits_figure) into out_root/<demo>/fits.png; return it."""
    return report.save(fits_figure(demo, reference), Path(out_root) / demo / FITS_NAME,
                       dpi=FIGURE_DPI, metadata=PNG_METADATA)


def main(argv: list[str] | None = None) -> int:
    parser = trace.OneLineArgumentParser(  # a bad flag, folder or demo: one line, exit code 2
        prog="walkthrough_figures.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit code 2: an unknown demo, or a reference folder without the pair's runs "
               "(with no DEMO given, a pair no folder has is skipped, with a line).")
    parser.add_argument("demos", nargs="*", metavar="DEMO",
                        help=f"demos to draw (default: all {len(DEMOS)})")
    parser.add_argument("--reference", type=Path, default=None, metavar="FOLDER",
                        help="a reference run: FOLDER/<demo>/{bad,fixed} (a ladder: "
                             "FOLDER/<demo>/rung<K>_<fix>) (default: "
                             "traces/reference/h100, else traces/reference/cpu for a pair the "
                             "H100 run lacks)")
    parser.add_argument("--out-root", type=Path, default=DEFAULT_OUT_ROOT, metavar="DIR",
                        help="write DIR/<demo>/trace.png (default: demos)")
    flags = parser.parse_args(argv)
    unknown = [demo for demo in flags.demos if demo not in ZOOMS]
    if unknown:
        parser.error(f"unknown demo {unknown[0]!r}; choose from: {', '.join(DEMOS)}")
    if flags.reference is not None and not flags.reference.is_dir():
        parser.error(f"{flags.reference}: no such directory")
    references = (flags.reference,) if flags.reference is not None else DEFAULT_REFERENCES
    try:
        for demo in flags.demos or DEMOS:
            folder = reference_of(demo, references)
            if folder is None and not flags.demos:
                print(f"skipped {demo}: no run of it under "
                      f"{' or '.join(str(f) for f in references)} (its picture waits for a "
                      f"reference run that has it)")
                continue
            written = [write_figure(demo, folder or references[0], flags.out_root)]
            if demo in LADDERS:  # its waterfall too, from the same runs
                written.append(write_waterfall(demo, folder or references[0], flags.out_root))
            sources = [folder] * len(written)
            if demo in MEMORY_LADDERS:  # which rungs fit its budget: a GPU's run first
                fits_from = fits_reference_of(demo, references) or references[0]
                written.append(write_fits(demo, fits_from, flags.out_root))
                sources.append(fits_from)
            for out, source in zip(written, sources):
                print(f"wrote {out} from {source} ({out.stat().st_size // 1024} KB)")
    except FigureError as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
