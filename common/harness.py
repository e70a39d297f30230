"""The profiling harness every demo shares: the flags, setup(), and the loops.

setup() parses the common flags, picks the device and its size preset and returns a Run.
train() runs a training loop through measure(), which does, in order:
  warm-up -> a timed phase without the profiler (wall clock, device synchronised) -> a short
  profiled phase that writes a TensorBoard trace -> summary.json and key_averages.txt.
train_on_device() does the same for batches already on the device (optionally under autocast);
generate() and serve_texts() for inference, where the unit is a request. A demo whose lesson is
the loop itself writes its own step and calls measure(). profile_loop() does it for your own
step, outside the demos (README, "Your own script").

The rooms below this one: runs.py (the Run, the profiler's schedule, the files a run writes),
devices.py (device facts: CPU flags, BF16 peaks, TF32, the compile toolchain), profiling.py
(measure() and profile_loop()). What a demo calls from them it calls as harness.<name>
(imported here `as` itself: measure, profile_loop, bf16_where_fast, full_fp32_matmuls,
require_compile_toolchain).
"""
from __future__ import annotations

import argparse
import itertools
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch.profiler import record_function

from common import distributed, presets, trace
from common.devices import (
    KINETO_LOG_LEVEL_CPU,
    MB_PER_GB,
    cap_cuda_memory,
    cpu_bf16_matrix_units,
    device_name,
    note_cpu_bf16,
    require_cuda_graphs,
    start_compile_log,
    tf32_in_force,
)
from common.devices import bf16_where_fast as bf16_where_fast
from common.devices import full_fp32_matmuls as full_fp32_matmuls
from common.devices import require_compile_toolchain as require_compile_toolchain
from common.profiling import CPROFILE_ROWS, measure, stop_on_ctrl_c, stop_on_out_of_memory
from common.profiling import profile_loop as profile_loop
from common.runs import (
    CPROFILE_FILE,
    KEY_AVERAGES_FILE,
    MEMORY_SNAPSHOT_DEMOS_CUDA,
    MEMORY_SNAPSHOT_FILE,
    Requests,
    Run,
    fail,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "traces"
# Token id 0 is padding in every text batch (padding_waste's random texts use 1..vocab-1;
# tokenizer_bound's tokenizers number their [PAD] first).
PAD_TOKEN_ID = 0
# What the fragmentation pair says on a CPU, where it cannot show its effect.
NO_CACHING_ALLOCATOR = ("a CPU has no caching allocator to fragment: reserved memory and "
                        "expandable_segments exist only on CUDA, so bad and fixed run alike here")
# Demos whose scripts run as several processes (common/distributed.py).
DISTRIBUTED_DEMOS = frozenset({"ddp_no_sync"})


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}") from None
    if not value > 0:  # also NaN
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
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
    parser.add_argument("--recorded-steps", type=positive_int, default=None, metavar="N",
                        help="steps the profiler records, exactly (default: the preset's, 3 for "
                             "most demos; one round of the DataLoader's workers, if it has more, "
                             "where that many timed steps in a row waited more than 10 points "
                             "off the data wait: workers deliver in bursts): more catch more, at "
                             "a larger trace")
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
    parser.add_argument("--compile-log", type=Path, default=None, metavar="DIR",
                        help="write torch.compile's structured log (TORCH_TRACE) to DIR and, "
                             "where tlparse is installed (pip install tlparse), its HTML report "
                             "of every compile to DIR/tlparse/index.html: guards, graph breaks "
                             "and recompiles with their reasons; the script restarts itself "
                             "once to set TORCH_TRACE")
    parser.add_argument("--memory-snapshot", action="store_true",
                        help=f"CUDA only: record the caching allocator's history over the "
                             f"profiled steps (torch.cuda.memory._record_memory_history) and write "
                             f"{MEMORY_SNAPSHOT_FILE} beside the trace; on by default for "
                             f"{', '.join(sorted(MEMORY_SNAPSHOT_DEMOS_CUDA))}")
    parser.add_argument("--memory-budget-gb", type=positive_float, default=None, metavar="GB",
                        help="the memory the run may use, in GB (10^9 bytes): on a CUDA GPU the "
                             "caching allocator is capped at it, and a run that needs more stops "
                             "with one line; on a CPU the run checks its peak resident memory "
                             "against it (Python and PyTorch included) and says whether it fits "
                             "(default: the preset's, which memory_ladder has, or a smaller "
                             "GPU's whole memory; else no budget)")
    return parser


