"""The profiling harness every demo shares.

setup() parses the common flags, picks the device and its size preset and returns a Run.
train() runs a training loop through measure(), which does, in order:
  warm-up -> a timed phase without the profiler (wall clock, device synchronised) -> a short
  profiled phase that writes a TensorBoard trace -> summary.json and key_averages.txt.
train_on_device() does the same for batches already on the device (optionally under autocast);
a demo whose lesson is the loop itself writes its own step and calls measure(). profile_loop()
does it for your own step, outside the demos (README, "Your own script").
"""
from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import os
import platform
import pstats
import random
import re
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from torch.profiler import (ProfilerActivity, _ExperimentalConfig, profile, record_function,
                            schedule, tensorboard_trace_handler)

from common import distributed, presets, tensorboard_compat, trace, trace_columns

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "traces"

# Profiler schedule: let the profiler warm up on one step, record three. Few recorded steps keep a
# trace small enough for a browser; throughput comes from the timed phase. No step is skipped
# first: the phase starts on an empty GPU queue (clocked_steps syncs), and CUPTI records only the
# kernels launched while it is on (from the warm-up step). With a skipped step, a GPU-bound loop
# more than a step ahead of the host ran that step's kernels inside the recording, unrecorded:
# 47.5 ms with no kernel in the H100 reference's dataloader_workers/fixed, a GPU then 99 % busy.
PROFILE_WAIT_STEPS = 0
PROFILE_WARMUP_STEPS = 1
PROFILE_ACTIVE_STEPS = 3
# Token id 0 is padding in every text batch (padding_waste's random texts use 1..vocab-1;
# tokenizer_bound's tokenizers number their [PAD] first).
PAD_TOKEN_ID = 0
PROFILED_STEPS = PROFILE_WAIT_STEPS + PROFILE_WARMUP_STEPS + PROFILE_ACTIVE_STEPS
PROGRESS_EVERY_S = 5.0  # seconds between progress lines in a long phase
KEY_AVERAGES_ROWS = 25  # rows of the operator table in key_averages.txt
# Kineto's log levels run VERBOSE 0 .. ERROR 4, USDT 5. On a machine with no GPU the CUDA build of
# Kineto logs "gpuGetDeviceCount failed" as an ERROR at every profile, harmless but alarming, and
# torch 2.14's writes "USDT: ... profiler_start" and "profiler_stop" at level 5: 6 hides both.
KINETO_LOG_LEVEL_CPU = "6"
# /proc/cpuinfo flags of CPUs that run BF16 matmuls in hardware (oneDNN uses them): AMX tiles
# (Intel Sapphire Rapids and later), AVX-512 BF16 dot products (Cooper Lake, AMD Zen 4), and "bf16"
# in an Arm CPU's Features line (Neoverse V1, Graviton3). Without any, BF16 is emulated in FP32.
CPU_NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
# Only AMX's tile units multiply BF16 faster than the FP32 units: AVX-512 BF16 dot products alone
# measured 0.68x (BF16 slower) on this project's mixed_precision pair, AMX 1.8x.
CPU_BF16_MATRIX_UNIT_FLAG = "amx_bf16"
CPUINFO_PATH = Path("/proc/cpuinfo")
KEY_AVERAGES_FILE = "key_averages.txt"
CPROFILE_FILE = "cprofile.prof"  # --cprofile: the timed phase's pstats (snakeviz, pstats)
CPROFILE_ROWS = 10  # functions printed by cumulative time
RANK_FILE = re.compile(r"(?:summary|key_averages|cprofile)\.rank\d+\.(?:json|txt|prof)")
# Demos whose scripts run as several processes (common/distributed.py).
DISTRIBUTED_DEMOS = frozenset({"ddp_no_sync"})
# What each demo's lesson reads from its trace beyond times. record_shapes (operator input shapes
# and dtypes) and profile_memory (every allocation) add CPU time to each operator, which makes a
# launch-bound step look slower than it is, so each is on only where a demo needs it.
RECORD_SHAPES_DEMOS = frozenset({"small_batch", "mixed_precision", "naive_attention",
                                 "padding_waste", "ddp_no_sync"})
# (batch dims; BF16 input types; s x s scores; sequence lengths; the collectives' message sizes,
# which TensorBoard's Distributed view reads)
# On a GPU the peak comes from torch.cuda.max_memory_allocated; the trace's memory events are the
# lesson only where memory is. On a CPU every demo reads its peak from them.
PROFILE_MEMORY_DEMOS_CUDA = frozenset({"activation_checkpointing", "naive_attention"})

# Dense BF16 tensor-core peak (TFLOPS, no sparsity) of GPUs by a model name in their device name,
# the more specific first; from NVIDIA's datasheets (H100 SXM5 989.4, H100 NVL 835, H100 PCIe 756,
# H200 989.4, H200 NVL 835, GH200 989.4, B200 2250, GB200 2500 a GPU, A100 312, L40S 362, L40 181,
# L4 121). A run that records its model FLOPs (run.config["model_tflop_per_step"]) reports the
# share of this peak it reached: what is called model-FLOPs utilisation (MFU). A GPU not listed
# gets achieved TFLOPS only. Names match as whole words: "L4" is not "L40", "H200" not "GH200".
BF16_DENSE_PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4),
                          ("H200 NVL", 835.0), ("GH200", 989.4), ("H200", 989.4),
                          ("GB200", 2500.0), ("B200", 2250.0), ("A100", 312.0),
                          ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0))


def bf16_peak_tflops(device_name: str) -> float | None:
    return next((peak for key, peak in BF16_DENSE_PEAK_TFLOPS
                 if re.search(rf"\b{re.escape(key)}\b", device_name)), None)


