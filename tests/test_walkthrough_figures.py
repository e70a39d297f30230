"""scripts/walkthrough_figures.py: the picture at the top of every walkthrough, drawn from the
committed reference runs (the H100's, else the CPU runs of the pairs it lacks). Every number in a
panel's title is checked against what the analyzer prints for the run (its human output, or its
JSON where the human output has no such line) or the summary as compare prints it, and no other
number may appear; the profiled-vs-timed line is checked to appear exactly where the two differ
by more than 1.2x; what each figure draws is checked against what its walkthrough says the
picture shows; the committed demos/*/trace.png and the READMEs' links to them are checked to be
there. The ladder's picture is its first rung above its last; its waterfall chart is checked to
draw ladder.ladder_rows' numbers and words. The memory ladder's picture is its first rung above
its last too, with memory allocated under them; its chart of which rungs fit is checked to draw
ladder.memory_rows' peaks."""
from __future__ import annotations

import gzip
import json
import re
import struct
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgba

from common import analyze, ladder, report
from tests.conftest import ROOT, load_script

SCRIPT = ROOT / "scripts" / "walkthrough_figures.py"
REFERENCE = ROOT / "traces" / "reference" / "h100"
CPU_REFERENCE = ROOT / "traces" / "reference" / "cpu"
CPU_PAIRS = ()  # pictures from CPU runs of pairs that need a GPU: none left
# Pictures from CPU runs of pairs whose lesson shows on a CPU too (not yet run on a GPU): none
# left, the ladder's is drawn from its H100 run.
CPU_LESSON_PAIRS = ()
# Drawn from a CPU run beside a GPU's, which has no trace of rung 0 (it stopped at the cap).
CPU_MEMORY_PAIRS = ("memory_ladder",)
# Pairs with no picture: fragmentation's lesson is memory reserved beside memory allocated, and
# the figure's memory panel draws allocated only.
NO_PICTURE_YET = {"fragmentation"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_PNG_BYTES = 120 * 1024  # the brief's cap: every walkthrough's figure stays small in the repository
README_HEAD_LINES = 15  # the picture comes right after the title and the symptom
SCRIPT_TIMEOUT_S = 120  # each run answers in seconds; this only stops a hang
PROFILED_VS_TIMED_MAX = 1.2  # the profiled steps "differ" from the timed p50 beyond this factor
# The waterfall chart draws ladder_rows' own floats: only float rounding may tell them apart.
WATERFALL_REL_TOLERANCE = 1e-9
STEP_GAP_MAX_MS = 1.0  # between one step's end and the next one's start, on the host
needs_cpu_ladder = pytest.mark.skipif(not (CPU_REFERENCE / "ladder").is_dir(),
                                      reason="no CPU run of the ladder committed")
needs_cpu_memory_ladder = pytest.mark.skipif(not (CPU_REFERENCE / "memory_ladder").is_dir(),
                                             reason="no CPU run of the memory ladder committed")


figures = load_script("walkthrough_figures")
# The pairs a reference has (the H100's, else a CPU run): a pair added since gets its picture
# with its first reference run.
DRAWN = [demo for demo in figures.DEMOS if figures.reference_of(demo) is not None]
needs_reference = pytest.mark.skipif(
    not {"item_sync", "dataloader_workers", "naive_attention"} <= set(DRAWN),
    reason=f"no reference run of item_sync, dataloader_workers and naive_attention under "
           f"{REFERENCE}")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=SCRIPT_TIMEOUT_S, env=env, check=False)


@pytest.fixture(scope="module")
def drawn():
    """What every drawn figure draws (about a second for all of them: the traces are small)."""
    return {demo: figures.figure_data(demo) for demo in DRAWN}


def png_chunk_types(data: bytes) -> list[bytes]:
    """The chunk types of a PNG, in order (each chunk: 4-byte length, 4-byte type, data, CRC)."""
    types, at = [], len(PNG_SIGNATURE)
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        types.append(data[at + 4:at + 8])
        at += 12 + length
    return types


# Chunks that carry text or a time: where a version ("Software": matplotlib's) or the moment of
# writing would get in, and make the same figure differ between machines or runs.
PNG_TEXT_CHUNKS = {b"tEXt", b"iTXt", b"zTXt", b"tIME"}


@needs_reference
def test_regenerated_figures_are_small_pngs_and_identical_bytes(tmp_path):
    """Regenerating a figure writes the same bytes: two runs of the script, each in a fresh
    interpreter started with the same, explicitly given environment (its own matplotlib config
    folder, no MPLBACKEND), so no setting of this test process or of another test can differ
    between them; only what the script itself does can. One H100 picture and one CPU picture."""
    import os
    env = {name: value for name, value in os.environ.items() if name != "MPLBACKEND"}
    env["MPLCONFIGDIR"] = str(tmp_path / "mplconfig")  # no user matplotlibrc; one font cache
    outs = [tmp_path / "first", tmp_path / "second"]
    pair = ["item_sync"] + [demo for demo in CPU_PAIRS if demo in DRAWN][:1]
    for out in outs:
        result = run("--out-root", str(out), *pair, env=env)
        assert result.returncode == 0, result.stderr
    for demo in pair:
        first, second = (out / demo / "trace.png" for out in outs)
        data = first.read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        assert 10_000 < len(data) < MAX_PNG_BYTES  # a drawing, not an empty canvas
        # No text or time chunk: the bytes hold the pixels and nothing of the matplotlib or the
        # moment that wrote them (the script drops matplotlib's default "Software" entry).
        types = png_chunk_types(data)
        assert types[0] == b"IHDR" and types[-1] == b"IEND" and b"IDAT" in types, types
        assert not PNG_TEXT_CHUNKS & set(types), types
        assert second.read_bytes() == data


# --- Every number in a title is the analyzer's, as it prints it. -------------------------------

