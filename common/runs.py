"""A demo's run: what it is (Run, and an inference run's clocks per request), the profiler's
schedule, the files it writes, and the small helpers every room of the harness uses (a progress
line, a one-line failure, a device sync, emptying the run folder)."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common import presets, trace

# Profiler schedule: let the profiler warm up on one step, record three. Few recorded steps keep a
# trace small enough for a browser (a loader's round, where the harness records one, is 14 steps
# of the H100's 14 workers); throughput comes from the timed phase. No step is skipped
# first: the phase starts on an empty GPU queue (clocked_steps syncs), and CUPTI records only the
# kernels launched while it is on (from the warm-up step). With a skipped step, a GPU-bound loop
# more than a step ahead of the host ran that step's kernels inside the recording, unrecorded:
# 47.5 ms with no kernel in the H100 reference's dataloader_workers/fixed, a GPU then 99 % busy.
PROFILE_WAIT_STEPS = 0
PROFILE_WARMUP_STEPS = 1
PROFILE_ACTIVE_STEPS = 3
KEY_AVERAGES_FILE = "key_averages.txt"
CPROFILE_FILE = "cprofile.prof"  # --cprofile: the timed phase's pstats (snakeviz, pstats)
# --memory-snapshot (CUDA): the caching allocator's history over the profiled steps, as
# torch.cuda.memory._dump_snapshot writes it; PyTorch's memory viewer reads it.
MEMORY_SNAPSHOT_FILE = "memory_snapshot.pickle"
# Demos whose lesson is memory record the snapshot on a GPU without the flag.
MEMORY_SNAPSHOT_DEMOS_CUDA = frozenset({"activation_checkpointing", "memory_leak", "fragmentation"})
# Allocator events the snapshot keeps (the newest): each holds a stack, and a long run would
# otherwise grow the history without bound; 100,000 covers several steps of the largest pair.
MEMORY_HISTORY_MAX_ENTRIES = 100_000
RANK_FILE = re.compile(r"(?:summary|key_averages|cprofile|memory_snapshot)\.rank\d+"
                       r"\.(?:json|txt|prof|pickle)")


@dataclass
class Requests:
    """What an inference step records per request: its latency on the host clock (from its start
    to its result on the host), and for generation its first token's time and each later token's.
    The lists grow through every phase; measure_steps reads the timed phase's part."""
    latency_ms: list[float] = field(default_factory=list)
    first_token_ms: list[float] = field(default_factory=list)
    per_token_ms: list[float] = field(default_factory=list)
    tokens: int = 0  # tokens generated

    def mark(self) -> tuple[int, int, int, int]:
        return (len(self.latency_ms), len(self.first_token_ms), len(self.per_token_ms),
                self.tokens)


