"""The bad-vs-fixed report: REPORT.md, a self-contained report.html, plots, and no stale pairs."""
from __future__ import annotations

import base64
import importlib.util
import json
import re
import shutil
from datetime import datetime, timezone

import pytest

from common import report
from tests.conftest import ROOT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_run_demos():
    spec = importlib.util.spec_from_file_location("run_demos", ROOT / "scripts" / "run_demos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    assert "| samples/s | 1000.0 | 5300.0 | 5.30x |" in small
    assert "**small_batch**" in small and "fixed: no verdict" in small
    assert "GPU's busy time" in small  # GPU traces: a GPU-busy timeline, not a CPU one
    memory = found["activation_checkpointing"]
    assert "**activation_memory**" in memory and "Memory allocated over time" in memory
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert len(images) == 2 + 3  # breakdown and timeline each; a memory curve for checkpointing
    for relative in images:
        assert (pairs_out / relative).read_bytes().startswith(PNG_MAGIC)


def test_html_is_self_contained(pairs_out):
    _, html_path = report.write_report(pairs_out)
    page = html_path.read_text()
    assert not re.search(r"<script|<link|@import|url\(", page, flags=re.I)
    assert not re.search(r'src="(?!data:)', page)  # every image is inline
    pngs = inline_pngs(page)
    assert len(pngs) == 5 and all(png.startswith(PNG_MAGIC) for png in pngs)
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
    run_demos = load_run_demos()
    monkeypatch.setattr(run_demos, "available_demos", lambda: ["small_batch"])

    def fake_run(demo, variant, flags):
        if outcome == "fresh":
            fresh_summaries(flags.out, demo)
        return not (outcome == "failed" and variant == "fixed")
    monkeypatch.setattr(run_demos, "run_variant", fake_run)
    code = run_demos.main(["--out", str(pairs_out)])
    printed = capsys.readouterr().out
    small = sections((pairs_out / report.REPORT_MD).read_text())["small_batch"]
    if outcome == "fresh":
        assert code == 0 and "fixed / bad: 5.30x samples/s" in printed
        assert "| samples/s | 1000.0 | 5300.0 | 5.30x |" in small
    else:
        assert "samples/s" not in small
        assert ("No comparison (failed)" in small) == (outcome == "failed")
        assert ("No comparison (stale)" in small) == (outcome == "not rewritten")
    assert (pairs_out / report.REPORT_HTML).is_file()


def test_run_demos_smoke_report_covers_every_demo(demos_smoke_out):
    """The real ./scripts/run_demos.sh --smoke (shared fixture): one current section per demo."""
    demos = sorted(d.name for d in (ROOT / "demos").iterdir()
                   if (d / "bad.py").is_file() and (d / "fixed.py").is_file())
    found = sections((demos_smoke_out / report.REPORT_MD).read_text())
    assert sorted(found) == demos
    for demo in demos:
        assert "| samples/s |" in found[demo], demo
    page = (demos_smoke_out / report.REPORT_HTML).read_text()
    assert len(inline_pngs(page)) >= 2 * len(demos)


def test_report_command_line(pairs_out, tmp_path, capsys):
    assert report.main([str(pairs_out), "small_batch"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert sorted(sections((pairs_out / report.REPORT_MD).read_text())) == ["small_batch"]
    assert report.main([str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.count("\n") == 1

