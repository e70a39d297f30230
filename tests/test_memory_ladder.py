"""The memory ladder (demos/memory_ladder/, common/ladder.py's memory rows): each rung is the one
before plus one fix with its why-comment; each fix shrinks what it says it shrinks; gradient
accumulation trains the same update; compare and the report say which rungs fit the budget, and
a rung that ran out of memory at a GPU's cap is a row of the table, not a failure."""
from __future__ import annotations

import difflib
import json
from argparse import Namespace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from common import compare, harness, ladder, models, presets, profiling, report, trace
from common.harness import training_step
from tests.conftest import ROOT, cpu_with_flags, load_script
from tests.test_ladder import FIX_MAX_CHANGED_LINES, code_lines

run_demos = load_script("run_demos")
MEMORY_LADDER = ROOT / "demos" / "memory_ladder"
FIXES = ["bf16", "checkpointing", "accumulation", "sdpa"]
# Each fix frees at least this share of the tensors' peak at smoke sizes (measured: 49 %, 41 %,
# 68 %, 18 %): the profiler's allocation events count bytes, which the same code allocates alike
# in every run, so only a fix that stopped working could fall under it.
FIX_SAVES_MIN = 0.10
# BF16 weights halve every tensor's bytes; at smoke sizes the integer token ids (8 bytes, not
# halved) and the FP32 loss scalars keep it slightly above half (measured 0.51x).
BF16_RATIO, BF16_RATIO_TOLERANCE = 0.5, 0.05


def test_the_rungs_are_the_memory_fixes_in_order():
    rungs = run_demos.rungs_of("memory_ladder")
    assert rungs[0] == "rung0_baseline"
    assert [name.split("_", 1)[1] for name in rungs[1:]] == FIXES
    # the ladders read as memory ladders are those whose preset sets a budget
    assert ladder.MEMORY_LADDERS == {
        demo for demo, by_device in presets.PRESETS.items()
        if any(preset.memory_budget_gb is not None for preset in by_device.values())}


@pytest.mark.parametrize("before, after", list(zip(run_demos.rungs_of("memory_ladder"),
                                                   run_demos.rungs_of("memory_ladder")[1:])))
