"""The profiled phase records a round of a DataLoader's workers where the timed steps waited for
them in bursts, so that the trace's DataLoader share stands for the timed data wait."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from common import analyze, harness, presets, profiling, runs, trace, verdicts
from tests.conftest import ROOT, load_script
from tests.test_harness import FakeClock

ROUND = profiling.loader_round_steps


def test_the_gap_is_half_the_dataloader_rule():
    """trace.py cannot import the rules; the gap at which the harness and compare act is stated
    there and held to the rule here."""
    assert trace.DATA_WAIT_GAP_POINTS == verdicts.DATALOADER_SHARE_MIN_PCT / 2


def test_the_h100_ladder_s_rung_4_would_record_a_round_of_its_workers():
    """Its numbers: 14 workers, 17.5 % timed wait, p50 84.8 ms, p95 167.3 ms, 3 recorded steps
    that held 0.04 % of waiting."""
    assert ROUND(3, 14, 17.5, 84.8, 167.3) == 14


@pytest.mark.parametrize("spread, steps", [(trace.STEP_SPREAD_MAX, 3),
                                           (trace.STEP_SPREAD_MAX * 1.01, 14)])
def test_a_steady_wait_keeps_the_few_steps(spread, steps):
    """Every step waiting a little (p95 near the p50): any few steps read it right."""
    assert ROUND(3, 14, 17.5, 2.0, 2.0 * spread) == steps


@pytest.mark.parametrize("workers, wait_pct, steps", [
    # 6 workers, 3 recorded: the window misses the wait or doubles it: off by the wait at most
    (6, trace.DATA_WAIT_GAP_POINTS, 3), (6, trace.DATA_WAIT_GAP_POINTS + 0.01, 6),
    # 15 workers, 3 recorded: a round's wait in 3 steps reads 5x the share, off by 4x the wait
    (15, trace.DATA_WAIT_GAP_POINTS / 4, 3), (15, trace.DATA_WAIT_GAP_POINTS / 4 + 0.01, 15)])
def test_a_round_where_a_few_steps_could_miss_by_more_than_the_gap(workers, wait_pct, steps):
    assert ROUND(3, workers, wait_pct, 10.0, 30.0) == steps


@pytest.mark.parametrize("recorded, workers, wait_pct", [
    (3, 3, 50.0),  # no more workers than recorded steps: a round is already in
    (24, 14, 50.0),  # a preset that records more (memory_leak's 24)
    (3, 0, 50.0), (3, 14, 0.0), (3, 14, None)])
def test_no_round_without_more_workers_than_steps_or_without_a_wait(recorded, workers, wait_pct):
    assert ROUND(recorded, workers, wait_pct, 10.0, 30.0) == recorded


def test_of_the_committed_runs_the_h100_ladder_s_rungs_4_and_5_would_record_a_round():
    """What the rule adds to the reference's next run: rung 4 (17.5 % timed wait) and rung 5
    (3.0 %, p95 1.54x the p50: a round's wait in 3 steps could read 11 %), 14 steps each; the
    CPU runs have one worker, and the H100's others wait under 1 % or steadily."""
    rounds = {}
    for path in sorted((ROOT / "traces" / "reference").glob("**/summary.json")):
        summary = json.loads(path.read_text())
        workers = (summary.get("config") or {}).get("num_workers") or 0
        steps = ROUND(runs.PROFILE_ACTIVE_STEPS, workers, summary.get("data_wait_pct"),
                      summary["step_ms_p50"], summary["step_ms_p95"])
        if steps != runs.PROFILE_ACTIVE_STEPS:
            rounds[str(path.parent.relative_to(ROOT / "traces" / "reference"))] = steps
    assert rounds == {"h100/ladder/rung4_compile": 14, "h100/ladder/rung5_jitter_on_device": 14}


class BurstyLoader:
    """A DataLoader's settings and batches, on a fake clock: every `workers`-th batch keeps the
    step waiting `burst_s` (a round of workers that fell behind), the others are ready."""

    def __init__(self, clock: FakeClock, workers: int, burst_s: float):
        self.clock, self.num_workers, self.burst_s = clock, workers, burst_s
        self.pin_memory, self.persistent_workers, self.prefetch_factor = False, True, 2

    def __iter__(self):
        taken = 0
        while True:
            taken += 1
            if taken % self.num_workers == 0:
                self.clock.now_s += self.burst_s
            yield torch.zeros(3, 4), torch.zeros(3, dtype=torch.long)


def train_on_the_clock(monkeypatch, tmp_path, burst_s: float, flags: list[str]) -> dict:
    """dataloader_workers' smoke run with 24 timed steps of 50 ms on the fake clock, its batches
    from a BurstyLoader of 8 workers: the summary and the analyzer's reading of its trace."""
    clock = FakeClock()
    monkeypatch.setattr(profiling.time, "perf_counter", clock)  # the time module: the harness's too
    run = harness.setup("dataloader_workers", "fixed", ["--device", "cpu", "--smoke", "--steps",
                                                        "24", "--out", str(tmp_path), *flags])
    model = torch.nn.Linear(4, 2)

    def loss_fn(logits, targets):
        clock.now_s += 0.05  # the model's step
        return torch.nn.functional.cross_entropy(logits, targets)

    summary = harness.train(run, model, torch.optim.SGD(model.parameters(), lr=0.1),
                            BurstyLoader(clock, workers=8, burst_s=burst_s), loss_fn=loss_fn)
    return summary, analyze.analyze_trace(run.out_dir)


def test_a_run_that_waited_in_bursts_records_a_round_and_says_why(monkeypatch, tmp_path):
    summary, analysis = train_on_the_clock(monkeypatch, tmp_path, burst_s=0.5, flags=[])
    # 3 waits of 0.5 s in 24 steps of 50 ms: 1.5 / 2.7 s; p95 550 ms, 11x the p50
    assert summary["data_wait_pct"] == pytest.approx(100 * 1.5 / 2.7)
    assert summary["recorded_steps"] == 8 and analysis["steps"] == 8  # the trace holds 8
    assert [note for note in summary["notes"] if "a round of the 8 DataLoader workers" in note]


def test_recorded_steps_given_are_kept(monkeypatch, tmp_path):
    summary, analysis = train_on_the_clock(monkeypatch, tmp_path, burst_s=0.5,
                                           flags=["--recorded-steps", "3"])
    assert summary["recorded_steps"] == 3 and analysis["steps"] == 3
    assert not [note for note in summary["notes"] if "DataLoader workers" in note]


def test_a_run_without_a_wait_records_the_preset_s_steps(monkeypatch, tmp_path):
    summary, analysis = train_on_the_clock(monkeypatch, tmp_path, burst_s=0.0, flags=[])
    assert summary["data_wait_pct"] == 0.0
    assert summary["recorded_steps"] == runs.PROFILE_ACTIVE_STEPS == analysis["steps"]


@pytest.mark.parametrize("demo", ["dataloader_workers", "ladder"])
@pytest.mark.parametrize("preset", ["cuda", "cpu", "smoke"])
def test_the_images_last_through_a_round_of_the_most_workers(demo, preset):
    """The DataLoader's one epoch covers every step with the longest profiled phase the harness
    may choose: no new epoch (whose workers start over, a wait) inside the recorded steps."""
    run = runs.Run(demo=demo, variant="v", device=torch.device("cpu"), device_name="cpu",
                   preset_name=preset, preset=presets.PRESETS[demo][preset],
                   steps=presets.PRESETS[demo][preset].steps, seed=0, out_dir=ROOT)
    length = run.loader_steps
    run.config["num_workers"] = presets.MAX_LOADER_WORKERS
    step_ms = np.array([2.0] * 19 + [100.0])  # one step in twenty waits, half the time
    profiling.record_a_loader_round(run, step_ms, 50.0)
    assert run.recorded_steps == max(presets.MAX_LOADER_WORKERS,
                                     presets.PRESETS[demo][preset].recorded_steps
                                     or runs.PROFILE_ACTIVE_STEPS)
    assert run.total_steps <= length


def test_the_benchmark_s_help_says_what_it_measures(capsys):
    with pytest.raises(SystemExit) as stop:
        load_script("loader_bursts").main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "fall between a DataLoader's bursts" in out and "--workers" in out


@pytest.mark.parametrize("args", [["--workers", "1"], ["--repeats", "0"], ["--step-s", "0"]])
def test_the_benchmark_s_bad_flags_are_one_line_and_exit_2(capsys, args):
    with pytest.raises(SystemExit) as stop:
        load_script("loader_bursts").main(args)
    assert stop.value.code == 2
    assert ": error: --workers >= 2" in capsys.readouterr().err.strip().splitlines()[-1]