def flops_achieved(run: Run, step_ms_p50: float) -> dict:
    """Achieved TFLOPS at the timed step p50, and its share of the GPU's BF16 peak; {} for a run
    that records no model FLOPs."""
    tflop = run.config.get("model_tflop_per_step")
    if not tflop:
        return {}
    achieved = tflop / (step_ms_p50 / 1000.0)
    peak = bf16_peak_tflops(run.device_name) if run.is_cuda else None
    return {"achieved_tflops": achieved, "bf16_peak_tflops": peak,
            "bf16_peak_pct": None if peak is None else 100.0 * achieved / peak}


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
    # Seconds the training step spent getting its batch (training_step adds to it); None for a
    # demo that writes its own step.
    data_wait_s: float | None = None
    # Tokens in the batches taken so far, real and with padding, for a demo of variable-length
    # batches (train_on_device's token_counts); None for every other demo.
    real_tokens: int | None = None
    padded_tokens: int | None = None
    # A torchrun job (common/distributed.py): this process's rank, the number of ranks, and
    # what ran (backend and mode); rank 0 of 1 and None for every other demo.
    rank: int = 0
    world_size: int = 1
    distributed: dict | None = None
    # What the profiler records beyond times, where a caller chose (profile_loop: your own loop);
    # None: by the demo (RECORD_SHAPES_DEMOS, PROFILE_MEMORY_DEMOS_CUDA).
    record_shapes: bool | None = None
    profile_memory: bool | None = None
    # Python frames: --with-stack records them in the trace (python_function events, at a cost
    # per Python call); --cprofile runs the timed phase under cProfile and writes its .prof.
    with_stack: bool = False
    cprofile: bool = False
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
    def total_steps(self) -> int:
        """Every step the run takes: warm-up, timed and profiled."""
        return self.preset.warmup_steps + self.steps + PROFILED_STEPS

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text}")
    return value


def build_parser(demo: str, variant: str) -> argparse.ArgumentParser:
    doc = getattr(sys.modules.get("__main__"), "__doc__", None)
    parser = argparse.ArgumentParser(
        prog=f"demos/{demo}/{variant}.py", description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Writes <out>/{demo}/{variant}/: a TensorBoard trace (.pt.trace.json.gz), "
               f"{trace.SUMMARY_FILE} and {KEY_AVERAGES_FILE}.")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="where to train; auto picks cuda when PyTorch sees a GPU (default: auto)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes and few steps: finishes in seconds, for tests")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="timed steps (default: the preset's)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output root (default: {DEFAULT_OUT.relative_to(REPO_ROOT)}/)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--with-stack", action="store_true",
                        help="record Python frames in the trace (torch.profiler with_stack=True): "
                             "the analyzer then lists the hot frames; costs time per Python call "
                             "in the profiled steps only")
    parser.add_argument("--cprofile", action="store_true",
                        help=f"run the timed phase under cProfile: writes {CPROFILE_FILE} beside "
                             f"the trace and prints the top {CPROFILE_ROWS} functions by "
                             f"cumulative time (samples/s then includes cProfile's cost)")
    return parser


def pick_device(requested: str, parser: argparse.ArgumentParser) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: PyTorch sees no CUDA GPU here "
                     "(torch.cuda.is_available() is False); use --device cpu or auto")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def fail(message: str) -> None:
    """Stop the run with one line on stderr and exit code 2: what went wrong and what to do."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def cpuinfo_value(*keys: str) -> str | None:
    """The value of the first /proc/cpuinfo line starting with one of `keys` (None: no such line,
    or no Linux)."""
    try:
        lines = CPUINFO_PATH.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(keys):
            return line.split(":", 1)[1].strip()
    return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    # platform.processor() is empty on most Linux systems; /proc/cpuinfo names the CPU
    model = cpuinfo_value("model name") or platform.processor() or platform.machine()
    return f"{model} ({presets.usable_cpu_count()} cores)"


def setup(demo: str, variant: str, argv: list[str] | None = None, *,
          batch_size: int | None = None) -> Run:
    """Parse the flags every demo takes, seed everything and pick the device and its preset.
    `batch_size`, when given, replaces the preset's (a demo whose lesson is the batch size)."""
    parser = build_parser(demo, variant)
    flags = parser.parse_args(argv)
    device = pick_device(flags.device, parser)
    dist_info = None
    if demo in DISTRIBUTED_DEMOS:
        if not torch.distributed.is_available():
            parser.error("this PyTorch build has no torch.distributed (torch.distributed."
                         "is_available() is False), which this demo needs to run its ranks")
        if not distributed.launched():  # flags checked: run the ranks, each parses them again
            ranks = distributed.ranks_for(device.type)
            print(f"[{demo}/{variant}] starting {ranks} ranks with torchrun", flush=True)
            sys.exit(distributed.relaunch(sys.argv[0], sys.argv[1:] if argv is None else argv,
                                          ranks))
        device, backend, mode = distributed.join(device.type)
        dist_info = {"backend": backend, "world_size": distributed.world_size(), "mode": mode}
    name = presets.preset_name(device.type, flags.smoke, demo,
                               bf16_matrix_units=device.type != "cpu"
                               or CPU_BF16_MATRIX_UNIT_FLAG in cpu_native_bf16_flags())
    preset = presets.PRESETS[demo][name]
    if batch_size is not None:
        preset = replace(preset, batch_size=batch_size)
    world_size, rank = distributed.world_size(), distributed.rank()
    threads = presets.main_process_threads(device.type)
    if dist_info and device.type == "cpu":  # the ranks share the cores
        threads = max(1, presets.usable_cpu_count() // world_size)
    torch.set_num_threads(threads)
    # Let cuDNN time its convolution algorithms on the first steps (the warm-up) and keep the
    # fastest for these fixed shapes; the same in bad and fixed.
    torch.backends.cudnn.benchmark = device.type == "cuda"
    if device.type == "cpu":
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_LOG_LEVEL_CPU)
    seed = flags.seed + rank  # each rank its own data; DDP copies rank 0's weights to all
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return Run(demo=demo, variant=variant, device=device, device_name=device_name(device),
               preset_name=name, preset=preset, steps=flags.steps or preset.steps,
               seed=seed, out_dir=Path(flags.out) / demo / variant, rank=rank,
               world_size=world_size, distributed=dist_info, with_stack=flags.with_stack,
               cprofile=flags.cprofile)