def test_each_rung_is_the_one_before_plus_one_fix_with_its_why(before, after):
    old = code_lines(MEMORY_LADDER / f"{before}.py")
    new = code_lines(MEMORY_LADDER / f"{after}.py")
    changed = [line for line in difflib.unified_diff(old, new, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert 0 < len([line for line in changed if line.startswith("+")]) <= FIX_MAX_CHANGED_LINES
    assert len([line for line in changed if line.startswith("-")]) <= FIX_MAX_CHANGED_LINES
    assert any("#" in line for line in changed if line.startswith("+")), changed  # the why


def test_gradient_accumulation_trains_the_same_update():
    """A batch in 4 micro-batches, each loss divided by 4, gives the gradients of the whole batch
    at once (FP32: equal to rounding, 1e-5 of the largest)."""
    torch.manual_seed(0)
    model = models.AttentionLM(vocab=32, d_model=16, heads=2, blocks=2, seq_len=8,
                               attention=models.naive_attention, mlp_ratio=4)
    tokens = torch.randint(0, 32, (8, 8))
    grads = {}
    for micro_batches in (1, 4):
        caught = SimpleNamespace(step=lambda: None, zero_grad=lambda set_to_none: None)
        run = SimpleNamespace(device=torch.device("cpu"))
        model.zero_grad(set_to_none=True)
        training_step(run, model, caught, lambda: (tokens, tokens), models.token_cross_entropy,
                      micro_batches=micro_batches)()
        grads[micro_batches] = torch.cat([p.grad.flatten() for p in model.parameters()])
    scale = grads[1].abs().max()
    assert scale > 0
    assert torch.allclose(grads[4], grads[1], rtol=0, atol=1e-5 * scale)


def test_bf16_weights_put_the_model_and_adamw_state_in_bf16():
    run = SimpleNamespace(sizes=dict(vocab=32, d_model=16, heads=2, blocks=1, seq_len=8,
                                     mlp_ratio=4), device=torch.device("cpu"), config={},
                          is_cuda=False, rank=0, demo="memory_ladder", variant="rung1_bf16",
                          notes=[])  # a CPU without AMX tiles adds a note
    model, optimizer = models.attention_lm(run, models.naive_attention, dtype=torch.bfloat16)
    tokens = torch.randint(0, 32, (2, 8))
    models.token_cross_entropy(model(tokens), tokens).backward()
    optimizer.step()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {state["exp_avg"].dtype for state in optimizer.state.values()} == {torch.bfloat16}
    assert run.config["dtype"] == "bfloat16"
    fp32_run = SimpleNamespace(**{**vars(run), "config": {}})
    models.attention_lm(fp32_run, models.naive_attention)
    assert "dtype" not in fp32_run.config  # FP32, the default, is not recorded as a change


def test_compare_prints_which_smoke_rungs_fit(demos_smoke, capsys):
    """run_demos.sh --smoke ran every rung; compare reads them as the memory ladder's table: the
    budget (the smoke preset's) held against each rung's resident peak, and each fix's saving
    in the tensors' peak."""
    folder = demos_smoke.out / "memory_ladder"
    assert {f"memory_ladder/{rung}" for rung in run_demos.rungs_of("memory_ladder")} \
        <= demos_smoke.ran
    assert compare.main([str(folder)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("memory ladder: 5 rungs on cpu")
    assert compare.main(["--json", str(folder)]) == 0
    rows = json.loads(capsys.readouterr().out)["memory_ladder"]
    budget_mb = presets.PRESETS["memory_ladder"]["smoke"].memory_budget_gb * 1000
    for row in rows:
        assert row["ran"] and row["budget_mb"] == pytest.approx(budget_mb)
        assert row["fits"] == (row["peak_mb"] <= row["budget_mb"]), row["rung"]
        assert "ru_maxrss" in row["peak_of"]
        assert f"{row['rung']:<24} {ladder.fits_words(row)}" in text
    peaks = [row["peak_memory_mb"] for row in rows]
    for before, after, row in zip(peaks, peaks[1:], rows[1:]):
        assert after <= (1 - FIX_SAVES_MIN) * before, (row["rung"], before, after)
        assert row["memory_vs_previous"] == pytest.approx(after / before, rel=1e-12)
    assert peaks[1] / peaks[0] == pytest.approx(BF16_RATIO, abs=BF16_RATIO_TOLERANCE)
    assert rows[3]["micro_batches"] == 4 and rows[1]["dtype"] == "bfloat16"


def memory_rung(folder: Path, name: str, *, peak_mb: float | None, tensors_mb: float = 100.0,
                samples_per_s: float = 10.0, budget_mb: float = 1000.0) -> None:
    """A rung's run folder: a summary with its budget check, or (peak_mb None) the record a run
    that ran out of memory at the cap leaves."""
    run = folder / name
    run.mkdir(parents=True)
    common = {"demo": "memory_ladder", "device": "cuda", "device_name": "a GPU",
              "batch_size": 16, "config": {}}
    if peak_mb is None:
        (run / trace.OUT_OF_MEMORY_FILE).write_text(json.dumps(
            {**common, "error": "over the memory budget: rung0 needs more",
             "memory_budget": {"budget_mb": budget_mb, "peak_mb": None,
                               "peak_of": "out of memory at the cap", "fits": False}}))
        return
    (run / trace.SUMMARY_FILE).write_text(json.dumps(
        {**common, "samples_per_s": samples_per_s, "peak_memory_mb": tensors_mb,
         "peak_memory_source": "max_memory_allocated",
         "memory_budget": {"budget_mb": budget_mb, "peak_mb": peak_mb,
                           "peak_of": "reserved by the CUDA caching allocator",
                           "fits": peak_mb <= budget_mb}}))


def test_a_rung_out_of_memory_is_a_row_and_the_first_fit_is_the_one_that_stays(tmp_path):
    """rung 0 ran out at the cap (its record), rung 1 fits, rung 2 is over again, rung 3 fits:
    the first rung that fits is the one from which every later rung fits."""
    memory_rung(tmp_path, "rung0_baseline", peak_mb=None)
    memory_rung(tmp_path, "rung1_bf16", peak_mb=900.0, tensors_mb=400.0, samples_per_s=10.0)
    memory_rung(tmp_path, "rung2_checkpointing", peak_mb=1100.0, tensors_mb=400.0,
                samples_per_s=5.0)
    memory_rung(tmp_path, "rung3_accumulation", peak_mb=500.0, tensors_mb=100.0,
                samples_per_s=5.0)
    assert ladder.is_memory_ladder(tmp_path) and not ladder.is_ladder(tmp_path)
    rows = ladder.memory_rows(tmp_path)
    assert [row["ran"] for row in rows] == [False, True, True, True]
    assert rows[0]["samples_per_s"] is None and rows[1]["memory_vs_previous"] is None
    assert [row["memory_vs_previous"] for row in rows[2:]] == [1.0, 0.25]
    assert rows[2]["speed_vs_previous"] == 0.5
    assert ladder.first_fitting(rows)["rung"] == "rung3_accumulation"
    text = ladder.format_memory_table(rows)
    assert "rung0_baseline           out of memory at the cap | batch 16 | no run: over" in text
    assert "the same peak memory" in text and "0.25x the peak memory" in text
    assert "2.00x fewer samples/s" in text
    assert text.splitlines()[0].endswith("budget 1 GB, held against reserved by the CUDA "
                                         "caching allocator")
    assert "first rung that fits: rung3_accumulation" in text
    (tmp_path / "rung3_accumulation" / trace.SUMMARY_FILE).unlink()
    memory_rung(tmp_path / "x", "rung3_accumulation", peak_mb=1500.0, budget_mb=2000.0)
    (tmp_path / "x" / "rung3_accumulation" / trace.SUMMARY_FILE).rename(
        tmp_path / "rung3_accumulation" / trace.SUMMARY_FILE)
    rows = ladder.memory_rows(tmp_path)
    assert "budgets differ: rung0_baseline 1 GB" in ladder.format_memory_table(rows)
    assert ladder.first_fitting(rows)["rung"] == "rung3_accumulation"
    memory_rung(tmp_path, "rung4_sdpa", peak_mb=1200.0)  # over its budget: nothing fits to the end
    assert ladder.first_fitting(ladder.memory_rows(tmp_path)) is None


def test_the_headline_names_the_first_rung_that_fits_and_what_came_before(tmp_path):
    """The top README's cell for the memory ladder (scripts/reference_tables.py): the first rung
    that fits, the peak it holds against the budget, and the rungs before it, out of memory at
    the cap or over the budget."""
    memory_rung(tmp_path, "rung0_baseline", peak_mb=None)
    memory_rung(tmp_path, "rung1_bf16", peak_mb=None)
    memory_rung(tmp_path, "rung2_checkpointing", peak_mb=900.0)
    memory_rung(tmp_path, "rung3_accumulation", peak_mb=400.0)
    assert ladder.fits_headline(ladder.memory_rows(tmp_path)) == (
        "rung2_checkpointing fits 1 GB at 900.0 MB; the 2 rungs before it ran out of memory at "
        "the cap")
    (tmp_path / "rung1_bf16" / trace.OUT_OF_MEMORY_FILE).unlink()
    memory_rung(tmp_path / "x", "rung1_bf16", peak_mb=1200.0)  # ran, over the budget
    (tmp_path / "x" / "rung1_bf16" / trace.SUMMARY_FILE).rename(
        tmp_path / "rung1_bf16" / trace.SUMMARY_FILE)
    assert ladder.fits_headline(ladder.memory_rows(tmp_path)).endswith(
        "; the 2 rungs before it went over the budget, 1 out of memory at the cap")
    memory_rung(tmp_path, "rung4_sdpa", peak_mb=1100.0)  # the last is over: nothing fits
    assert ladder.fits_headline(ladder.memory_rows(tmp_path)) == "no rung fits 1 GB"


def test_the_report_draws_the_table_and_which_rungs_fit(tmp_path):
    folder = tmp_path / "memory_ladder"
    memory_rung(folder, "rung0_baseline", peak_mb=None)
    memory_rung(folder, "rung1_bf16", peak_mb=900.0)
    markdown, _ = report.write_report(tmp_path)
    text = markdown.read_text()
    rows = ladder.memory_rows(folder)
    assert f"```text\n{ladder.format_memory_table(rows)}\n```" in text
    assert "[memory_ladder](#memory_ladder): the first rung within the 1 GB budget: rung1_bf16" \
        in text
    png = tmp_path / report.FIGURES_DIR / "memory_ladder_fits.png"
    assert png.read_bytes().startswith(b"\x89PNG")
    bars = report.memory_ladder_bars(rows)
    assert bars[0]["end_mb"] > rows[0]["budget_mb"] and not bars[0]["ran"]  # past the line
    assert bars[1]["end_mb"] == 900.0 and bars[1]["fits"]


def test_out_of_memory_over_a_budget_leaves_its_record_and_one_line(tmp_path, capsys):
    out_dir = tmp_path / "memory_ladder" / "rung0_baseline"
    out_dir.mkdir(parents=True)
    (out_dir / trace.SUMMARY_FILE).write_text("{}")  # an earlier run's, which must go
    run = SimpleNamespace(out_dir=out_dir, demo="memory_ladder", variant="rung0_baseline",
                          preset_name="cuda", batch_size=16, sizes={"d_model": 1024},
                          memory_budget_mb=16000.0, device_name="a GPU", rank=0,
                          device=torch.device("cuda"), config={})
    with pytest.raises(SystemExit) as stop:
        profiling.out_of_memory(run)
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("error: over the memory budget: memory_ladder/rung0_baseline")
    assert error.count("\n") == 1
    assert sorted(path.name for path in out_dir.iterdir()) == [trace.OUT_OF_MEMORY_FILE]
    record = json.loads((out_dir / trace.OUT_OF_MEMORY_FILE).read_text())
    assert record["memory_budget"]["fits"] is False and record["error"] in error
    assert record["memory_budget"]["budget_mb"] == 16000.0


@pytest.mark.parametrize("returncode, record_age_s, counts_as_run", [
    (0, None, True), (2, 0, True), (2, None, False), (2, -3600, False), (1, 0, False)])
def test_run_demos_takes_a_rung_out_of_memory_as_a_result(tmp_path, monkeypatch, returncode,
                                                           record_age_s, counts_as_run):
    """Exit code 2 with this run's out-of-memory record is the rung's result; without one, or
    with an earlier run's, it is a failure."""
    folder = tmp_path / "memory_ladder" / "rung0_baseline"

    def script(command, forks, log, processes):
        if record_age_s is not None:
            folder.mkdir(parents=True, exist_ok=True)
            when = datetime.now(timezone.utc) + timedelta(seconds=record_age_s)
            (folder / trace.OUT_OF_MEMORY_FILE).write_text(json.dumps(
                {"created_utc": when.isoformat(timespec="seconds")}))
        return lambda: returncode  # its poll: ended, with this exit code

    monkeypatch.setattr(run_demos, "start_script", script)
    flags = Namespace(device="cuda", out=tmp_path, smoke=True, with_stack=False, steps=None,
                      seed=None, memory_budget_gb=None, recorded_steps=None)
    counted = run_demos.run_variant("memory_ladder", "rung0_baseline", flags, None, [])
    assert counted is counts_as_run


@pytest.mark.parametrize("flags, emulated", [("fpu sse2 avx2", True),
                                             ("avx512f avx512_bf16", False),
                                             ("avx512f avx512_bf16 amx_bf16 amx_tile", None)])
def test_bf16_weights_on_a_cpu_without_amx_say_before_the_first_step_that_it_is_slow(
        monkeypatch, tmp_path, capsys, flags, emulated):
    """Emulated BF16 makes a rung's first step take minutes (96.6 s on a 2-core AMD EPYC), with
    no progress line inside it: the run says why before it starts, and keeps the note (BF16
    instructions without AMX: no faster than FP32); FP32 weights, or a CPU with AMX tiles
    (emulated None), say nothing of it."""
    cpu_with_flags(monkeypatch, tmp_path, flags)
    run = harness.setup("memory_ladder", "rung1_bf16", ["--device", "cpu", "--smoke",
                                                        "--out", str(tmp_path / "out")])
    models.attention_lm(run, attention=models.naive_attention, dtype=torch.float32)
    assert "AMX" not in capsys.readouterr().out and run.notes == []
    models.attention_lm(run, attention=models.naive_attention, dtype=torch.bfloat16)
    printed = [line for line in capsys.readouterr().out.splitlines() if "BF16" in line]
    assert len(printed) == (0 if emulated is None else 1)
    assert len(run.notes) == len(printed)
    if emulated is not None:
        assert printed[0] == f"[memory_ladder/rung1_bf16] note: {run.notes[0]}"
        assert ("emulated" in printed[0]) is emulated
        assert ("no faster than FP32" in printed[0]) is not emulated
