"""scripts/walkthrough_figures.py: the picture at the top of every walkthrough, drawn from the
committed H100 reference traces. The numbers each figure draws are checked against what the
walkthrough says the picture shows; the committed demos/*/trace.png and the READMEs' links to
them are checked to be there."""
from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "walkthrough_figures.py"
REFERENCE = ROOT / "traces" / "reference" / "h100"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_PNG_BYTES = 120 * 1024  # the brief's cap: ten figures stay small in the repository
README_HEAD_LINES = 15  # the picture comes right after the title and the symptom
SCRIPT_TIMEOUT_S = 120  # each run answers in seconds; this only stops a hang


def load_script():
    """scripts/walkthrough_figures.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("walkthrough_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


figures = load_script()
# The pairs the reference has: a pair added since the GPU run gets its picture with the next one.
DRAWN = [demo for demo in figures.DEMOS if figures.in_reference(demo, REFERENCE)]
needs_reference = pytest.mark.skipif(
    not {"item_sync", "dataloader_workers"} <= set(DRAWN),
    reason=f"no reference run of item_sync and dataloader_workers under {REFERENCE}")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=SCRIPT_TIMEOUT_S, env=env)


@pytest.fixture(scope="module")
def data():
    """The drawn numbers of the two pairs the walkthroughs' claims are checked on."""
    return {demo: figures.figure_data(demo, REFERENCE) for demo in ("item_sync",
                                                                     "dataloader_workers")}


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
    between them; only what the script itself does can."""
    env = {name: value for name, value in os.environ.items() if name != "MPLBACKEND"}
    env["MPLCONFIGDIR"] = str(tmp_path / "mplconfig")  # no user matplotlibrc; one font cache
    outs = [tmp_path / "first", tmp_path / "second"]
    for out in outs:
        result = run("--out-root", str(out), "item_sync", "dataloader_workers", env=env)
        assert result.returncode == 0, result.stderr
    for demo in ("item_sync", "dataloader_workers"):
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


@needs_reference
def test_item_sync_window_shows_gpu_gaps_after_host_syncs(data):
    """The walkthrough's picture: in bad, each block's gradient hook waits for the GPU, and the
    GPU idles after it; fixed reads nothing in these steps. Measured on the reference: 3 gaps
    in bad's 3.5 ms window, 0 in fixed's; 16 % against 26 % busy."""
    item_sync = data["item_sync"]
    low, high = item_sync.window_ms
    assert 1.0 <= high - low <= 5.0  # a few blocks: a couple of ms, not a whole 26 ms step
    bad, fixed = item_sync.panels["bad"], item_sync.panels["fixed"]
    assert bad.sync_gaps >= 2 and fixed.sync_gaps == 0
    assert ((bad.sync_gaps_ms.start >= low) & (bad.sync_gaps_ms.start < high)).all()
    # Each gap is GPU idle time: no kernel runs in it (its busy share there is zero).
    for start, end in zip(bad.sync_gaps_ms.start, bad.sync_gaps_ms.end):
        inside = (item_sync.edges_ms[:-1] >= start) & (item_sync.edges_ms[1:] <= end)
        assert bad.rows["gpu"][inside].max(initial=0.0) == 0.0
    # bad's blocks take longer: its GPU is busy less of the same window (tolerance: 5 points).
    assert bad.gpu_busy_pct + 5 < fixed.gpu_busy_pct
    assert bad.rows["syncs"].any() and not fixed.rows["syncs"].any()


@needs_reference
def test_dataloader_workers_window_shows_the_idle_gpu(data):
    """bad's GPU waits for the DataLoader most of its step, fixed's is busy. Measured on the
    reference: 10 % against 91 %; the walkthrough's bounds, 60 % and 80 %, leave room."""
    loader = data["dataloader_workers"]
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
def test_every_demo_has_a_zoom_and_draws_the_same_window_for_both(data):
    assert set(figures.ZOOMS) == set(figures.DEMOS) == {
        path.parent.name for path in (ROOT / "demos").glob("*/README.md")}
    for demo, drawn in data.items():
        assert len(drawn.edges_ms) == figures.COLUMNS + 1
        for panel in drawn.panels.values():
            assert all(share.shape == (figures.COLUMNS,) for share in panel.rows.values())
            assert all(((share >= 0) & (share <= 1 + 1e-9)).all() for share in panel.rows.values())


def test_committed_figures_exist_for_every_demo_in_the_reference():
    for demo in DRAWN:
        png = ROOT / "demos" / demo / "trace.png"
        assert png.is_file(), f"{png}: missing; run scripts/walkthrough_figures.py"
        assert png.read_bytes().startswith(PNG_SIGNATURE)
        assert png.stat().st_size < MAX_PNG_BYTES, f"{png}: {png.stat().st_size} bytes"


def test_every_walkthrough_opens_with_its_picture():
    """A pair in the reference links its picture at the top; one not yet run there says where
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
    named = run("--reference", str(reference), "--out-root", str(tmp_path / "out"),
                "host_roundtrip")  # asked for by name: an error, not a skip
    assert named.returncode == 2 and named.stderr.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["nosuch"], "walkthrough_figures.py: error: unknown demo 'nosuch'; choose from: "),
    (["--reference", "/no/such/folder"],
     "walkthrough_figures.py: error: /no/such/folder: no such directory"),
    (["--frobnicate"], "walkthrough_figures.py: error: unrecognized arguments: --frobnicate"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, message):
    result = run(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert result.stdout == ""


def test_a_reference_folder_without_the_pair_is_one_line(tmp_path):
    result = run("--reference", str(tmp_path), "--out-root", str(tmp_path / "out"), "item_sync")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"walkthrough_figures.py: error: {tmp_path / 'item_sync' / 'bad'}: no summary.json "
        f"(not a reference run)"]
    assert not (tmp_path / "out").exists()


def test_help_names_the_flags():
    result = run("--help")
    assert result.returncode == 0
    for flag in ("--reference", "--out-root", "DEMO"):
        assert flag in result.stdout
