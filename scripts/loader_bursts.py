"""Can a few recorded steps fall between a DataLoader's bursts? A benchmark of the harness's
answer, on any machine.

DataLoader workers that fall behind the step deliver in rounds: they start together, each
finishes a batch at about the same time, and the step waits once every `--workers` batches. Here
the workers sleep for their batch and the step sleeps for its compute (a GPU's step, as the host
sees it), so no core is needed and the loader is the bottleneck by construction. Each run trains
through the harness (timed steps, then profiled ones) twice per repeat: with the profiler's 3
steps (--recorded-steps 3), and with the harness's own choice (a round of the workers where the
timed steps waited in bursts: profiling.loader_round_steps). It prints, per run, the timed data
wait, the trace's DataLoader share (python -m common.analyze), the steps recorded, samples/s and
the analyzer's top verdict: `dataloader` where the trace holds the wait. The workers set the
pace: a shorter step (--step-s 0.044) gets no more samples/s, only a longer wait.

  .venv/bin/python scripts/loader_bursts.py                    (8 workers, 3 repeats, about a minute)
  .venv/bin/python scripts/loader_bursts.py --workers 14 --repeats 1
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file, from any directory

from common import analyze, harness, ladder

BATCH = 8
TIMED_STEPS = 56  # 7 rounds of 8 workers: the timed wait is a whole number of bursts
SAMPLE_SPREAD = 0.1  # each sample takes +-10 % of its share of the batch time, as images differ


class SleepingSamples(Dataset):
    """Samples that take time to make and no core: each sleeps its share of `batch_s`."""

    def __init__(self, batch_s: float):
        self.sample_s = batch_s / BATCH

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.sample_s * random.uniform(1 - SAMPLE_SPREAD, 1 + SAMPLE_SPREAD))
        return torch.zeros(16), index % 4


class SleepingModel(torch.nn.Module):
    """A linear layer after `step_s` of sleep: the step's compute, as a host waiting on it sees."""

    def __init__(self, step_s: float):
        super().__init__()
        self.step_s, self.linear = step_s, torch.nn.Linear(16, 4)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        time.sleep(self.step_s)
        return self.linear(inputs)


def one_run(flags: argparse.Namespace, out: Path, variant: str, recorded: list[str]) -> tuple:
    run = harness.setup("dataloader_workers", variant, ["--device", "cpu", "--steps",
                                                        str(TIMED_STEPS), "--out", str(out),
                                                        *recorded], batch_size=BATCH)
    loader = DataLoader(SleepingSamples(flags.batch_s), batch_size=BATCH,
                        num_workers=flags.workers, persistent_workers=True)
    model = SleepingModel(flags.step_s)
    summary = harness.train(run, model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    analysis = analyze.analyze_trace(run.out_dir)
    top = ladder.top_finding(analysis)  # what the analyzer would have the user fix first
    return (summary["samples_per_s"], summary["data_wait_pct"], analysis["dataloader_pct"],
            analysis["steps"], top["id"] if top else "none")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=8, help="DataLoader workers (default 8)")
    parser.add_argument("--batch-s", type=float, default=0.8,
                        help="seconds a worker takes for a batch (default 0.8: 8 workers make "
                             "10 batches a second)")
    parser.add_argument("--step-s", type=float, default=0.08,
                        help="seconds of a step's compute (default 0.08: the step waits about "
                             "a fifth of the time)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (default 3)")
    flags = parser.parse_args(argv)
    # torch warns of more workers than cores; these sleep, so they need none
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    if flags.workers < 2 or flags.repeats < 1 or flags.batch_s <= 0 or flags.step_s <= 0:
        parser.error("--workers >= 2, --repeats >= 1, --batch-s and --step-s > 0")
    print(f"{flags.workers} workers, {flags.batch_s} s a batch each; a step's compute "
          f"{flags.step_s} s; {TIMED_STEPS} timed steps, batch {BATCH}")
    rows = []
    with tempfile.TemporaryDirectory() as out:
        for repeat in range(flags.repeats):
            for label, recorded in (("3 steps", ["--recorded-steps", "3"]),
                                    ("the harness's", [])):
                variant = f"r{repeat}_{'three' if recorded else 'harness'}"
                rows.append((label, *one_run(flags, Path(out), variant, recorded)))
    print(f"\n{'recorded':<15} {'steps':>5} {'samples/s':>9} {'timed wait %':>12} "
          f"{'trace share %':>13}  top verdict")
    for label, rate, timed, share, steps, top in rows:
        print(f"{label:<15} {steps:>5} {rate:>9.1f} {timed:>12.1f} {share:>13.1f}  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