def pick_device(requested: str, parser: argparse.ArgumentParser) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: PyTorch sees no CUDA GPU here "
                     "(torch.cuda.is_available() is False); use --device cpu or auto")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def setup(demo: str, variant: str, argv: list[str] | None = None, *,
          batch_size: int | None = None) -> Run:
    """Parse the flags every demo takes, seed everything and pick the device and its preset.
    `batch_size`, when given, replaces the preset's (a demo whose lesson is the batch size)."""
    parser = build_parser(demo, variant)
    flags = parser.parse_args(argv)
    stop_on_ctrl_c(demo, variant)  # from here: torchrun's launcher too
    device = pick_device(flags.device, parser)
    compile_log = (start_compile_log(flags.compile_log, argv is not None)
                   if flags.compile_log else None)
    if flags.memory_snapshot and device.type != "cuda":
        fail(f"--memory-snapshot: snapshots record the CUDA caching allocator and need a CUDA "
             f"GPU (this run is on {device.type}); on a CPU, python -m common.analyze reads "
             f"memory from the trace")
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
                               or cpu_bf16_matrix_units())
    preset = presets.PRESETS[demo][name]
    if batch_size is not None:
        preset = replace(preset, batch_size=batch_size)
    if flags.recorded_steps is not None:
        preset = replace(preset, recorded_steps=flags.recorded_steps)
    budget_gb = flags.memory_budget_gb or preset.memory_budget_gb  # the flag, else the preset's
    budget_mb = None if budget_gb is None else budget_gb * MB_PER_GB
    if budget_mb is not None and device.type == "cuda":
        budget_mb = cap_cuda_memory(device, budget_mb, given=flags.memory_budget_gb is not None)
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
    run = Run(demo=demo, variant=variant, device=device, device_name=device_name(device),
              preset_name=name, preset=preset, steps=flags.steps or preset.steps,
              seed=seed, out_dir=Path(flags.out) / demo / variant, rank=rank,
              world_size=world_size, distributed=dist_info, with_stack=flags.with_stack,
              cprofile=flags.cprofile, compile_log=compile_log,
              memory_snapshot=device.type == "cuda" and (flags.memory_snapshot
                                                         or demo in MEMORY_SNAPSHOT_DEMOS_CUDA),
              memory_budget_mb=budget_mb,
              recorded_steps_given=flags.recorded_steps is not None)
    stop_on_out_of_memory(run)
    return run


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
                  autocast_dtype: torch.dtype | None = None,
                  step_args: Callable[[], tuple] = tuple,
                  micro_batches: int = 1,
                  to_device: Callable[[tuple], tuple] = lambda batch: batch
                  ) -> Callable[[], None]:
    """One training step in the four regions every trace shows: data, forward, backward,
    optimizer. With `autocast_dtype`, the forward pass and the loss run under torch.autocast.
    `step_args()` is called once a step, in the data region; what it returns follows the inputs
    into the forward call: model(inputs, *step_args()). `to_device(batch)` puts the batch where
    the model is, in the data region too but outside run.data_waits_s: a blocking copy to a GPU
    waits for the step before's kernels, which is no wait for data. With `micro_batches` > 1
    (gradient accumulation; tensor inputs), the batch runs forward and backward in that many
    micro-batches, each loss divided by their number, and the optimizer steps once: the whole
    batch's gradients, with the activations of one micro-batch at a time."""
    model.train()

    def precision():
        if autocast_dtype is None:
            return nullcontext()
        return torch.autocast(run.device.type, dtype=autocast_dtype)

    run.data_waits_s = []

    def step() -> None:
        with record_function("data"):
            fetch_started = time.perf_counter()
            batch = next_batch()
            args = step_args()
            run.data_waits_s.append(time.perf_counter() - fetch_started)
            inputs, targets = to_device(batch)
        parts = ([(inputs, targets)] if micro_batches == 1  # inputs of any kind (a tuple too)
                 else zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)))
        for part, part_targets in parts:
            with record_function("forward"), precision():
                loss = loss_fn(model(part, *args), part_targets)
                if micro_batches > 1:  # the mean over the whole batch, a micro-batch at a time
                    loss = loss / micro_batches
            with record_function("backward"):  # outside autocast: follows the forward's dtypes
                loss.backward()  # adds to the gradients of the micro-batches before
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def train(run: Run, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          loader: Iterable, *, loss_fn: Callable = torch.nn.functional.cross_entropy,
          autocast_dtype: torch.dtype | None = None) -> dict:
    """Train on batches from `loader` (a DataLoader, or a wrapper with its settings, such as
    data.DevicePrefetcher), measure and profile it; with `autocast_dtype`, as train_on_device.
    Returns the summary."""
    batches = forever(loader)

    def to_device(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = batch
        # A plain copy: the CPU waits for it, in the compute stream, behind the step before's
        # kernels. A batch already on the device (a prefetcher put it there) is returned as it is.
        return inputs.to(run.device), targets.to(run.device)

    run.config.update(describe_loader(loader), autocast_dtype=autocast_name(run, autocast_dtype))
    return measure(run, training_step(run, model, optimizer, lambda: next(batches), loss_fn,
                                      autocast_dtype, to_device=to_device))


def train_on_device(run: Run, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *,
                    autocast_dtype: torch.dtype | None = None,
                    loss_fn: Callable = torch.nn.functional.cross_entropy,
                    token_counts: list[tuple[int, int]] | None = None,
                    step_args: Callable[[], tuple] = tuple, micro_batches: int = 1) -> dict:
    """Train on (inputs, targets) batches that already sit on the device, taken in turn, so the
    measurement holds the model's step and nothing of data loading. With `autocast_dtype`, the
    forward pass and the loss run under torch.autocast in that dtype. `token_counts`: (real,
    padded) tokens of each batch, counted on the host as the batches are taken, so the summary
    gains tokens_per_s (real tokens) and padding_pct. `step_args` and `micro_batches`
    (gradient accumulation; run.batch_size stays the whole batch): see training_step. Returns
    the summary."""
    cycle = itertools.cycle(batches)
    if token_counts is not None:
        cycle = counting_tokens(run, cycle, itertools.cycle(token_counts))
    run.config.update(data="staged on the device", staged_batches=len(batches),
                      autocast_dtype=autocast_name(run, autocast_dtype), **tf32_in_force())
    if micro_batches > 1:  # batch_size stays the whole batch (ddp_no_sync's is one micro-batch)
        run.config["accumulation_micro_batches"] = micro_batches
    return measure(run, training_step(run, model, optimizer, lambda: next(cycle), loss_fn,
                                      autocast_dtype, step_args, micro_batches))


def autocast_name(run: Run, autocast_dtype: torch.dtype | None) -> str | None:
    """The autocast dtype's name for run.config ("bfloat16"; None without autocast); BF16 on a
    CPU adds the note of what this CPU can show of it."""
    if autocast_dtype == torch.bfloat16 and not run.is_cuda:
        note_cpu_bf16(run)
    return None if autocast_dtype is None else str(autocast_dtype).removeprefix("torch.")


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