# A number as a title writes it: digits with an optional decimal part, standing alone ("FP32",
# "rank0" and "2.11.0" are not numbers here; "1.53x" is 1.53), its thousands separated by commas
# where the analyzer prints them so (10,256.8 MB).
NUMBER = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w.]|\.\d)"
                    r"|(?<![\w.])\d+(?:\.\d+)?(?![\w.]|\.\d)|(?<![\w.])\d+(?:\.\d+)?(?=x\b)")


def numbers(text: str) -> list[str]:
    return NUMBER.findall(text)


def printed(result: dict) -> str:
    """The analyzer's human output for the run, its runs of spaces made one (its columns)."""
    return re.sub(r"[ \t]+", " ", analyze.format_human(result))


def grab(text: str, pattern: str, line: str = "") -> str:
    """The first group of `pattern` in `text` (in its line that starts with `line`, if given):
    a number as the analyzer prints it."""
    if line:
        text = next(row for row in text.splitlines() if row.startswith(line))
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in the analyzer's output: {text[:300]}"
    return found.group(1)


def aten_cat_calls_per_step(run_dir) -> str:
    """aten::cat operators per profiled step, counted in the trace's own JSON: the ones that
    start inside a ProfilerStep#N span, over the number of those spans (compare's "what changed"
    prints calls per step at one decimal)."""
    events = json.loads(gzip.decompress(next(run_dir.glob("*.pt.trace.json.gz")).read_bytes()))
    events = events["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if str(e.get("name", "")).startswith("ProfilerStep#")]
    cats = [e["ts"] for e in events if e.get("name") == "aten::cat" and e.get("cat") == "cpu_op"]
    inside = sum(any(low <= ts < high for low, high in steps) for ts in cats)
    return f"{inside / len(steps):.1f}"


def expected_numbers(demo: str, panel, run_dir) -> tuple[list[str], list[str]]:
    """(the numbers panel's title must show, as the analyzer or compare prints them; the
    numbers it may show besides: the run's configuration, from its summary)."""
    result, summary = panel.run.result, panel.run.summary
    out = printed(result)
    config = summary.get("config") or {}
    step_p50 = f"{summary['step_ms_p50']:.1f}"  # compare's "step p50 ms"
    on_gpu = bool(result["gpu"])
    if on_gpu:  # the GPU idle line's total, and the GPU line's utilization
        idle = grab(out, r"^GPU idle (\S+) % of the steps", "GPU idle")
        utilization = grab(out, r"utilization (\S+) % of the steps", "GPU ")
    if demo in CPU_PAIRS + CPU_LESSON_PAIRS and on_gpu:
        pytest.fail(f"{demo}: its picture now comes from a GPU run; list the numbers its GPU "
                    f"headline shows here, and check its zoom on the run (ZOOMS says how)")
    if demo == "dataloader_workers":
        return [idle, grab(out, r": DataLoader (\S+?),", "GPU idle")], [str(config["num_workers"])]
    if demo == "small_batch":
        return ([utilization, grab(out, r"median (\S+) us", "kernels"),
                 f"{summary['samples_per_s']:.1f}"], [str(summary["batch_size"])])
    if demo == "mixed_precision":
        return [step_p50, grab(out, r" (\S+) % of kernel time", "kernels")], []
    if demo in ("activation_checkpointing", "naive_attention"):
        return [grab(out, r"^peak memory (\S+) MB", "peak memory"), step_p50], []
    if demo == "launch_overhead":
        return [grab(out, r"^host (\S+) launches/step", "host"), step_p50, utilization], []
    if demo == "item_sync":
        return ([grab(out, r"(\S+) syncs/step", "host"), idle,
                 grab(out, r"host syncs (\S+?),", "GPU idle"),
                 grab(out, r" launches (\S+?),", "GPU idle")],
                [grab(out, r"^steps (\d+),", "steps")])
    if demo == "unfused_optimizer":  # the analyzer prints them in bad's verdict; the JSON has both
        optimizer = result["optimizer"]
        return [f"{optimizer['gpu_ms_per_step']:.1f}", f"{optimizer['cpu_ms_per_step']:.1f}",
                f"{optimizer['ops_per_step']:.0f}"], []
    if demo == "padding_waste":
        return ([f"{summary['padding_pct']:.1f}", f"{summary['tokens_per_s']:.0f}", utilization],
                [str(summary["batch_size"])])
    if demo == "ddp_no_sync":
        return ([grab(out, r"(\S+) collectives/step", "distributed"),
                 grab(out, r"(\S+) ms/step in them", "distributed"), step_p50],
                [str(result["distributed"]["rank"]), str(result["distributed"]["world_size"])])
    if demo == "host_roundtrip" and on_gpu:  # its syncs, round trips and the idle after syncs
        return ([grab(out, r"(\S+) syncs/step", "host"),
                 f"{result['gpu']['round_trips_per_step']:.1f}", idle,
                 grab(out, r"host syncs (\S+?),", "GPU idle")], [])
    if demo == "host_roundtrip":
        return ([f"{summary['samples_per_s']:.1f}", step_p50,
                 grab(out, r"cpu_exec (\S+?)(?:,|$)", "breakdown"),
                 grab(out, r"other (\S+?)(?:,|$)", "breakdown")], [])
    if demo == "llm_decode" and on_gpu:  # tokens/s; the launch calls a step, the GPU's share
        return ([f"{summary['tokens_per_s']:.0f}", grab(out, r"^host (\S+) launches/step", "host"),
                 utilization], [str(config["new_tokens"])])
    if demo == "llm_decode":
        return ([f"{summary['tokens_per_s']:.0f}", aten_cat_calls_per_step(run_dir)],
                [str(config["new_tokens"])])
    if demo == "tokenizer_bound":
        shown = [f"{summary['requests_per_s']:.2f}"]
        if "host regions tokenize" in out:  # the analyzer's region line: share and ms per step
            shown += [grab(out, r"tokenize (\S+) % of the steps", "host regions"),
                      grab(out, r"tokenize \S+ % of the steps \((\S+) ms/step", "host regions")]
            if on_gpu:  # and the GPU's idle while it runs
                shown.append(grab(out, r"tokenize \S+ % of the steps \(\S+ ms/step, GPU idle "
                                       r"(\S+) %", "host regions"))
        return shown, []
    if demo == "memory_leak":  # the analyzer's memory line: the ends, the slope, its R^2
        return ([grab(out, r"at step ends (\S+) ->", "memory "),
                 grab(out, r"-> (\S+) MB", "memory "),
                 grab(out, r"steps\), \+(\S+) MB/step", "memory "),
                 grab(out, r"\(R\^2 (\S+)\)", "memory ")], ["2"])  # the 2 of "R^2"
    if demo == "recompiles":  # compare's samples/s; the analyzer's compiled line
        shown = [f"{summary['samples_per_s']:.1f}",
                 grab(out, r"^compiled (\S+) regions/step", "compiled "),
                 grab(out, r"graph breaks (\S+)/step", "compiled ")]
        if "eager inside regions" in out:  # printed only where a region ran eager operators
            shown.append(grab(out, r"eager inside regions (\S+) ms/step", "compiled "))
        return shown, []
    if demo == "ladder":  # compare's samples/s and DataLoader %; below rung 0 the waterfall's gain
        shown = [f"{summary['samples_per_s']:.1f}",
                 grab(out, r"^DataLoader (\S+) % of the steps", "DataLoader")]
        row = next(r for r in ladder.ladder_rows(run_dir.parent) if r["rung"] == run_dir.name)
        if row["vs_first"] is not None:  # "vs rung 0: 3.05x more samples/s"
            shown.append(f"{row['vs_first']:.2f}")
        return shown, [str(summary["batch_size"]), str(config["num_workers"]),
                       "0"]  # the 0 of "rung 0", a name
    if demo == "memory_ladder":  # its rung's line in compare's memory table: peak and samples/s
        table = ladder.format_memory_table(ladder.memory_rows(run_dir.parent))
        micro_batches = config.get("accumulation_micro_batches", 1)
        return ([grab(table, r"\| peak memory (\S+) MB", f"{run_dir.name} "),
                 grab(table, r"\| (\S+) samples/s", f"{run_dir.name} ")],
                [str(summary["batch_size"])] + ([str(micro_batches)] if micro_batches > 1 else []))
    pytest.fail(f"{demo}: no expected numbers for its headline")


@pytest.mark.parametrize("demo", DRAWN)
def test_title_numbers_are_the_analyzers_as_it_prints_them(drawn, demo):
    """Each panel's headline shows the numbers its pair is about, each one as `python -m
    common.analyze` prints it (one decimal for a percentage: 93.3 % GPU idle, not "94 %") or,
    for the timed phase's, as compare prints the summary's; and no other number but the run's
    configuration (a batch size, a worker count)."""
    data = drawn[demo]
    for variant, panel in data.panels.items():
        shown = numbers(panel.headline)
        expected, config = expected_numbers(demo, panel, data.reference / demo / panel.variant)
        for number in expected:
            assert number in shown, f"{demo}/{variant}: {number} not in {panel.headline!r}"
        stray = [n for n in shown if n not in expected + config]
        assert not stray, f"{demo}/{variant}: {stray} in {panel.headline!r}"


@pytest.mark.parametrize("demo", DRAWN)
def test_profiled_vs_timed_note_exactly_where_they_differ(drawn, demo):
    """Where the profiled steps drawn took more than 1.2x the timed step p50 (or less than 1/1.2
    of it), the panel says so, with the summary's ratio and p50 as compare prints them; where
    they agree, it says nothing. dataloader_workers/bad: 1.53x."""
    for variant, panel in drawn[demo].panels.items():
        summary = panel.run.summary
        ratio = summary["profiled_step_ms_p50"] / summary["step_ms_p50"]
        differ = max(ratio, 1 / ratio) > PROFILED_VS_TIMED_MAX
        assert bool(panel.note) == differ, (demo, variant, ratio, panel.note)
        if differ:
            assert numbers(panel.note) == [f"{summary['profiler_overhead_ratio']:.2f}",
                                           f"{summary['step_ms_p50']:.1f}"], panel.note
            assert "timed step p50" in panel.note and panel.note in panel.title


@needs_reference
def test_the_brief_examples(drawn):
    """The two numbers the figures got wrong before: dataloader_workers/bad's GPU idle (93.3 %,
    the analyzer's; "94 %" was 100 - utilization rounded) and its profiled step (1.53x the timed
    p50, said in words)."""
    bad = drawn["dataloader_workers"].panels["bad"]
    assert "GPU idle 93.3 % of the steps" in bad.headline
    assert "took 1.53x the timed step p50 of 1508.7 ms" in bad.note
    assert not drawn["dataloader_workers"].panels["fixed"].note  # 1.00x: nothing to say


CPU_WORDS = {"needs": "needs a CUDA GPU; not yet run on one",
             "lesson": "its lesson shows on a CPU too; not yet run on a GPU",
             "memory": "its lesson shows on a CPU too; a GPU's rung 0 stops at the cap"}


@pytest.mark.parametrize("demo, says", [*((demo, "needs") for demo in CPU_PAIRS),
                                        *((demo, "lesson") for demo in CPU_LESSON_PAIRS),
                                        *((demo, "memory") for demo in CPU_MEMORY_PAIRS)])
def test_cpu_pictures_exist_and_say_cpu(drawn, demo, says):
    """The pairs the H100 reference lacks are drawn from their CPU runs, and say so in the
    figure's title: "CPU run", the CPU, torch, and either what the pair needs or, where its
    lesson shows on a CPU too, that no GPU has run it yet (and not that it needs one)."""
    if figures.in_reference(demo, REFERENCE):  # a pair's bad and fixed, or a ladder's rungs
        pytest.skip(f"{demo} has an H100 run now: its picture comes from it")
    data = drawn[demo]
    assert data.reference == CPU_REFERENCE
    summary = data.panels["bad"].run.summary
    assert f"CPU run, {summary['device_name']}, torch {summary['torch_version']}" in data.title
    assert CPU_WORDS[says] in data.title
    assert all(words not in data.title for key, words in CPU_WORDS.items() if key != says)
    assert (ROOT / "demos" / demo / "trace.png").is_file()


@pytest.mark.skipif(not (CPU_REFERENCE / "recompiles").is_dir(),
                    reason="no CPU run of recompiles committed")
def test_recompiles_draws_regions_recompiles_and_eager_fallback(drawn):
    """bad: frame 0's region every step; frame 1's (resumed after the .item()) only in the
    steps whose depth was compiled, under a compile id that changes from step to step; in the
    other steps the blocks run eagerly inside frame 0's region, and those steps are longer.
    fixed: one region a step, all 0/0, no frame 1 and nothing eager. The eager row is
    common/compiled.py's eager operators: over the recorded steps it sums to the analyzer's
    eager_in_regions_ms_per_step."""
    from common import intervals
    data = drawn["recompiles"]
    for variant, panel in data.panels.items():
        analysis = panel.run.analysis
        steps = analysis.columns.steps
        eager = figures.eager_in_regions(analysis.columns)
        per_step_ms = sum(intervals.union_in(eager, start, end)
                          for start, end in zip(steps.start, steps.end)) / 1000 / steps.size
        expected = panel.run.result["compiled"]["eager_in_regions_ms_per_step"]
        assert per_step_ms == pytest.approx(expected, rel=1e-9, abs=1e-12), variant
        # The window is bad's recorded steps: every one of each variant's steps in it is drawn.
        ids = [text for key, end, text in panel.region_ids]
        assert ids.count("0/0") == steps.size, (variant, ids)
    bad, fixed = data.panels["bad"], data.panels["fixed"]
    assert data.window_ms[1] == pytest.approx(bad.step_edges_ms[-1])  # all of bad's steps
    frame_1 = [text for key, end, text in bad.region_ids if key == "frame:1"]
    assert len(set(frame_1)) >= 2, frame_1  # a new compile id of frame 1: a recompile
    assert all(text.startswith("1/") for text in frame_1)
    assert not fixed.rows["frame:1"].any() and not fixed.rows["eager_in_regions"].any()
    assert {text for key, end, text in fixed.region_ids} == {"0/0"}
    # Per bad step: a frame-1 region, or eager operators inside frame 0's (the blocks), and the
    # eager steps the longer. Column edges in ms, the panel's rows per column.
    columns = data.edges_ms
    durations = {True: [], False: []}
    for start, end in zip(bad.step_edges_ms[:-1], bad.step_edges_ms[1:]):
        inside = (columns[:-1] >= start) & (columns[1:] <= end)
        has_frame_1 = bool(bad.rows["frame:1"][inside].any())
        eager_columns = (bad.rows["eager_in_regions"][inside] > 0.5).sum()
        # Compiled depth: the .item()'s few µs of eager code, under a column's half; past the
        # limit: the blocks' operators fill dozens of columns (about 1 ms of 0.06 ms columns).
        assert (eager_columns == 0) == has_frame_1, (start, eager_columns, has_frame_1)
        durations[has_frame_1].append(end - start)
    assert durations[True] and durations[False]
    assert min(durations[False]) > max(durations[True])
    labels = {key: figures.row_label(data.zoom, key) for key in bad.rows}
    assert ".item()" in labels["frame:1"] and "inside regions" in labels["eager_in_regions"]


@pytest.mark.skipif(not CPU_REFERENCE.is_dir(), reason="no CPU runs committed")
def test_cpu_pictures_draw_the_host_side_of_the_lesson(drawn):
    """llm_decode, drawn from a CPU run: bad's token runs every block's operators, aten::cat
    among them; fixed's is one compiled call (no aten::cat between). Drawn from a GPU run (the
    H100's): fixed's kernels fill more than twice the share of the window bad's do.
    tokenizer_bound: bad's tokenize region holds most of its batch with no operator (CPU) or
    kernel (GPU) running. host_roundtrip: bad's forward has stretches with nothing running (its
    Python loop; the GPU waiting on it), longer than fixed's."""
    if drawn["llm_decode"].reference == CPU_REFERENCE:
        decode = drawn["llm_decode"].panels
        assert decode["bad"].rows["op:aten::cat"].any()
        assert decode["fixed"].rows["op:Torch-Compiled Region"].any()
        assert not decode["bad"].rows["op:Torch-Compiled Region"].any()
    else:  # a GPU run: bad's kernels a comb of slivers, fixed's tokens dense blocks (graphs)
        decode = drawn["llm_decode"].panels
        busy = {variant: panel.rows[figures.GPU_ROW].mean() for variant, panel in decode.items()}
        assert busy["fixed"] > 2 * busy["bad"], busy
    tokenize = drawn["tokenizer_bound"]
    busy = tokenize.panels["bad"].rows["region:tokenize"] > 0.5
    # on a CPU no operator runs while it tokenizes; on a GPU no kernel does either
    idle_row = "operators" if tokenize.reference == CPU_REFERENCE else figures.GPU_ROW
    assert busy.mean() > 0.5 and tokenize.panels["bad"].rows[idle_row][busy].mean() < 0.05
    roundtrip = drawn["host_roundtrip"]
    # bad's forward has stretches with nothing running (its Python loop on a CPU, the GPU
    # waiting for it on a GPU), longer than fixed's
    row = "operators" if roundtrip.reference == CPU_REFERENCE else figures.GPU_ROW
    gaps = {}
    for variant, panel in roundtrip.panels.items():
        forward = panel.rows["forward"] > 0.99
        gaps[variant] = (1 - panel.rows[row][forward]).sum()  # columns with nothing running
    assert gaps["bad"] > 2 * gaps["fixed"]


@needs_cpu_ladder
def test_ladder_draws_its_first_rung_above_its_last(drawn):
    """The ladder's picture: its first rung in bad's place, its last (every fix) in fixed's, as
    common/ladder.py orders its rungs; the rows dataloader_workers has, with the GPU's. rung 0's
    step opens with its DataLoader decoding (64 % of its steps on the H100 reference) while the
    GPU idles; the last rung's waits next to nothing and keeps the GPU busy; the window is rung
    0's first step, whole. Only the last rung's headline has a gain over rung 0, in the
    waterfall's words."""
    data = drawn["ladder"]
    rungs = [path.name for _, _, path in ladder.rung_folders(data.reference / "ladder")]
    first, last = data.panels["bad"], data.panels["fixed"]
    assert (first.variant, last.variant) == (rungs[0], rungs[-1])
    assert data.title.startswith(f"ladder: {rungs[0]} above {rungs[-1]}, ")
    for panel in (first, last):
        assert list(panel.rows) == ["DataLoader", "forward", "backward", "optimizer", "gpu"]
    assert data.window_ms[0] == 0.0
    assert first.rows["DataLoader"].mean() > 0.2 and last.rows["DataLoader"].mean() < 0.01
    # the GPU's row: idle under rung 0's decoding, busy under the last rung's steps
    assert first.rows["gpu"].mean() < 0.5 * last.rows["gpu"].mean()
    rows = {row["rung"]: row for row in ladder.ladder_rows(data.reference / "ladder")}
    gain = ladder.ratio_words(rows[rungs[-1]]["vs_first"])
    assert f"vs rung 0: {gain}" in last.headline and "vs rung 0" not in first.headline
    assert gain.endswith("more samples/s")  # every fix together: faster than rung 0


@needs_cpu_memory_ladder
def test_memory_ladder_draws_its_first_rung_above_its_last_with_memory(drawn):
    """The memory ladder's picture: its first rung in bad's place, its last (every fix) in
    fixed's, with memory allocated under them. The window is rung 0's first host step (the
    longer), which holds its peak; the last rung's curve stays under a twentieth of it, and its
    first step runs a forward per micro-batch (the note's 4). Each curve's legend gives its peak
    as the analyzer prints it."""
    data = drawn["memory_ladder"]
    rungs = [path.name for _, _, path in ladder.rung_folders(data.reference / "memory_ladder")]
    first, last = data.panels["bad"], data.panels["fixed"]
    assert (first.variant, last.variant) == (rungs[0], rungs[-1])
    assert data.title.startswith(f"memory_ladder: {rungs[0]} above {rungs[-1]}, ")
    assert data.zoom.memory and "fits.png" in data.title
    for panel in (first, last):
        assert list(panel.rows) == ["forward", "backward", "optimizer"]
    assert data.window_ms[0] == 0.0
    assert 0.0 <= first.step_edges_ms[1] - data.window_ms[1] < STEP_GAP_MAX_MS
    low, high = data.window_ms
    peaks = {}
    for place, panel in data.panels.items():
        inside = (panel.memory_ms >= low) & (panel.memory_ms <= high)
        peaks[place] = panel.memory_mb[inside].max()
    assert peaks["bad"] == pytest.approx(first.run.result["peak_memory_mb"])
    assert peaks["fixed"] < peaks["bad"] / 20
    micro_batches = last.run.config["accumulation_micro_batches"]
    assert f"accumulation in {micro_batches} micro-batches" in " ".join(data.title.split())
    step = (data.edges_ms[:-1] >= last.step_edges_ms[0]) & (
        data.edges_ms[1:] <= last.step_edges_ms[1])
    forward = (last.rows["forward"] > 0.5) & step
    assert np.count_nonzero(np.diff(forward.astype(int)) == 1) + forward[0] == micro_batches
    fig = figures.figure(data)
    try:
        legend = [text.get_text() for text in fig.axes[-1].get_legend().get_texts()]
    finally:
        figures.plt.close(fig)
    printed_peaks = [grab(printed(panel.run.result), r"^peak memory (\S+) MB", "peak memory")
                     for panel in (first, last)]
    assert legend == [f"{panel.variant}: peak {peak} MB"
                      for panel, peak in zip((first, last), printed_peaks)]


@needs_cpu_memory_ladder
def test_fits_chart_draws_the_memory_rows():
    """fits.png: a bar per rung of ladder.memory_rows, rung 0 on top, ending at the peak held
    against the budget (green where it fits, red where not), each bar's words its line of
    compare's memory table, the device line under the title."""
    rows = ladder.memory_rows(CPU_REFERENCE / "memory_ladder")
    fig = figures.fits_figure("memory_ladder", CPU_REFERENCE)
    try:
        pieces = drawn_bars(fig)
        texts = [text.get_text() for text in fig.axes[0].texts]
        title = fig.axes[0].get_title(loc="left")
        colors = {y: fig.axes[0].patches[y].get_facecolor() for y in pieces}
    finally:
        figures.plt.close(fig)
    assert len(pieces) == len(rows) == len(texts)
    for y, row in enumerate(rows):
        assert pieces[y] == [(0.0, pytest.approx(row["peak_mb"], rel=WATERFALL_REL_TOLERANCE),
                              True)]
        expected = report.MEMORY_FITS_COLOR if row["fits"] else report.MEMORY_OVER_COLOR
        assert colors[y] == pytest.approx(to_rgba(expected))
        assert texts[y].startswith(ladder.fits_words(row))
        assert f"peak memory {row['peak_memory_mb']:,.1f} MB" in texts[y]
        assert f"{row['samples_per_s']:,.1f} samples/s" in texts[y]
    assert title.splitlines()[1] == figures.device_line(
        json.loads((CPU_REFERENCE / "memory_ladder" / rows[0]["rung"] / "summary.json")
                   .read_text()))


def waterfall_row(rung: str, samples_per_s: float, first: float | None, before: float | None,
                  top: dict | None = None) -> dict:
    """A row as ladder.ladder_rows gives it, as much of it as the chart reads."""
    return {"rung": rung, "device": "cpu", "batch_size": 16, "samples_per_s": samples_per_s,
            "vs_first": None if first is None else samples_per_s / first,
            "vs_previous": None if before is None else samples_per_s / before, "top": top}


def drawn_bars(fig) -> dict[int, list[tuple[float, float, bool]]]:
    """The chart's bars by rung (its y): (left, right, filled) of each piece, left to right."""
    pieces: dict[int, list] = {}
    for patch in fig.axes[0].patches:
        y = round(patch.get_y() + patch.get_height() / 2)
        pieces.setdefault(y, []).append((patch.get_x(), patch.get_x() + patch.get_width(),
                                         patch.get_fill()))
    return {y: sorted(found) for y, found in pieces.items()}


def check_waterfall(rows: list[dict]) -> None:
    """The chart's data (report.waterfall_bars) and its drawn bars are ladder_rows': each rung's
    samples/s where its bar ends (WATERFALL_REL_TOLERANCE), split at the rung before's; its
    words the waterfall's (format_waterfall's samples/s, ladder.ratio_words of its gains over
    rung 0 and over the rung before) and its top verdict, or none."""
    bars = report.waterfall_bars(rows)
    fig = report.waterfall_figure(rows, "t")
    pieces = drawn_bars(fig)
    texts = [text.get_text() for text in fig.axes[0].texts]
    assert len(bars) == len(rows) == len(pieces) == len(texts)
    before = None
    for y, (bar, row) in enumerate(zip(bars, rows)):
        now = row["samples_per_s"]
        assert bar["samples_per_s"] == pytest.approx(now, rel=WATERFALL_REL_TOLERANCE)
        assert bar["before"] == (None if before is None else pytest.approx(
            before, rel=WATERFALL_REL_TOLERANCE))
        # Drawn: one piece from 0 on rung 0; then the rung before's part (filled) and the
        # change, from there to this rung's (a gain, filled) or from this rung's (a loss, hatched).
        ends = [0.0] + sorted({now, before if before is not None else now})
        assert [side for left, right, _ in pieces[y] for side in (left, right)] == pytest.approx(
            [side for pair in zip(ends, ends[1:]) for side in pair], rel=WATERFALL_REL_TOLERANCE)
        assert [filled for *_, filled in pieces[y]] == [True] + [
            before is not None and now >= before] * (len(ends) - 2)
        words = bar["words"]
        assert words == texts[y] and f"{now:.1f} samples/s" in words
        top = row["top"]
        assert f"top verdict: {top['id'] if top else 'none'}" in words
        if before is not None:
            assert f"vs rung 0: {ladder.ratio_words(row['vs_first'])}" in words
            assert f"vs the rung before: {ladder.ratio_words(row['vs_previous'])}" in words
        before = now


@needs_cpu_ladder
def test_the_waterfall_chart_draws_the_ladder_rows():
    rows = ladder.ladder_rows(CPU_REFERENCE / "ladder")
    check_waterfall(rows)
    words = report.waterfall_bars(rows)[-1]["words"]
    assert f"vs rung 0: {rows[-1]['vs_first']:.2f}x more samples/s" in words  # with its direction


def test_the_waterfall_chart_draws_a_loss_as_one():
    """A rung slower than the one before (a fix that costs on this machine): its bar ends short
    of the rung before's, the difference hatched, its words "0.80x the samples/s"."""
    rows = [waterfall_row("rung0_baseline", 50.0, None, None,
                          {"id": "dataloader", "demo": "dataloader_workers"}),
            waterfall_row("rung1_workers", 100.0, 50.0, 50.0),
            waterfall_row("rung2_bf16", 80.0, 50.0, 100.0, {"id": "x", "demo": None})]
    check_waterfall(rows)
    words = report.waterfall_bars(rows)[2]["words"]
    assert "vs the rung before: 1.25x fewer samples/s" in words  # a loss, its own factor
    assert "vs rung 0: 1.60x more samples/s" in words and "top verdict: x\n" not in words


def test_a_memory_ladder_whose_rung_0_ran_out_of_memory_draws_its_picture_elsewhere(tmp_path):
    """The memory ladder's picture is rung 0's memory against the last rung's. A GPU reference
    whose rung 0 stopped at the cap (a record, no trace) cannot draw it: the picture comes from
    the next reference that ran rung 0, the chart of which rungs fit from the first that has the
    ladder at all (the GPU's, whose cap is the budget)."""
    gpu, cpu = tmp_path / "gpu", tmp_path / "cpu"
    runs = {gpu: {"rung0_baseline": "out_of_memory.json", "rung1_bf16": "out_of_memory.json",
                  "rung2_checkpointing": "summary.json", "rung4_sdpa": "summary.json"},
            cpu: {"rung0_baseline": "summary.json", "rung4_sdpa": "summary.json"}}
    for reference, rungs in runs.items():
        for rung, record in rungs.items():
            (reference / "memory_ladder" / rung).mkdir(parents=True)
            (reference / "memory_ladder" / rung / record).write_text(
                json.dumps({"demo": "memory_ladder"}))
    assert figures.runs_drawn("memory_ladder", gpu) == {"bad": "rung2_checkpointing",
                                                        "fixed": "rung4_sdpa"}
    assert not figures.in_reference("memory_ladder", gpu)
    assert figures.reference_of("memory_ladder", (gpu, cpu)) == cpu
    assert figures.fits_reference_of("memory_ladder", (gpu, cpu)) == gpu
    (gpu / "memory_ladder" / "rung0_baseline" / "out_of_memory.json").unlink()  # rung 0 ran
    (gpu / "memory_ladder" / "rung0_baseline" / "summary.json").write_text("{}")
    assert figures.reference_of("memory_ladder", (gpu, cpu)) == gpu
    assert figures.fits_reference_of("memory_ladder", (tmp_path / "none", cpu)) == cpu


@pytest.mark.parametrize("demo, chart", [("ladder", "waterfall.png"),
                                          ("memory_ladder", "fits.png")])
def test_a_ladder_command_writes_its_picture_and_its_chart(tmp_path, capsys, demo, chart):
    if not (CPU_REFERENCE / demo).is_dir():
        pytest.skip(f"no CPU run of {demo} committed")
    assert figures.main([demo, "--out-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in ("trace.png", chart):
        png = tmp_path / demo / name
        assert f"wrote {png}" in out
        data = png.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and 10_000 < len(data) < MAX_PNG_BYTES
        assert not PNG_TEXT_CHUNKS & set(png_chunk_types(data))


# --- What the walkthroughs say their pictures show. -------------------------------------------

@needs_reference
def test_item_sync_window_shows_gpu_gaps_after_host_syncs(drawn):
    """The walkthrough's picture: in bad, each block's gradient hook waits for the GPU, and the
    GPU idles after it; fixed reads nothing in these steps. Measured on the reference: 2 waits
    and 2 gaps in bad's 1.4 ms window, none in fixed's; 16 % against 23 % busy. At this zoom a
    wait (~10 µs) spans several columns and a gap (~60 µs) dozens; both rows say so in words."""
    item_sync = drawn["item_sync"]
    low, high = item_sync.window_ms
    assert 1.0 <= high - low <= 2.0  # two blocks, not a whole 26 ms step
    bad, fixed = item_sync.panels["bad"], item_sync.panels["fixed"]
    assert bad.sync_gaps >= 2 and fixed.sync_gaps == 0
    assert ((bad.sync_gaps_ms.start >= low) & (bad.sync_gaps_ms.start < high)).all()
    # Each gap is GPU idle time: no kernel runs in it (its busy share there is zero).
    column_ms = (high - low) / figures.COLUMNS
    for start, end in zip(bad.sync_gaps_ms.start, bad.sync_gaps_ms.end):
        inside = (item_sync.edges_ms[:-1] >= start) & (item_sync.edges_ms[1:] <= end)
        assert bad.rows["gpu"][inside].max(initial=0.0) == 0.0
        assert (end - start) / column_ms >= 10  # a gap is seen
    for start, end in zip(bad.syncs_ms.start, bad.syncs_ms.end):
        assert (end - start) / column_ms >= 3  # a wait is seen, not a sliver under a pixel
    # bad's blocks take longer: its GPU is busy less of the same window (tolerance: 5 points).
    assert bad.gpu_busy_pct + 5 < fixed.gpu_busy_pct
    assert bad.rows["syncs"].any() and not fixed.rows["syncs"].any()
    labels = {key: figures.row_label(item_sync.zoom, key) for key in bad.rows}
    assert "host waits for the GPU" in labels["syncs"] and "(.item())" in labels["syncs"]
    assert "idle after a wait" in labels["gpu"]
    assert item_sync.zoom.point_at_waits


@needs_reference
def test_dataloader_workers_window_shows_the_idle_gpu(drawn):
    """bad's GPU waits for the DataLoader most of its step, fixed's is busy. Measured on the
    reference: 10 % against 91 %; the walkthrough's bounds, 60 % and 80 %, leave room."""
    loader = drawn["dataloader_workers"]
    bad, fixed = loader.panels["bad"], loader.panels["fixed"]
    assert bad.gpu_busy_pct < 60 and fixed.gpu_busy_pct > 80
    # The row the busy share comes from agrees with it (the window's part before each
    # variant's profiled steps end, mean of equal columns).
    covered = loader.edges_ms[1:] <= fixed.end_ms
    assert fixed.rows["gpu"][covered].mean() * 100 == pytest.approx(fixed.gpu_busy_pct, abs=1)
    # The DataLoader row: most of bad's window, next to nothing of fixed's.
    assert bad.rows["DataLoader"].mean() > 0.8 and fixed.rows["DataLoader"].mean() < 0.01
    # One of bad's steps: fixed runs all its profiled steps inside it.
    assert fixed.end_ms < loader.window_ms[1] <= bad.end_ms


@needs_reference
def test_naive_attention_draws_the_steps_its_title_gives(drawn):
    """A GPU row, and the dashed lines are the steps as the GPU ran them: each within 1.2x of
    the step p50 in the title (bad's host steps, 13, 21 and 72 ms, are not what a title's
    72 ms means). The window holds bad's three GPU steps; the GPU row before them is earlier
    steps' kernels (drawn pale) or not in the trace."""
    attention = drawn["naive_attention"]
    for variant, panel in attention.panels.items():
        assert "gpu" in panel.rows
        title_ms = float(re.search(r"step p50 (\S+) ms", panel.headline).group(1))
        for step_ms in np.diff(panel.step_edges_ms):
            assert 1 / 1.2 < step_ms / title_ms < 1.2, (variant, step_ms, title_ms)
    bad = attention.panels["bad"]
    assert attention.window_ms[1] == pytest.approx(bad.step_edges_ms[-1])
    assert bad.earlier_kernels.any() and bad.unrecorded_until_ms > 0


@needs_reference
def test_every_demo_has_a_zoom_and_draws_the_same_window_for_both(drawn):
    # Every walkthrough's pair, but those that need a GPU run for their picture (their README
    # says where the picture will be, in a comment).
    assert set(figures.ZOOMS) == set(figures.DEMOS) == {
        path.parent.name for path in (ROOT / "demos").glob("*/README.md")} - NO_PICTURE_YET
    assert set(figures.CPU_ZOOMS) <= set(figures.DEMOS)
    for data in drawn.values():
        assert len(data.edges_ms) == figures.COLUMNS + 1
        for panel in data.panels.values():
            assert all(share.shape == (figures.COLUMNS,) for share in panel.rows.values())
            assert all(((share >= 0) & (share <= 1 + 1e-9)).all() for share in panel.rows.values())


# What a figure draws past its edge is cut from the PNG: a headline or a rung's words that run
# off it lose their last words. A pixel at the figures' 90 dpi is the tolerance.
FIGURE_EDGE_TOLERANCE_IN = 1 / 90


def reach_past_edges_in(fig) -> list[float]:
    """How far (inches) what `fig` draws reaches past its left, bottom, right and top edges,
    laid out as report.save lays it out; positive only where something runs past an edge."""
    fig.tight_layout()
    fig.canvas.draw()  # lays out what only drawing places (legends, titles)
    drawn = fig.get_tightbbox(fig.canvas.get_renderer())
    width, height = fig.get_size_inches()
    return [-drawn.x0, -drawn.y0, drawn.x1 - width, drawn.y1 - height]


def charts() -> list[tuple[str, object]]:
    """The ladders' charts as the committed references draw them: the waterfall of each device's
    ladder and the memory ladder's chart of what fits."""
    found = []
    for device in ("h100", "cpu"):
        folder = ROOT / "traces" / "reference" / device
        if ladder.is_ladder(folder / "ladder"):
            found.append((f"{device} waterfall", report.waterfall_figure(
                ladder.ladder_rows(folder / "ladder"), "ladder: samples/s\ndevice")))
        if ladder.is_memory_ladder(folder / "memory_ladder"):
            found.append((f"{device} fits", figures.fits_figure("memory_ladder", folder)))
    return found


@pytest.mark.parametrize("demo", DRAWN)
def test_every_picture_keeps_its_words_inside_it(drawn, demo):
    """Each walkthrough picture's headlines, labels and notes end inside the figure (a long
    headline breaks after a clause: the ladder's last rung ran 0.2 in past the right edge)."""
    fig = figures.figure(drawn[demo])
    try:
        assert max(reach_past_edges_in(fig)) <= FIGURE_EDGE_TOLERANCE_IN
    finally:
        plt.close(fig)


def test_every_chart_keeps_its_words_inside_it():
    """The waterfall widens its axis until every rung's words end inside it (the H100 ladder's
    ran 0.3 in past the right edge with the fixed room it had), and the chart of what fits."""
    found = charts()
    assert found, "no committed ladder to draw"
    for name, fig in found:
        try:
            assert max(reach_past_edges_in(fig)) <= FIGURE_EDGE_TOLERANCE_IN, name
        finally:
            plt.close(fig)


def test_a_long_headline_breaks_after_a_clause():
    """Lines of at most HEADLINE_WIDTH characters, broken after a "; " where there is one, and
    nothing lost: the same words in the same order."""
    width = figures.HEADLINE_WIDTH
    headline = ("rung5 (batch 256, 14 workers): " + "x" * (width - 60) + " samples/s; "
                "DataLoader 0.0 % of the steps; " + "word " * 40).strip()
    lines = figures.headline_lines(headline).split("\n")
    assert all(len(line) <= width for line in lines)
    assert lines[0].endswith("samples/s;") and lines[1].startswith("DataLoader 0.0 %")
    assert " ".join(lines).split() == headline.split()
    assert figures.headline_lines("short; headline") == "short; headline"


def test_committed_figures_exist_for_every_demo_in_the_reference():
    for demo in DRAWN:  # a ladder's waterfall too, a memory ladder's chart of which rungs fit
        names = (["trace.png"] + (["waterfall.png"] if demo in figures.LADDERS else [])
                 + (["fits.png"] if demo in figures.MEMORY_LADDERS else []))
        for png in (ROOT / "demos" / demo / name for name in names):
            assert png.is_file(), f"{png}: missing; run scripts/walkthrough_figures.py"
            assert png.read_bytes().startswith(PNG_SIGNATURE)
            assert png.stat().st_size < MAX_PNG_BYTES, f"{png}: {png.stat().st_size} bytes"


def test_every_walkthrough_opens_with_its_picture():
    """A pair in a reference links its picture at the top; one not yet run there says where
    its picture will be, in a comment, and has no stale trace.png."""
    for readme in sorted((ROOT / "demos").glob("*/README.md")):
        head = readme.read_text().splitlines()[:README_HEAD_LINES]
        if readme.parent.name in DRAWN:
            assert any(line.startswith("![") and "](trace.png)" in line for line in head), (
                f"{readme}: no link to trace.png in its first {README_HEAD_LINES} lines")
        else:
            assert any("<!--" in line and "trace.png" in line for line in head), readme
            assert not (readme.parent / "trace.png").exists(), readme


@needs_reference
def test_a_pair_missing_from_the_reference_is_skipped_with_a_line(tmp_path):
    reference = tmp_path / "ref"
    reference.mkdir()
    (reference / "item_sync").symlink_to(REFERENCE / "item_sync")
    result = run("--reference", str(reference), "--out-root", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "item_sync" / "trace.png").is_file()
    skipped = [line for line in result.stdout.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == len(figures.DEMOS) - 1
    # Asked for by name: an error, not a skip (and no other folder stands in for the one given).
    with pytest.raises(SystemExit) as exit_code:
        figures.main(["--reference", str(reference), "--out-root", str(tmp_path / "out"),
                      "host_roundtrip"])
    assert exit_code.value.code == 2


def main_says(capsys, *args: str) -> tuple[int, str, str]:
    """The script's main in this process (a fresh interpreter a call costs half a second):
    its exit code, stdout and stderr."""
    with pytest.raises(SystemExit) as exit_code:
        figures.main(list(args))
    out, err = capsys.readouterr()
    return exit_code.value.code, out, err


@pytest.mark.parametrize("args, message", [
    (["nosuch"], "walkthrough_figures.py: error: unknown demo 'nosuch'; choose from: "),
    (["--reference", "/no/such/folder"],
     "walkthrough_figures.py: error: /no/such/folder: no such directory"),
    (["--frobnicate"], "walkthrough_figures.py: error: unrecognized arguments: --frobnicate"),
])
def test_bad_input_is_one_line_and_exit_code_2(capsys, args, message):
    code, out, err = main_says(capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), err
    assert out == ""


def test_a_reference_folder_without_the_pair_is_one_line(capsys, tmp_path):
    code, _, err = main_says(capsys, "--reference", str(tmp_path), "--out-root",
                             str(tmp_path / "out"), "item_sync")
    assert code == 2
    assert err.strip().splitlines() == [
        f"walkthrough_figures.py: error: {tmp_path / 'item_sync' / 'bad'}: no summary.json "
        f"(not a reference run)"]
    assert not (tmp_path / "out").exists()


def test_help_names_the_flags(capsys):
    code, out, _ = main_says(capsys, "--help")
    assert code == 0
    for flag in ("--reference", "--out-root", "DEMO"):
        assert flag in out