def require_compile_toolchain(run: Run) -> None:
    """torch.compile writes C++ (Inductor on a CPU) or Triton code (on a GPU) and builds it with
    the system's compiler against Python's headers. Without them it fails deep inside Inductor
    with a long traceback; say what is missing in one line instead (exit code 2)."""
    compilers = ("c++", "g++", "clang++") if run.device.type == "cpu" else ("cc", "gcc", "clang")
    chosen = os.environ.get("CXX" if run.device.type == "cpu" else "CC")  # used alone when set
    missing = []
    if chosen and not shutil.which(chosen):
        missing.append(f"the compiler named by $CXX/$CC ({chosen})")
    elif not chosen and not any(shutil.which(c) for c in compilers):
        missing.append(f"a compiler ({', '.join(compilers)})")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        missing.append("Python's headers (Python.h)")
    if missing:
        fail(f"torch.compile needs {' and '.join(missing)}; on Debian or Ubuntu: "
             f"apt-get install build-essential python3-dev")


def full_fp32_matmuls() -> None:
    """FP32 matmuls and convolutions in full precision: TF32 (the middle rung) would run them on
    tensor cores. torch >= 2.9 has fp32_precision settings and deprecates allow_tf32."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def tf32_in_force() -> dict[str, bool]:
    """Whether FP32 matmuls and convolutions may use TF32, read from whichever API this torch has."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        return {"tf32_matmul": torch.backends.cuda.matmul.fp32_precision == "tf32",
                "tf32_cudnn": torch.backends.cudnn.conv.fp32_precision == "tf32"}
    return {"tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "tf32_cudnn": torch.backends.cudnn.allow_tf32}


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


def forever(loader: Iterable) -> Iterator:
    """Batches without end: a new epoch starts when the loader runs out."""
    while True:
        yield from loader


def describe_loader(loader) -> dict:
    return {"num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers,
            "prefetch_factor": loader.prefetch_factor}


def training_step(run: Run, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]], loss_fn: Callable,
                  autocast_dtype: torch.dtype | None = None) -> Callable[[], None]:
    """One training step in the four regions every trace shows: data, forward, backward,
    optimizer. With `autocast_dtype`, the forward pass and the loss run under torch.autocast."""
    model.train()

    def precision():
        if autocast_dtype is None:
            return nullcontext()
        return torch.autocast(run.device.type, dtype=autocast_dtype)

    run.data_wait_s = 0.0

    def step() -> None:
        with record_function("data"):
            fetch_started = time.perf_counter()
            inputs, targets = next_batch()
            run.data_wait_s += time.perf_counter() - fetch_started
        with record_function("forward"), precision():
            loss = loss_fn(model(inputs), targets)
        with record_function("backward"):  # outside autocast: backward follows the forward's dtypes
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def train(run: Run, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          loader: Iterable, *, loss_fn: Callable = torch.nn.functional.cross_entropy) -> dict:
    """Train on batches from `loader` (a DataLoader, or a wrapper with its settings, such as
    data.DevicePrefetcher), measure and profile it. Returns the summary."""
    batches = forever(loader)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = next(batches)
        # A plain copy from pageable memory: the CPU waits for it, in the compute stream. A batch
        # already on the device (a prefetcher put it there) is returned as it is.
        return inputs.to(run.device), targets.to(run.device)

    run.config.update(describe_loader(loader))
    return measure(run, training_step(run, model, optimizer, next_batch, loss_fn))


def cpu_native_bf16_flags() -> list[str]:
    """The flags in CPU_NATIVE_BF16_FLAGS that /proc/cpuinfo lists (empty: none, or no Linux)."""
    present = set((cpuinfo_value("flags", "Features") or "").split())  # x86: flags, Arm: Features
    return [flag for flag in CPU_NATIVE_BF16_FLAGS if flag in present]


def note_cpu_bf16(run: Run) -> None:
    """Say what a BF16 result on this CPU can and cannot show, before it is measured: the note
    promises nothing the number may contradict (compare prints the measured ratio)."""
    flags = cpu_native_bf16_flags()
    run.extra["cpu_native_bf16"] = bool(flags)
    run.extra["cpu_native_bf16_flags"] = flags
    lesson = "the lesson is the GPU's, where BF16 runs on tensor cores (see the README)"
    if CPU_BF16_MATRIX_UNIT_FLAG in flags:
        run.notes.append(f"this CPU has native BF16 ({', '.join(flags)}), with AMX tile units "
                         f"that multiply BF16 matrices faster than FP32: a speed-up is possible "
                         f"here; {lesson}")
    elif flags:
        run.notes.append(f"this CPU has native BF16 instructions ({', '.join(flags)}) but no AMX "
                         f"tiles: BF16 matmuls may run no faster than FP32, or slower; only AMX "
                         f"makes BF16 faster on a CPU; {lesson}")
    else:
        run.notes.append("no native BF16 on this CPU; the speed-up needs tensor cores "
                         "(BF16 is emulated here, so expect a slowdown on this CPU)")
    if run.preset_name == presets.CPU_WITHOUT_BF16_UNITS:
        run.notes.append(f"without AMX both variants run the smaller {run.preset_name} preset "
                         f"(2 blocks, 128 tokens, 4 steps): the slowdown is all there is to "
                         f"show, and the cpu preset's emulated BF16 takes ~18 s a step")


def train_on_device(run: Run, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *,
                    autocast_dtype: torch.dtype | None = None,
                    loss_fn: Callable = torch.nn.functional.cross_entropy,
                    token_counts: list[tuple[int, int]] | None = None) -> dict:
    """Train on (inputs, targets) batches that already sit on the device, taken in turn, so the
    measurement holds the model's step and nothing of data loading. With `autocast_dtype`, the
    forward pass and the loss run under torch.autocast in that dtype. `token_counts`: (real,
    padded) tokens of each batch, counted on the host as the batches are taken, so the summary
    gains tokens_per_s (real tokens) and padding_pct. Returns the summary."""
    cycle = itertools.cycle(batches)
    if token_counts is not None:
        cycle = counting_tokens(run, cycle, itertools.cycle(token_counts))
    dtype_name = None if autocast_dtype is None else str(autocast_dtype).removeprefix("torch.")
    run.config.update(data="staged on the device", staged_batches=len(batches),
                      autocast_dtype=dtype_name, **tf32_in_force())
    if autocast_dtype == torch.bfloat16 and not run.is_cuda:
        note_cpu_bf16(run)
    return measure(run, training_step(run, model, optimizer, lambda: next(cycle), loss_fn,
                                      autocast_dtype))