@dataclass
class Run:
    demo: str
    variant: str
    device: torch.device
    device_name: str
    preset_name: str  # "cuda", "cpu" or "smoke"
    preset: presets.Preset
    steps: int
    seed: int
    out_dir: Path  # <out>/<demo>/<variant>: the trace, summary.json, key_averages.txt
    config: dict = field(default_factory=dict)  # what differs between bad and fixed
    extra: dict = field(default_factory=dict)  # demo-specific facts, written to summary["extra"]
    notes: list[str] = field(default_factory=list)  # sentences for the reader: printed and saved
    # Seconds each training step spent getting its batch, in step order (training_step appends
    # to it); None for a demo that writes its own step.
    data_waits_s: list[float] | None = None
    # Tokens in the batches taken so far, real and with padding, for a demo of variable-length
    # batches (train_on_device's token_counts); None for every other demo.
    real_tokens: int | None = None
    padded_tokens: int | None = None
    # --recorded-steps was given: the profiler records exactly that many (no round of a
    # loader's workers added, profiling.record_a_loader_round).
    recorded_steps_given: bool = False
    # A torchrun job (common/distributed.py): this process's rank, the number of ranks, and
    # what ran (backend and mode); rank 0 of 1 and None for every other demo.
    rank: int = 0
    world_size: int = 1
    distributed: dict | None = None
    # What the profiler records beyond times, where a caller chose (profile_loop: your own loop);
    # None: by the demo (profiling.records_shapes, PROFILE_MEMORY_DEMOS_CUDA).
    record_shapes: bool | None = None
    profile_memory: bool | None = None
    # Python frames: --with-stack records them in the trace (python_function events, at a cost
    # per Python call); --cprofile runs the timed phase under cProfile and writes its .prof.
    with_stack: bool = False
    cprofile: bool = False
    # CUDA only: record the allocator's history over the profiled steps (MEMORY_SNAPSHOT_FILE).
    memory_snapshot: bool = False
    # --memory-budget-gb, in MB: on a GPU the caching allocator is capped at it; on a CPU the
    # process's peak resident memory is checked against it (devices.memory_budget_check).
    memory_budget_mb: float | None = None
    # --compile-log: where torch.compile's structured log goes (TORCH_TRACE), and tlparse's report.
    compile_log: Path | None = None
    # torch.profiler records the ops of the thread that started it (and autograd's); a demo whose
    # step hands work to a thread of its own (serve_texts' tokenize_ahead) asks for every thread.
    profile_all_threads: bool = False
    # An inference demo's clocks per request (generate, serve_texts); None for training.
    requests: Requests | None = None

    @property
    def batch_size(self) -> int:
        return self.preset.batch_size

    @property
    def sizes(self) -> dict[str, int]:
        return self.preset.sizes

    @property
    def recorded_steps(self) -> int:
        """Steps the profiler records: the preset's, else PROFILE_ACTIVE_STEPS."""
        return self.preset.recorded_steps or PROFILE_ACTIVE_STEPS

    @property
    def profiled_steps(self) -> int:
        """Steps run under the profiler: its schedule's wait and warm-up, then the recorded."""
        return PROFILE_WAIT_STEPS + PROFILE_WARMUP_STEPS + self.recorded_steps

    @property
    def total_steps(self) -> int:
        """Every step the run takes: warm-up, timed and profiled."""
        return self.preset.warmup_steps + self.steps + self.profiled_steps

    @property
    def loader_steps(self) -> int:
        """Steps a DataLoader must feed in one epoch: every step, with the profiled phase at its
        longest, a round of the most workers a preset gives (presets.MAX_LOADER_WORKERS) where
        the harness records one (profiling.record_a_loader_round); a new epoch in the recorded
        steps would make its workers start over, a wait of its own."""
        longest = PROFILE_WAIT_STEPS + PROFILE_WARMUP_STEPS + max(self.recorded_steps,
                                                                  presets.MAX_LOADER_WORKERS)
        return self.preset.warmup_steps + self.steps + longest

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def fail(message: str) -> None:
    """Stop the run with one line on stderr and exit code 2: what went wrong and what to do."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def log(run: Run, message: str) -> None:
    """A progress line; in a job of several ranks only rank 0's (they run in lockstep)."""
    if run.rank == 0:
        print(f"[{run.demo}/{run.variant}] {message}", flush=True)


def rank_suffix(run: Run) -> str:
    """"" for rank 0 (and every single-process run), ".rank<N>" for the others: their summary
    and operator table sit beside rank 0's, which compare and the report read."""
    return f".rank{run.rank}" if run.rank else ""


def device_sync(run: Run) -> None:
    """Wait for queued GPU work: a clock read before this measures only the CPU's enqueueing."""
    if run.is_cuda:
        torch.cuda.synchronize(run.device)


def clear_run_dir(out_dir: Path) -> None:
    """Remove what an earlier run left: TensorBoard reads a run directory once, and a stale trace
    beside a new one would be shown as a second worker."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in out_dir.iterdir():
        if path.is_file() and (path.name.endswith(trace.TRACE_SUFFIXES)
                               or path.name in (trace.SUMMARY_FILE, trace.OUT_OF_MEMORY_FILE,
                                                KEY_AVERAGES_FILE,
                                                CPROFILE_FILE, MEMORY_SNAPSHOT_FILE)
                               or RANK_FILE.fullmatch(path.name)):
            path.unlink()
