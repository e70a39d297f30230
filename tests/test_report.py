"""The bad-vs-fixed report: REPORT.md, a self-contained report.html, plots, and no stale pairs;
a ladder's section: its waterfall, as text and as a chart."""
from __future__ import annotations

import base64
import html
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from common import ladder, report
from tests.conftest import ROOT, load_script

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def pairs_out(synthetic_pairs_out, tmp_path):
    out = tmp_path / "traces"
    shutil.copytree(synthetic_pairs_out, out)
    return out


def sections(markdown: str) -> dict[str, str]:
    parts = re.split(r"^## ", markdown, flags=re.M)[1:]
    return {part.split("\n", 1)[0]: part for part in parts}


def inline_pngs(page: str) -> list[bytes]:
    return [base64.b64decode(data) for data in
            re.findall(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_report_has_a_section_per_pair_with_table_verdicts_and_plots(pairs_out):
    markdown_path, html_path = report.write_report(pairs_out)
    markdown = markdown_path.read_text()
    found = sections(markdown)
    assert sorted(found) == ["activation_checkpointing", "small_batch"]
    small = found["small_batch"]
    assert "| samples/s | 1000.0 | 5300.0 | 5.30x higher, better |" in small
    assert "**small_batch**" in small and "fixed: no verdict" in small
    assert "GPU's busy time" in small  # GPU traces: a GPU-busy timeline, not a CPU one
    memory = found["activation_checkpointing"]
    assert "**activation_memory**" in memory and "Memory allocated over time" in memory
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    # breakdown, idle by cause and timeline each (GPU pairs); for checkpointing a memory curve
    # and the memory view (memory at each step's end, and what the peak is made of)
    assert len(images) == 3 + 5
    assert "The memory view" in memory and "memory peak" in memory  # the analyzer's lines
    assert "Why the GPU is idle" in small and "What changed most, per step" in small
    for relative in images:
        assert (pairs_out / relative).read_bytes().startswith(PNG_MAGIC)


def test_html_is_self_contained(pairs_out):
    _, html_path = report.write_report(pairs_out)
    page = html_path.read_text()
    assert not re.search(r"<script|<link|@import|url\(", page, flags=re.I)
    assert not re.search(r'src="(?!data:)', page)  # every image is inline
    pngs = inline_pngs(page)
    assert len(pngs) == 8 and all(png.startswith(PNG_MAGIC) for png in pngs)
    assert "5.30x" in page and "activation_memory" in page


def test_memory_over_time_plot(synthetic_pairs_out, tmp_path, workers_smoke_out):
    demo = synthetic_pairs_out / "activation_checkpointing"
    png = report.plot_memory_over_time({"bad": demo / "bad", "fixed": demo / "fixed"},
                                       tmp_path / "memory.png")
    assert png == tmp_path / "memory.png" and png.read_bytes().startswith(PNG_MAGIC)
    # A CPU trace draws its CPU memory events.
    cpu = report.plot_memory_over_time(
        {"bad": workers_smoke_out / "dataloader_workers" / "bad"}, tmp_path / "cpu.png")
    assert cpu is not None and cpu.read_bytes().startswith(PNG_MAGIC)


def test_cpu_pair_says_there_is_no_gpu_timeline(workers_smoke_out, tmp_path):
    out = tmp_path / "traces"
    shutil.copytree(workers_smoke_out / "dataloader_workers", out / "dataloader_workers")
    markdown = report.write_report(out)[0].read_text()
    assert "CPU-only traces: there is no GPU timeline to show" in markdown
    assert "GPU utilization" not in markdown


def test_failed_stale_and_leftover_pairs_show_no_old_numbers(pairs_out):
    figures = pairs_out / report.FIGURES_DIR
    figures.mkdir()
    (figures / "removed_demo_timeline.png").write_bytes(PNG_MAGIC)
    report.write_report(pairs_out, ["small_batch"], failed={"small_batch"})
    markdown = (pairs_out / report.REPORT_MD).read_text()
    small = sections(markdown)["small_batch"]
    assert "No comparison (failed)" in small and "samples/s" not in small
    assert "Not in this run" in markdown and "`activation_checkpointing`" in markdown
    assert "activation_checkpointing" not in sections(markdown)
    assert list(figures.iterdir()) == []  # old plots are gone, none made for a failed pair
    # The synthetic summaries are dated 2025: a run started later finds them stale.
    report.write_report(pairs_out, ["activation_checkpointing"],
                        since=datetime(2026, 1, 1, tzinfo=timezone.utc))
    stale = sections((pairs_out / report.REPORT_MD).read_text())["activation_checkpointing"]
    assert "No comparison (stale)" in stale and "peak memory" not in stale


def fresh_summaries(out, demo):
    """What a successful run does to the summaries: dates them now."""
    for variant in ("bad", "fixed"):
        path = out / demo / variant / "summary.json"
        summary = json.loads(path.read_text())
        summary["created_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        path.write_text(json.dumps(summary))


@pytest.mark.parametrize("outcome", ["fresh", "failed", "not rewritten"])
def test_run_demos_writes_the_report_of_this_run_only(pairs_out, monkeypatch, capsys, outcome):
    """run_demos.py with the scripts replaced: a pair's section is current only when both of its
    scripts succeeded in this run and wrote new summaries."""
    run_demos = load_script("run_demos")
    monkeypatch.setattr(run_demos, "available_demos", lambda: ["small_batch"])

    def fake_run(demo, variant, flags, forks, processes):
        if outcome == "fresh":
            fresh_summaries(flags.out, demo)
        return not (outcome == "failed" and variant == "fixed")
    monkeypatch.setattr(run_demos, "run_variant", fake_run)
    code = run_demos.main(["--out", str(pairs_out)])
    printed = capsys.readouterr().out
    small = sections((pairs_out / report.REPORT_MD).read_text())["small_batch"]
    if outcome == "fresh":
        assert code == 0 and "fixed vs bad: 5.30x more samples/s" in printed
        assert "| samples/s | 1000.0 | 5300.0 | 5.30x higher, better |" in small
    else:
        assert "samples/s" not in small
        assert ("No comparison (failed)" in small) == (outcome == "failed")
        assert ("No comparison (stale)" in small) == (outcome == "not rewritten")
    assert (pairs_out / report.REPORT_HTML).is_file()


def test_run_demos_smoke_report_covers_every_demo(demos_smoke_out):
    """The real ./scripts/run_demos.sh --smoke (shared fixture): one current section per demo,
    and per ladder its waterfall."""
    demos = sorted(d.name for d in (ROOT / "demos").iterdir()
                   if (d / "bad.py").is_file() and (d / "fixed.py").is_file())
    ladders = sorted(d.name for d in (ROOT / "demos").iterdir() if any(d.glob("rung*.py")))
    found = sections((demos_smoke_out / report.REPORT_MD).read_text())
    assert sorted(found) == sorted(demos + ladders)
    for name in ladders:  # the speed ladder's waterfall, the memory ladder's table of fits
        memory = name in ladder.MEMORY_LADDERS
        assert f"```text\n{'memory ladder' if memory else 'ladder'}: " in found[name], name
        assert ("_fits.png)" if memory else "_waterfall.png)") in found[name], name
    for demo in demos:  # its throughput row: a training pair's samples/s, an inference one's
        assert "| samples/s |" in found[demo] or "| requests/s |" in found[demo], demo
    assert "| generated tokens/s |" in found["llm_decode"]
    assert "| per token p50 ms |" in found["llm_decode"]
    assert "| latency p50 ms |" in found["tokenizer_bound"]
    page = (demos_smoke_out / report.REPORT_HTML).read_text()
    assert len(inline_pngs(page)) >= 2 * len(demos) + len(ladders)


def test_report_command_line(pairs_out, tmp_path, capsys):
    assert report.main([str(pairs_out), "small_batch"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert sorted(sections((pairs_out / report.REPORT_MD).read_text())) == ["small_batch"]
    assert report.main([str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# --- A ladder: its waterfall, from the committed CPU runs of its rungs. --------------------------
CPU_LADDER = ROOT / "traces" / "reference" / "cpu" / "ladder"
needs_cpu_ladder = pytest.mark.skipif(not CPU_LADDER.is_dir(),
                                      reason="no CPU run of the ladder committed")


@pytest.fixture
def ladder_out(pairs_out):
    """The synthetic pairs, and beside them the committed CPU ladder (linked: read, not run)."""
    (pairs_out / "ladder").symlink_to(CPU_LADDER, target_is_directory=True)
    return pairs_out


@needs_cpu_ladder
def test_a_ladder_gets_a_section_with_its_waterfall(ladder_out):
    """With no demo named, the report covers every pair and every ladder: the ladder's section
    holds its waterfall as compare prints it and its chart, and the summary says its last rung's
    gain over rung 0 in the waterfall's words; the pairs' sections are as they were."""
    markdown_path, html_path = report.write_report(ladder_out)
    markdown = markdown_path.read_text()
    found = sections(markdown)
    assert list(found) == ["activation_checkpointing", "small_batch", "ladder"]  # pairs first
    rows = ladder.ladder_rows(CPU_LADDER)
    text = ladder.format_waterfall(rows)
    assert f"```text\n{text}\n```" in found["ladder"]
    assert re.findall(r"!\[[^\]]*\]\(([^)]+)\)", found["ladder"]) == [
        f"{report.FIGURES_DIR}/ladder_waterfall.png"]
    assert (ladder_out / report.FIGURES_DIR / "ladder_waterfall.png").read_bytes().startswith(
        PNG_MAGIC)
    gain = ladder.ratio_words(rows[-1]["vs_first"])
    assert (f"Ladders: [ladder](#ladder): {rows[-1]['rung']} vs {rows[0]['rung']}: {gain}."
            in markdown)
    assert "Not in this run" not in markdown
    small = found["small_batch"]  # a pair's section: unchanged by the ladder beside it
    assert "| samples/s | 1000.0 | 5300.0 | 5.30x higher, better |" in small
    assert "| [small_batch](#small_batch) |" in markdown and "| [ladder]" not in markdown
    page = html_path.read_text()
    assert f"<pre>{html.escape(text)}</pre>" in page and 'href="#ladder"' in page
    assert len(inline_pngs(page)) == 8 + 1  # the pairs' plots, and the waterfall chart


@needs_cpu_ladder
def test_a_ladder_not_asked_for_failed_or_stale_shows_no_numbers(ladder_out, capsys):
    report.write_report(ladder_out, ["small_batch"])  # pairs named: the ladder is left over
    markdown = (ladder_out / report.REPORT_MD).read_text()
    assert "ladder" not in sections(markdown) and "`ladder`" in markdown.split("Not in this run")[1]
    report.write_report(ladder_out, [], ladders=["ladder"], failed={"ladder"})
    failed = sections((ladder_out / report.REPORT_MD).read_text())["ladder"]
    assert failed.strip().endswith("**No waterfall (failed):** a rung of this ladder failed in "
                                   "this run (see the log above the report); no numbers are "
                                   "shown")
    assert not list((ladder_out / report.FIGURES_DIR).glob("*.png"))
    later = datetime.now(timezone.utc) + timedelta(days=1)  # a run that began after every rung's
    report.write_report(ladder_out, [], ladders=["ladder"], since=later)
    stale = sections((ladder_out / report.REPORT_MD).read_text())["ladder"]
    assert "**No waterfall (stale):** rung0_baseline/summary.json is from " in stale
    assert "samples/s" not in stale
    # By name on the command line, alone: its section, and no pair's.
    assert report.main([str(ladder_out), "ladder"]) == 0
    capsys.readouterr()
    assert list(sections((ladder_out / report.REPORT_MD).read_text())) == ["ladder"]


# --- Sections without numbers: what the markdown says for each. ---------------------------------

def edit_summaries(out, demo, **changes):
    """Set (or, with None, remove) fields in both summaries of a pair."""
    for variant in ("bad", "fixed"):
        path = out / demo / variant / "summary.json"
        summary = {**json.loads(path.read_text()), **changes}
        path.write_text(json.dumps({k: v for k, v in summary.items() if v is not None}))


def test_missing_failed_and_stale_sections_say_why(pairs_out):
    shutil.rmtree(pairs_out / "activation_checkpointing" / "fixed")  # its fixed run never wrote
    report.write_report(pairs_out, ["never_ran", "activation_checkpointing", "small_batch"],
                        failed={"small_batch"})
    found = sections((pairs_out / report.REPORT_MD).read_text())
    assert found["never_ran"].strip().endswith(
        f"**No comparison (missing):** {pairs_out / 'never_ran'}: no such directory (a demo's "
        "output folder, e.g. traces/dataloader_workers, holding bad/ and fixed/)")
    assert (f"**No comparison (missing):** {pairs_out / 'activation_checkpointing' / 'fixed'}: no "
            "such directory (run demos/<demo>/fixed.py first)") in found["activation_checkpointing"]
    assert ("**No comparison (failed):** a script of this pair failed in this run"
            in found["small_batch"])
    for section in found.values():
        assert "| samples/s |" not in section and "![" not in section  # no numbers, no plots

    report.write_report(pairs_out, ["small_batch"], since=datetime(2026, 1, 1, tzinfo=timezone.utc))
    stale = sections((pairs_out / report.REPORT_MD).read_text())["small_batch"]
    assert ("**No comparison (stale):** bad/summary.json is from 2025-01-01 00:00:00+00:00, "
            "before this run") in stale


@pytest.fixture
def far_from_utc(monkeypatch):
    """The process's local time zone 5:30 ahead of UTC: a naive time read as local time would be
    5.5 h off. A POSIX TZ string ("IST-5:30": name, then the offset west of UTC) needs no tzdata;
    a zone name such as Asia/Kolkata silently means UTC where tzdata is missing."""
    monkeypatch.setenv("TZ", "IST-5:30")
    time.tzset()
    assert time.localtime(0).tm_gmtoff == 5.5 * 3600  # else the tests below could not fail
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("since, status", [
    (datetime(2026, 11, 22, 10, 0, 0, tzinfo=timezone.utc), "ok"),  # written the second it began
    (datetime(2026, 11, 22, 10, 0, 1, tzinfo=timezone.utc), "stale"),
    (datetime(2026, 11, 22, 11, 0, 1, tzinfo=timezone(timedelta(hours=1))), "stale"),  # 10:00:01Z
    (datetime(2026, 11, 22, 9, 59, 59), "ok"),  # a naive start is UTC too
])
def test_a_created_utc_without_offset_is_utc(pairs_out, far_from_utc, since, status):
    edit_summaries(pairs_out, "small_batch", created_utc="2026-11-22T10:00:00")
    [section] = report.build_sections(pairs_out, ["small_batch"], since=since)
    assert section.status == status
    if status == "stale":
        assert section.reason == ("bad/summary.json is from 2026-11-22 10:00:00+00:00, before "
                                  "this run")
    report.write_report(pairs_out, ["small_batch"], since=since)  # renders without an error


@pytest.mark.parametrize("created_utc, says", [
    ("yesterday", "has created_utc 'yesterday', not an ISO 8601 time"),
    (1764000000, "has created_utc 1764000000, not an ISO 8601 time"),
    (None, "has no created_utc"),
])
def test_an_unreadable_created_utc_is_stale_and_says_so(pairs_out, created_utc, says):
    edit_summaries(pairs_out, "small_batch", created_utc=created_utc)
    report.write_report(pairs_out, ["small_batch"],
                        since=datetime(2026, 1, 1, tzinfo=timezone.utc))
    small = sections((pairs_out / report.REPORT_MD).read_text())["small_batch"]
    assert (f"**No comparison (stale):** bad/summary.json {says}: it cannot be shown to come "
            f"from this run") in small


# --- Data wait and profiler overhead. -----------------------------------------------------------

def test_data_wait_profiler_overhead_and_its_warning(pairs_out):
    for variant, fields in (("bad", dict(data_wait_pct=42.5, profiler_overhead_ratio=1.1)),
                            ("fixed", dict(data_wait_pct=3.0, profiler_overhead_ratio=1.6))):
        path = pairs_out / "small_batch" / variant / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    markdown_path, html_path = report.write_report(pairs_out)
    found = sections(markdown_path.read_text())
    small = found["small_batch"]
    assert "| data wait % | 42.5 | 3.0 | 39.5 points less, better |" in small
    assert "| profiled/timed step | 1.10 | 1.60 |  |" in small
    warning = ("fixed: profiled steps ran 1.60x the timed step p50 (warn above 1.2x): the trace "
               "exaggerates CPU time; trust samples/s")
    assert f"> **Warning:** {warning}" in small and "bad: profiled steps" not in small
    # The other pair's summaries predate the fields: n/a, and no warning.
    other = found["activation_checkpointing"]
    assert "| data wait % | n/a | n/a |  |" in other and "Warning" not in other
    page = html_path.read_text()
    assert page.count('<p class="warning">') == 1
    assert f'<p class="warning"><b>Warning:</b> {warning}</p>' in page


def test_report_command_line_into_a_closed_pipe(pairs_out):
    """`python -m common.report ... | head -0`: the report is written, the print fails quietly."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # no reader: the command's first write fails with EPIPE
    try:
        result = subprocess.run([sys.executable, "-m", "common.report", str(pairs_out),
                                 "small_batch"], cwd=ROOT, stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr
    assert result.returncode == 1
    assert sorted(sections((pairs_out / report.REPORT_MD).read_text())) == ["small_batch"]


# --- Pictures checked by what they show (the committed H100 reference: real traces). ------------
REFERENCE_H100 = ROOT / "traces" / "reference" / "h100"
needs_reference = pytest.mark.skipif(not (REFERENCE_H100 / "item_sync" / "fixed").is_dir(),
                                     reason="no committed H100 reference run")


def reference_analyses(demo: str) -> dict:
    from common import analyze
    return {v: analyze.analyze(REFERENCE_H100 / demo / v) for v in ("bad", "fixed")}


def drawn(fig):
    """The figure as saved (laid out, drawn): an RGBA array, row 0 at the top."""
    import numpy as np
    fig.tight_layout()
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(float)


# A painted share of a row is read off its pixels: the row's colour blended with white by the
# share of each pixel covered (antialiasing), so (green - red) / (the colour's green - red) is that
# share; grey step lines behind the row have green = red and count as unpainted. Summed over the
# pixels the row's band touches and divided by the band's exact area. The tolerance: rounding at
# the edges of ~1000 columns a pixel wide, which read 0.6 points or less on five reference pairs.
PAINTED_SHARE_TOLERANCE_PCT = 1.5


@needs_reference
@pytest.mark.parametrize("demo", ["item_sync", "dataloader_workers", "launch_overhead"])
def test_the_timelines_gpu_row_is_as_full_as_the_gpu_was_busy(demo):
    """item_sync's GPU is 18-20 % busy in kernels of a few µs, far narrower than a pixel: the row
    must look 18-20 % full, not solid."""
    import numpy as np
    from matplotlib.colors import to_rgb
    analyses = reference_analyses(demo)
    fig = report.timeline_figure(analyses, demo)
    pixels = drawn(fig)
    red, green, _ = (255 * c for c in to_rgb("#2e7d32"))  # the GPU row's colour
    height = pixels.shape[0]
    for ax, analysis in zip(fig.axes, analyses.values()):
        row = [t.get_text() for t in ax.get_yticklabels()].index("GPU kernels")
        origin = min(analysis.host_window[0], analysis.window[0])
        x0, x1 = ((t - origin) / 1000 for t in analysis.window)
        (left, bottom), (right, top) = ax.transData.transform([(x0, row + 0.4), (x1, row - 0.4)])
        box = pixels[math.floor(height - top):math.ceil(height - bottom),
                     math.floor(left):math.ceil(right)]
        painted = np.clip((box[..., 1] - box[..., 0]) / (green - red), 0, 1).sum()
        share = painted / ((top - bottom) * (right - left))
        assert 100 * share == pytest.approx(analysis.result["gpu"]["utilization_pct"],
                                            abs=PAINTED_SHARE_TOLERANCE_PCT)


@needs_reference
def test_no_stacked_bar_reaches_past_the_breakdowns_frame():
    """activation_checkpointing: its fixed steps are the tallest stacks; each stack is its step's
    breakdown, in order, and stands below the top of the axis."""
    import numpy as np
    analyses = reference_analyses("activation_checkpointing")
    fig = report.breakdown_figure(analyses, "t")
    ax = fig.axes[0]
    drawn(fig)
    stacks: dict = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2, 6)
        stacks[x] = max(stacks.get(x, 0.0), bar.get_y() + bar.get_height())
    expected = np.concatenate([a.breakdown_ms.sum(axis=1) for a in analyses.values()])
    assert [stacks[x] for x in sorted(stacks)] == pytest.approx(expected.tolist(), rel=1e-9)
    assert max(stacks.values()) * (1 + report.BAR_HEADROOM) <= ax.get_ylim()[1] * (1 + 1e-9)


@needs_reference
def test_the_idle_bars_are_the_idle_split():
    """One bar per variant across 0-100 %: GPU busy, then each idle cause, at its own width (a
    host region either run has, by name, after the DataLoader: 0 in a run without it); the named
    causes under NAMED_CAUSE_SHOWN_MIN_PCT in both runs as one part, their sum."""
    from common import analyze
    analyses = reference_analyses("unfused_optimizer")  # a dozen host operators at 0.1-0.8 %
    fig = report.idle_figure(analyses, "t")
    ax = fig.axes[0]
    splits = [a.result["gpu"]["idle_by_cause_pct"] for a in analyses.values()]
    causes = analyze.idle_causes(*splits)
    small = [c for c in causes if c not in analyze.IDLE_CAUSES
             and max(i.get(c, 0.0) for i in splits) < report.NAMED_CAUSE_SHOWN_MIN_PCT]
    assert len(small) >= 2  # what the test is about: several folded into one part
    shown = [c for c in causes if c not in small]
    at = causes.index(small[0])  # the folded part stands where the first of them stood
    parts = ("busy", *shown[:at], "folded", *shown[at:])
    bars = list(ax.patches)
    assert len(bars) == len(parts) * len(analyses)
    assert any(text.get_text() == f"idle: {report.FOLDED_PART}"
               for text in ax.get_legend().get_texts())
    for index, idle in enumerate(splits):
        folded = sum(idle.get(c, 0.0) for c in small)
        widths = [100 - sum(idle.values())] + [folded if part == "folded" else idle.get(part, 0.0)
                                               for part in parts[1:]]
        mine = [bars[k * len(analyses) + index] for k in range(len(parts))]  # one part at a time
        assert [b.get_width() for b in mine] == pytest.approx(widths, abs=1e-9)
        assert [b.get_x() for b in mine] == pytest.approx(
            [sum(widths[:k]) for k in range(len(parts))], abs=1e-9)
        assert sum(widths) == pytest.approx(100.0) and ax.get_xlim() == (0, 100)


@needs_reference
def test_the_memory_curve_peaks_at_the_analyzers_peak():
    analyses = reference_analyses("activation_checkpointing")
    fig = report.memory_figure(analyses, "t")
    lines = fig.axes[0].get_lines()
    assert [line.get_label().split(" ")[0] for line in lines] == ["bad", "fixed"]
    for line, analysis in zip(lines, analyses.values()):
        assert max(line.get_ydata()) == pytest.approx(analysis.result["peak_memory_mb"])
        assert report.format_mb(analysis.result["peak_memory_mb"]) in line.get_label()