def counting_tokens(run: Run, batches: Iterator, counts: Iterator[tuple[int, int]]) -> Iterator:
    """The batches, adding each one's (real, padded) tokens to the run's counters as it is taken:
    host integers, so counting makes nothing wait for the device."""
    run.real_tokens = run.padded_tokens = 0
    for batch, (real, padded) in zip(batches, counts):
        run.real_tokens += real
        run.padded_tokens += padded
        yield batch


# --- Inference: the unit is a request. --------------------------------------------------------

def decode_tokens(model: torch.nn.Module, next_token: Callable, prompt: torch.Tensor,
                  new_tokens: int, on_token: Callable[[], None] = lambda: None
                  ) -> list[torch.Tensor]:
    """Greedy generation at batch 1: the prompt [1, p] in one pass (model.next_token, eager),
    then new_tokens - 1 steps of `next_token` (token [1, 1], position [1]) -> token [1, 1], the
    KV cache in the model. `on_token` runs after each token is enqueued. Nothing here reads a
    value on the host: the tokens stay on the device."""
    model.reset_cache()
    length = prompt.size(1)
    with record_function("prefill"):
        token = model.next_token(prompt, torch.arange(length, device=prompt.device))
    on_token()
    tokens = [token]
    position = torch.full((1,), length, device=prompt.device)
    with record_function("decode"):
        for _ in range(new_tokens - 1):
            if prompt.is_cuda:  # each call is a new step of the CUDA graph trees, not a re-entry
                torch.compiler.cudagraph_mark_step_begin()
            # clone: a CUDA graph's output lives in memory its next replay overwrites
            token = next_token(token, position).clone()
            tokens.append(token)
            position = position + 1
            on_token()
    return tokens


def token_clock(run: Run, marks: int) -> tuple[Callable[[], None], Callable[[], list[float]]]:
    """(mark, read): mark() notes the time of the next of `marks` instants, read() returns each
    mark's ms since the first and starts over. On a GPU the marks are CUDA events, which the
    device timestamps when it reaches them, so they cost no sync; read() waits for them."""
    taken = []
    if run.is_cuda:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(marks)]

        def mark() -> None:
            events[len(taken)].record()
            taken.append(events[len(taken)])

        def read() -> list[float]:
            taken[-1].synchronize()
            times = [taken[0].elapsed_time(event) for event in taken]
            taken.clear()
            return times
    else:
        def mark() -> None:
            taken.append(time.perf_counter())

        def read() -> list[float]:
            times = [(t - taken[0]) * 1000.0 for t in taken]
            taken.clear()
            return times
    return mark, read


def require_cuda_graphs(run: Run) -> None:
    """torch.compile(mode="reduce-overhead") falls back to running without CUDA graphs when it
    cannot record one (an input it mutates, a CPU tensor, a sync), with a line in its log at
    most: the run would then measure the fix without its graphs. Stop instead."""
    from torch._dynamo.utils import counters
    skips = counters["inductor"]["cudagraph_skips"]
    if skips:
        clear_run_dir(run.out_dir)
        fail(f"{run.demo}/{run.variant}: torch.compile(mode='reduce-overhead') skipped CUDA graphs "
             f"{skips} time(s), so the step runs without them; rerun with "
             f"TORCH_LOGS=perf_hints to see why; nothing was written")


def generate(run: Run, model: torch.nn.Module, next_token: Callable,
             prompts: Sequence[torch.Tensor]) -> dict:
    """Serve generation requests at batch 1, one a step, the prompts taken in turn: each request
    generates run.sizes["new_tokens"] tokens (decode_tokens) and ends when they are on the host.
    Its latency is on the host clock; its first token's time and each later token's on the
    device's (token_clock). Under torch.inference_mode(). Returns the summary."""
    new_tokens = run.sizes["new_tokens"]
    run.requests = Requests()
    turns = itertools.cycle(prompts)
    mark, read = token_clock(run, new_tokens + 1)
    run.config.update(inference_mode=True, batch="1 request", prompt_tokens=prompts[0].size(1),
                      new_tokens=new_tokens, decoding="greedy")

    def step() -> None:
        started = time.perf_counter()
        with torch.inference_mode():
            mark()
            tokens = decode_tokens(model, next_token, next(turns), new_tokens, on_token=mark)
            torch.cat(tokens, dim=1).tolist()  # the request ends when its tokens are on the host
        run.requests.latency_ms.append((time.perf_counter() - started) * 1000.0)
        times = read()
        run.requests.first_token_ms.append(times[1])
        run.requests.per_token_ms.extend(later - earlier
                                         for earlier, later in zip(times[1:], times[2:]))
        run.requests.tokens += new_tokens

    if run.is_cuda and run.config.get("torch_compile") == "reduce-overhead":
        def checked_step() -> None:
            step()
            require_cuda_graphs(run)  # after the warm-up's first request: graphs are recorded
        return measure(run, checked_step)
    return measure(run, step)


def padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D token tensors padded with PAD_TOKEN_ID to the longest: (tokens [rows, longest],
    padding mask [rows, longest], True at padding), on the host."""
    tokens = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=PAD_TOKEN_ID)
    return tokens, tokens == PAD_TOKEN_ID


def serve_texts(run: Run, model: torch.nn.Module, texts: Sequence[str],
                tokenize: Callable[[list[str]], list[list[int]]], *,
                tokenize_ahead: bool = False) -> dict:
    """Classify text requests, run.batch_size a step, the texts taken in turn: tokenize the batch
    (`tokenize`, in a record_function("tokenize") region), pad it to its longest (at most
    run.sizes["max_len"] tokens), copy it to the device, classify, and read the labels back to
    the host, which ends the batch's requests. A request's latency runs from the start of its
    batch's tokenizing to its answer on the host (host clock). With `tokenize_ahead`, a thread
    tokenizes the next batch while the model runs this one (worth it only for a tokenizer that
    releases the GIL, as native code does); a batch then waits for the model one step, and its
    latency says so. Under torch.inference_mode()."""
    run.requests = Requests()
    max_len = run.sizes["max_len"]
    batches = forever([list(texts[i:i + run.batch_size])
                       for i in range(0, len(texts) - run.batch_size + 1, run.batch_size)])
    run.config.update(inference_mode=True, batch=f"{run.batch_size} requests",
                      max_tokens=max_len, tokenize_ahead=tokenize_ahead)

    def tokenized() -> tuple[float, int, list[list[int]]]:
        started, requests = time.perf_counter(), next(batches)
        with record_function("tokenize"):
            return started, len(requests), tokenize(requests)

    ahead = ThreadPoolExecutor(max_workers=1) if tokenize_ahead else None
    run.profile_all_threads = tokenize_ahead  # the trace shows the tokenize regions it runs
    next_batch = []  # the future of the batch being tokenized ahead

    def step() -> None:
        if ahead:
            if not next_batch:  # the first step: nothing was tokenized ahead yet
                next_batch.append(ahead.submit(tokenized))
            started, count, ids = next_batch.pop().result()
            next_batch.append(ahead.submit(tokenized))  # runs while the model runs this batch
        else:
            started, count, ids = tokenized()
        with torch.inference_mode():
            with record_function("forward"):
                tokens, padding = padded([torch.tensor(row[:max_len]) for row in ids])
                labels = model((tokens.to(run.device), padding.to(run.device))).argmax(dim=-1)
            labels.tolist()  # the requests end when their answers are on the host
        latency_ms = (time.perf_counter() - started) * 1000.0
        run.requests.latency_ms.extend([latency_ms] * count)

    try:
        return measure(run, step)
    finally:
        if ahead:
            ahead.shutdown(cancel_futures=True)


def clocked_steps(run: Run, step: Callable[[], None], count: int, phase: str,
                  after_step: Callable[[], None] = lambda: None) -> tuple[float, np.ndarray]:
    """Run `count` steps, timing each from its start to its end: CUDA events on a GPU (its clock,
    no sync per step), perf_counter on a CPU. `after_step` runs after each step, outside its time
    (the profiler's step marker, which writes the trace after the last recorded step). Prints a
    progress line every PROGRESS_EVERY_S. Returns (wall seconds, device synchronised at both ends;
    per-step milliseconds)."""
    device_sync(run)
    if run.is_cuda:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    else:
        starts, ends = np.zeros(count), np.zeros(count)
    started = last_print = time.perf_counter()
    for index in range(count):
        if run.is_cuda:
            starts[index].record()
        else:
            starts[index] = time.perf_counter()
        step()
        if run.is_cuda:
            ends[index].record()
        else:
            ends[index] = time.perf_counter()
        after_step()
        if time.perf_counter() - last_print >= PROGRESS_EVERY_S:
            log(run, f"{phase}: step {index + 1}/{count}")
            last_print = time.perf_counter()
    device_sync(run)
    wall_s = time.perf_counter() - started
    if run.is_cuda:
        return wall_s, np.array([a.elapsed_time(b) for a, b in zip(starts, ends)])
    return wall_s, (ends - starts) * 1000.0


def clear_run_dir(out_dir: Path) -> None:
    """Remove what an earlier run left: TensorBoard reads a run directory once, and a stale trace
    beside a new one would be shown as a second worker."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in out_dir.iterdir():
        if path.is_file() and (path.name.endswith(trace.TRACE_SUFFIXES)
                               or path.name in (trace.SUMMARY_FILE, KEY_AVERAGES_FILE,
                                                CPROFILE_FILE)
                               or RANK_FILE.fullmatch(path.name)):
            path.unlink()


def profiled_steps(run: Run, step: Callable[[], None]) -> tuple[Path, np.ndarray]:
    """Run a few steps under torch.profiler; write the gzip trace and the operator table into
    run.out_dir (which measure() has emptied). Returns the trace's path and the recorded steps'
    times in ms (the profiler's own cost included: compare them with the timed steps)."""
    sort_key = "self_cuda_time_total" if run.is_cuda else "self_cpu_time_total"
    # The trace is written outside the run folder and moved in only once it is final: a running
    # TensorBoard reads a run folder once, and must not catch it before the rewrite below.
    staging = Path(tempfile.mkdtemp(prefix=f"{run.demo}_{run.variant}_"))
    worker = f"{run.demo}_{run.variant}" + (f"_rank{run.rank}" if run.distributed else "")
    write_trace = tensorboard_trace_handler(str(staging), worker_name=worker, use_gzip=True)

    def on_trace_ready(prof: profile) -> None:
        write_trace(prof)
        table = prof.key_averages().table(sort_by=sort_key, row_limit=KEY_AVERAGES_ROWS)
        (run.out_dir / f"key_averages{rank_suffix(run)}.txt").write_text(table + "\n")

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.is_cuda else [])
    experimental = all_threads_config(run) if run.profile_all_threads else None
    record_shapes = (run.demo in RECORD_SHAPES_DEMOS if run.record_shapes is None
                     else run.record_shapes)
    profile_memory = (not run.is_cuda or run.demo in PROFILE_MEMORY_DEMOS_CUDA
                      if run.profile_memory is None else run.profile_memory)
    try:
        with profile(activities=activities,
                     schedule=schedule(wait=PROFILE_WAIT_STEPS, warmup=PROFILE_WARMUP_STEPS,
                                       active=PROFILE_ACTIVE_STEPS, repeat=1),
                     on_trace_ready=on_trace_ready, record_shapes=record_shapes,
                     profile_memory=profile_memory, with_stack=run.with_stack,
                     experimental_config=experimental) as prof:
            _, step_ms = clocked_steps(run, step, PROFILED_STEPS, "profiling", after_step=prof.step)
        written = trace.trace_files(staging)
        if len(written) != 1:
            raise RuntimeError(f"expected one trace from the profiler, found {len(written)}")
        # TensorBoard's profiler plugin reads older category names: rename the few events it would
        # misread (common/README.md, "The trace rewrite for TensorBoard"); times, names and every
        # event stay as written.
        # The rewritten trace lands in the run folder atomically, under its final name.
        final_path = run.out_dir / written[0].name
        tensorboard_compat.rewrite_file(written[0], final_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    run.config.update(profiler_record_shapes=record_shapes,
                      profiler_profile_memory=profile_memory, profiler_with_stack=run.with_stack)
    return final_path, step_ms[-PROFILE_ACTIVE_STEPS:]


def all_threads_config(run: Run):
    """The profiler's experimental setting that records every thread's ops and regions
    (profile_all_threads), or None where this torch lacks it: then say what the trace misses."""
    try:
        return _ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        log(run, "note: this torch's profiler has no profile_all_threads: what the step's own "
                 "threads do (their record_function regions) is missing from the trace")
        return None


def require_gpu_kernels(run: Run, events: list[dict]) -> None:
    """A CUDA run whose trace holds no kernel would be read as a CPU trace: every GPU number and
    verdict gone, and the run 'fine'. Stop instead, with what to check."""
    if run.is_cuda and not trace_columns.has_gpu_kernels(events):
        clear_run_dir(run.out_dir)
        fail(f"the CUDA trace of {run.demo}/{run.variant} holds no GPU kernel events, so CUPTI "
             f"recorded no GPU activity; check that no other profiler is attached (Nsight "
             f"Systems/Compute, DCGM profiling), that the driver supports this torch's CUDA "
             f"{torch.version.cuda}, and that no CUDA graph was captured before the profiler "
             f"started; nothing was written")


def require_sync_free(run: Run, step: Callable[[], None]) -> int:
    """Run one step under torch.cuda.set_sync_debug_mode("error"): a variant that claims no
    host-device sync (config["sync_free"]) stops with one line naming the sync instead of
    passing by luck. PyTorch's check misses non-blocking copies from pageable memory. Returns
    the steps taken (1)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    except RuntimeError as error:
        clear_run_dir(run.out_dir)
        fail(f"{run.demo}/{run.variant} is meant to have no host-device sync, but its step made "
             f"one (torch.cuda.set_sync_debug_mode('error')): {str(error).splitlines()[0]}")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    device_sync(run)
    log(run, "checked: a step under torch.cuda.set_sync_debug_mode('error') made no sync")
    return 1


def write_cprofile(run: Run, profiler: cProfile.Profile) -> None:
    """The timed phase's cProfile statistics: the .prof beside the trace, the top CPROFILE_ROWS
    by cumulative time printed, and a note that samples/s includes cProfile's cost."""
    path = run.out_dir / CPROFILE_FILE.replace(".prof", f"{rank_suffix(run)}.prof")
    profiler.dump_stats(path)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(CPROFILE_ROWS)
    log(run, f"cProfile of the timed phase, top {CPROFILE_ROWS} by cumulative time "
             f"(all of it: {path}):")
    print(text.getvalue().strip(), flush=True)
    run.notes.append("the timed phase ran under cProfile (--cprofile): its samples/s includes "
                     "cProfile's cost per Python call; rerun without it for the speed")


def dynamo_frames_compiled() -> int:
    """Python frames torch.compile has compiled so far in this process (0 without torch.compile)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters
    return counters["frames"]["ok"]


def measure(run: Run, step: Callable[[], None]) -> dict:
    """Warm up, time, profile, summarise. `step` runs one training (or inference) step. On a GPU
    that runs out of memory: one line saying so, exit code 2, nothing left in the run folder."""
    if run.rank == 0:  # a run that fails half-way must not leave the last one's results
        clear_run_dir(run.out_dir)
    distributed.barrier()  # no rank writes before rank 0 has cleared the folder
    try:
        summary = measure_steps(run, step)
        distributed.leave()
        return summary
    except torch.cuda.OutOfMemoryError:
        clear_run_dir(run.out_dir)
        total_gib = torch.cuda.get_device_properties(run.device).total_memory / 2**30
        fail(f"out of GPU memory: {run.demo}/{run.variant} with the {run.preset_name} preset "
             f"(batch {run.batch_size}, {json.dumps(run.sizes)}) needs more than the "
             f"{total_gib:.0f} GiB of {run.device_name}; run it on a GPU with more memory, or "
             f"with --smoke (tiny sizes) to check that it runs")


def measure_steps(run: Run, step: Callable[[], None]) -> dict:
    log(run, f"{run.device.type} ({run.device_name}), torch {torch.__version__}, "
             f"preset {run.preset_name}, batch {run.batch_size}")
    if run.is_cuda:
        # Profiling CUDA graphs (torch.compile mode="reduce-overhead") can crash or lose the
        # replayed kernels unless the profiler was initialised before the first capture
        # (PyTorch issue 75504, Kineto issue 1165): this is PyTorch's own workaround. It is a
        # private function; should a torch release drop it, say so rather than crash.
        init_for_cuda_graphs = getattr(torch.profiler._utils, "_init_for_cuda_graphs", None)
        if init_for_cuda_graphs is None:
            log(run, "note: this torch has no torch.profiler._utils._init_for_cuda_graphs; a CUDA "
                     "graph's kernels may be missing from the trace")
        else:
            init_for_cuda_graphs()
        # What FP32 math ran in, for every pair (compare.precision labels it with the trace).
        for setting, allowed in tf32_in_force().items():
            run.config.setdefault(setting, allowed)
    if run.distributed:
        log(run, f"{run.world_size} ranks: {run.distributed['mode']}")
    log(run, f"warm-up: {run.preset.warmup_steps} steps")
    warmup_started = time.perf_counter()
    step()  # the first step pays the one-time costs: torch.compile, cuDNN autotuning, allocations
    device_sync(run)
    first_step_s = time.perf_counter() - warmup_started
    checked = require_sync_free(run, step) if run.config.get("sync_free") and run.is_cuda else 0
    clocked_steps(run, step, max(0, run.preset.warmup_steps - 1 - checked), "warm-up")
    warmup_s = time.perf_counter() - warmup_started
    log(run, f"warm-up took {warmup_s:.2f} s, the first step {first_step_s:.2f} s of it")
    if run.config.get("torch_compile"):
        compiled_in_warmup = dynamo_frames_compiled()
    if run.is_cuda:
        torch.cuda.reset_peak_memory_stats(run.device)
    log(run, f"timed: {run.steps} steps without the profiler")
    data_wait_before_s = run.data_wait_s
    tokens_before = (run.real_tokens, run.padded_tokens)
    requests_before = run.requests.mark() if run.requests else None
    profiler = cProfile.Profile() if run.cprofile else None
    if profiler:  # not in the profiled phase: cProfile and the profiler's Python tracer conflict
        profiler.enable()
    wall_s, step_ms = clocked_steps(run, step, run.steps, "timed")
    if profiler:
        profiler.disable()
        write_cprofile(run, profiler)
    tokens_per_s = padding_pct = None
    if run.real_tokens is not None:  # over the timed steps, like samples/s
        real, padded = run.real_tokens - tokens_before[0], run.padded_tokens - tokens_before[1]
        tokens_per_s, padding_pct = real / wall_s, 100.0 * (1 - real / padded)
    data_wait_pct = (None if run.data_wait_s is None
                     else 100.0 * (run.data_wait_s - data_wait_before_s) / wall_s)
    inference = (inference_numbers(run.requests, requests_before, wall_s)
                 if run.requests else {"unit": "sample"})
    log(run, f"profiling: {PROFILED_STEPS} steps ({PROFILE_ACTIVE_STEPS} recorded)")
    trace_path, profiled_ms = profiled_steps(run, step)
    if run.config.get("torch_compile"):  # a recompile in the measured steps would be timed
        run.extra["dynamo_frames_compiled"] = {
            "warmup": compiled_in_warmup,
            "timed_and_profiled": dynamo_frames_compiled() - compiled_in_warmup}
    events = trace.load_trace(trace_path)["traceEvents"]
    require_gpu_kernels(run, events)
    if run.is_cuda:
        peak_mb = torch.cuda.max_memory_allocated(run.device) / trace.BYTES_PER_MB
        peak_source = "torch.cuda.max_memory_allocated over the timed and profiled steps"
    else:
        peak_mb = trace.peak_allocated_mb(events, trace.CPU_DEVICE_TYPE)
        peak_source = ("profiler [memory] events: CPU tensor memory allocated during the "
                       "recorded steps (what existed before the profiler started is not counted)")
        if peak_mb is None and run.profile_all_threads:  # measured with torch 2.14
            run.notes.append("the profiler recorded every thread (profile_all_threads), and in "
                             "that mode it writes no memory events: no peak memory on a CPU")
    step_ms_p50 = float(np.percentile(step_ms, 50))
    profiled_step_ms_p50 = float(np.percentile(profiled_ms, 50))
    overhead_ratio = profiled_step_ms_p50 / step_ms_p50
    summary = {
        "demo": run.demo, "variant": run.variant, "device": run.device.type,
        "device_name": run.device_name, "torch_version": torch.__version__,
        "preset": run.preset_name, "batch_size": run.batch_size, "steps": run.steps,
        "warmup_steps": run.preset.warmup_steps, "seed": run.seed,
        "main_process_threads": torch.get_num_threads(),
        # Every rank's samples, every micro-batch's: ranks run in lockstep (each step ends in a
        # collective), and a step of micro-batches trains all of them.
        "samples_per_s": (run.world_size * run.steps * run.batch_size
                          * run.config.get("micro_batches", 1) / wall_s),
        "rank": run.rank, "world_size": run.world_size, "distributed": run.distributed,
        "tokens_per_s": tokens_per_s, "padding_pct": padding_pct,  # null: no token counts
        "step_ms_mean": float(step_ms.mean()),
        "step_ms_p50": step_ms_p50,
        "step_ms_p95": float(np.percentile(step_ms, 95)),
        "timed_wall_s": wall_s,
        "data_wait_pct": data_wait_pct,
        "profiled_step_ms_p50": profiled_step_ms_p50,
        "profiler_overhead_ratio": overhead_ratio,
        "first_step_s": first_step_s, "warmup_s": warmup_s,
        **flops_achieved(run, step_ms_p50),
        "peak_memory_mb": peak_mb, "peak_memory_source": peak_source,
        "config": run.config, "sizes": run.sizes, "trace_file": trace_path.name,
        "extra": run.extra, "notes": run.notes,
        **inference,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    summary_name = trace.SUMMARY_FILE.replace(".json", f"{rank_suffix(run)}.json")
    (run.out_dir / summary_name).write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(run, summary, trace_path)
    if overhead_ratio > trace.PROFILER_OVERHEAD_WARN_RATIO:  # compare and the report say it too
        log(run, f"warning: the recorded steps ran {overhead_ratio:.2f}x the timed p50 (the "
                 f"profiler's own cost per operator): the trace exaggerates CPU time; for speed, "
                 f"trust {speed_words(summary)}")
    return summary


def speed_words(summary: dict) -> str:
    """What a run's speed is read from: generated tokens/s, requests/s, real tokens/s or
    samples/s."""
    if summary["unit"] == "request":
        return ("generated tokens/s" if summary["rated_by"]["throughput"] == "tokens_per_s"
                else "requests/s")
    return "real tokens/s" if summary["tokens_per_s"] is not None else "samples/s"


# Latency percentiles of an inference run: the median request and the tail (p95, p99, and the
# slowest), as serving benchmarks report them (MLPerf Inference's server scenario bounds p99).
LATENCY_PERCENTILES = (50, 95, 99)
TOKEN_PERCENTILES = (50, 99)  # time to first token and per token: the median and the tail


def percentiles(values: Sequence[float], which: Sequence[int]) -> dict[str, float]:
    array = np.asarray(values, dtype=float)
    return {**{f"p{q}": float(np.percentile(array, q)) for q in which}, "max": float(array.max())}


def inference_numbers(requests: Requests, before: tuple[int, int, int, int],
                      wall_s: float) -> dict:
    """The timed phase's requests: requests/s and latency percentiles; for generation also
    generated tokens/s, time to first token and time per later token. `rated_by` names what the
    pair is judged by: tokens/s and per-token time for generation, requests/s and latency else."""
    latency = requests.latency_ms[before[0]:]
    result = {"unit": "request", "requests_per_s": len(latency) / wall_s,
              "latency_ms": percentiles(latency, LATENCY_PERCENTILES),
              "rated_by": {"throughput": "requests_per_s", "latency": "latency_ms"}}
    first = requests.first_token_ms[before[1]:]
    if first:
        result.update(tokens_per_s=(requests.tokens - before[3]) / wall_s,
                      time_to_first_token_ms=percentiles(first, TOKEN_PERCENTILES),
                      per_token_ms=percentiles(requests.per_token_ms[before[2]:],
                                               TOKEN_PERCENTILES),
                      rated_by={"throughput": "tokens_per_s", "latency": "per_token_ms"})
    return result


# A name or variant becomes a folder under `out`: letters, digits, "_", "-" and "." only, so
# that it can neither climb out of `out` ("..", "/") nor clash with the shell.
RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def profile_loop(step: Callable[[], None], *, name: str, variant: str, batch_size: int,
            device: str | torch.device = "cpu", steps: int = 20, warmup_steps: int = 5,
            out: Path | str = "traces", record_shapes: bool = True,
            profile_memory: bool | None = None, with_stack: bool = False) -> dict:
    """Measure your own training (or inference) step the way the demos are measured, and write
    the same files, so that common.analyze, common.compare and the report read them:
    `warmup_steps` untimed steps; `steps` timed steps without the profiler (device synchronised,
    CUDA events on a GPU) -> samples_per_s from `batch_size`, step-time percentiles; then a few
    profiled steps (schedule: wait 1, warm-up 1, record 3) -> a gzip trace, key_averages.txt and
    summary.json in <out>/<name>/<variant>/ (`out` relative to where you stand), which is
    emptied of an earlier run's files first.

    `step` runs one whole step (forward, backward, optimizer) and must run on `device`.
    `record_shapes` (on by default: the batch and attention verdicts read shapes) and
    `profile_memory` (default: on a CPU only, where the peak comes from it) cost CPU time per
    operator. `with_stack` records Python frames (the analyzer's hot frames). One process: in a
    job of several ranks, call it on one rank with its own `name`. Returns the summary."""
    device = torch.device(device)
    for label, value in (("name", name), ("variant", variant)):
        if not isinstance(value, str) or not RUN_NAME.fullmatch(value):
            raise ValueError(f"profile_loop(): {label}={value!r} must be a folder name (letters, "
                             f"digits, _ - .; not starting with . or -)")
    for label, value in (("batch_size", batch_size), ("steps", steps),
                         ("warmup_steps", warmup_steps)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"profile_loop(): {label}={value!r} must be a whole number >= 1")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("profile_loop(): device cuda, but PyTorch sees no CUDA GPU here "
                         "(torch.cuda.is_available() is False)")
    if device.type == "cpu":
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_LOG_LEVEL_CPU)
    run = Run(demo=name, variant=variant, device=device, device_name=device_name(device),
              preset_name="own", preset=presets.Preset(batch_size=batch_size, steps=steps,
                                                       warmup_steps=warmup_steps),
              steps=steps, seed=torch.initial_seed(), out_dir=Path(out) / name / variant,
              record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack)
    clear_run_dir(run.out_dir)  # a run that fails half-way must not leave the last one's results
    return measure_steps(run, step)


def print_summary(run: Run, summary: dict, trace_path: Path) -> None:
    peak = summary["peak_memory_mb"]
    wait = summary["data_wait_pct"]
    unit = "requests" if summary["unit"] == "request" else "samples"
    log(run, f"{summary['samples_per_s']:.1f} {unit}/s | step p50 {summary['step_ms_p50']:.1f} ms, "
             f"p95 {summary['step_ms_p95']:.1f} ms | peak memory "
             f"{'n/a' if peak is None else f'{peak:.0f} MB'}"
             f"{'' if wait is None else f' | waiting for data {wait:.1f} % of the time'}")
    if summary.get("achieved_tflops") is not None:
        peak = summary["bf16_peak_tflops"]
        log(run, f"{summary['achieved_tflops']:.4g} TFLOPS of model math at the step p50"
                 + ("" if peak is None else f", {summary['bf16_peak_pct']:.1f} % of the GPU's "
                                            f"dense BF16 peak ({peak:.0f} TFLOPS)"))
    if summary["unit"] == "request":
        latency = summary["latency_ms"]
        log(run, f"request latency (host clock) p50 {latency['p50']:.1f} ms, "
                 f"p99 {latency['p99']:.1f} ms")
        if "per_token_ms" in summary:
            log(run, f"{summary['tokens_per_s']:.0f} generated tokens/s | per token p50 "
                     f"{summary['per_token_ms']['p50']:.2f} ms, p99 "
                     f"{summary['per_token_ms']['p99']:.2f} ms | first token p50 "
                     f"{summary['time_to_first_token_ms']['p50']:.1f} ms")
    elif summary["tokens_per_s"] is not None:
        log(run, f"{summary['tokens_per_s']:.0f} real tokens/s | padding "
                 f"{summary['padding_pct']:.1f} % of the tokens computed")
    log(run, f"config: {json.dumps(summary['config'])}")
    for note in summary["notes"]:
        log(run, f"note: {note}")
    log(run, f"trace: {trace_path}")
