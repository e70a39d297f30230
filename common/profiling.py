"""Measuring a step: warm-up, a timed phase without the profiler (wall clock, device
synchronised), a short profiled phase that writes the TensorBoard trace and the operator table,
then summary.json and a short summary on stdout. measure() for a demo, profile_loop() for your
own step (README, "Your own script")."""
from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
from torch.profiler import (
    ProfilerActivity,
    _ExperimentalConfig,
    profile,
    schedule,
    tensorboard_trace_handler,
)

from common import distributed, presets, stopping, tensorboard_compat, trace, trace_columns
from common.devices import (
    KINETO_LOG_LEVEL_CPU,
    MB_PER_GB,
    device_name,
    dynamo_frames_compiled,
    dynamo_report,
    finish_compile_log,
    flops_achieved,
    memory_budget_check,
    peak_resident_mb,
    tf32_in_force,
)
from common.runs import (
    CPROFILE_FILE,
    MEMORY_HISTORY_MAX_ENTRIES,
    MEMORY_SNAPSHOT_FILE,
    PROFILE_ACTIVE_STEPS,
    PROFILE_WAIT_STEPS,
    PROFILE_WARMUP_STEPS,
    Requests,
    Run,
    clear_run_dir,
    device_sync,
    fail,
    log,
    rank_suffix,
)

PROGRESS_EVERY_S = 5.0  # seconds between progress lines in a long phase
KEY_AVERAGES_ROWS = 25  # rows of the operator table in key_averages.txt
CPROFILE_ROWS = 10  # functions printed by cumulative time
# What each demo's lesson reads from its trace beyond times. record_shapes (operator input shapes
# and dtypes) and profile_memory (every allocation) add CPU time to each operator, which makes a
# launch-bound step look slower than it is, so each is on only where a demo needs it.
RECORD_SHAPES_DEMOS = frozenset({"small_batch", "mixed_precision", "naive_attention",
                                 "padding_waste", "ddp_no_sync"})
# (batch dims; BF16 input types; s x s scores; sequence lengths; the collectives' message sizes,
# which TensorBoard's Distributed view reads)
# On a GPU only: the ladder, whose batch rung the analyzer names from the batch in the shapes
# (small_batch, not launch_overhead: their timing is the same). On a CPU no rule reads them.
RECORD_SHAPES_DEMOS_CUDA = frozenset({"ladder"})
# On a GPU the peak comes from torch.cuda.max_memory_allocated; the trace's memory events are the
# lesson only where memory is. On a CPU every demo reads its peak from them.
PROFILE_MEMORY_DEMOS_CUDA = frozenset({"activation_checkpointing", "naive_attention",
                                       "memory_leak", "fragmentation", "memory_ladder"})


def records_shapes(demo: str, is_cuda: bool) -> bool:
    """Whether `demo` records operators' input shapes by default on this device."""
    return demo in RECORD_SHAPES_DEMOS or (is_cuda and demo in RECORD_SHAPES_DEMOS_CUDA)


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


# SIGTERM (a kill, torchrun stopping its ranks) unwinds the recording as Ctrl-C does: `finally`
# removes the staging folder, then the process ends as SIGTERM ends it.
@stopping.sigterm_raises()
def profiled_steps(run: Run, step: Callable[[], None]) -> tuple[Path, np.ndarray, dict | None]:
    """Run a few steps under torch.profiler; write the gzip trace and the operator table into
    run.out_dir (which measure() has emptied), and on a GPU with run.memory_snapshot the
    allocator's history. Returns the trace's path, the recorded steps' times in ms (the
    profiler's own cost included: compare them with the timed steps) and, on a GPU, the memory
    allocated and reserved at each recorded step's end (None on a CPU)."""
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
    record_shapes = (records_shapes(run.demo, run.is_cuda) if run.record_shapes is None
                     else run.record_shapes)
    profile_memory = (not run.is_cuda or run.demo in PROFILE_MEMORY_DEMOS_CUDA
                      if run.profile_memory is None else run.profile_memory)
    # On a GPU the allocator's own counters at each step's end: they read the host's view (a
    # tensor counts from the call that allocates it), cost no sync, and need no profile_memory.
    memory_by_step = {"allocated_mb": [], "reserved_mb": []} if run.is_cuda else None

    def after_step() -> None:
        if memory_by_step is not None:
            memory_by_step["allocated_mb"].append(
                torch.cuda.memory_allocated(run.device) / trace.BYTES_PER_MB)
            memory_by_step["reserved_mb"].append(
                torch.cuda.memory_reserved(run.device) / trace.BYTES_PER_MB)
        prof.step()

    if run.memory_snapshot:
        torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_MAX_ENTRIES)
    try:
        with profile(activities=activities,
                     schedule=schedule(wait=PROFILE_WAIT_STEPS, warmup=PROFILE_WARMUP_STEPS,
                                       active=run.recorded_steps, repeat=1),
                     on_trace_ready=on_trace_ready, record_shapes=record_shapes,
                     profile_memory=profile_memory, with_stack=run.with_stack,
                     experimental_config=experimental) as prof:
            _, step_ms = clocked_steps(run, step, run.profiled_steps, "profiling",
                                        after_step=after_step)
        if run.memory_snapshot:
            write_memory_snapshot(run)
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
        if run.memory_snapshot:
            torch.cuda.memory._record_memory_history(enabled=None)  # stop recording
    run.config.update(profiler_record_shapes=record_shapes,
                      profiler_profile_memory=profile_memory, profiler_with_stack=run.with_stack)
    if memory_by_step is not None:
        memory_by_step = {key: values[-run.recorded_steps:]
                          for key, values in memory_by_step.items()}
    return final_path, step_ms[-run.recorded_steps:], memory_by_step


def write_memory_snapshot(run: Run) -> None:
    """The allocator's history over the profiled steps, beside the trace, and the command that
    draws it (PyTorch's memory viewer: every allocation as a band over time, with its stack)."""
    path = run.out_dir / MEMORY_SNAPSHOT_FILE.replace(".pickle", f"{rank_suffix(run)}.pickle")
    torch.cuda.memory._dump_snapshot(str(path))
    html = path.with_suffix(".html")
    log(run, f"memory snapshot: {path}; draw it with: python -m torch.cuda._memory_viz trace_plot "
             f"{path} -o {html} (the page loads its viewer script from the internet), or drop "
             f"the file on https://pytorch.org/memory_viz")
    run.extra["memory_snapshot"] = path.name


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
        out_of_memory(run)


def out_of_memory(run: Run) -> NoReturn:
    """Stop a run that ran out of GPU memory, or over its --memory-budget-gb, in one line with
    exit code 2, leaving nothing in its run folder but, over a budget, the record of it
    (trace.OUT_OF_MEMORY_FILE): that it did not fit is the run's result."""
    clear_run_dir(run.out_dir)
    what = (f"{run.demo}/{run.variant} with the {run.preset_name} preset (batch "
            f"{run.batch_size}, {json.dumps(run.sizes)})")
    if run.memory_budget_mb is not None:
        error = (f"over the memory budget: {what} needs more than --memory-budget-gb "
                 f"{run.memory_budget_mb / MB_PER_GB:g} on {run.device_name}")
        if run.rank == 0:
            record = {"demo": run.demo, "variant": run.variant, "device": run.device.type,
                      "device_name": run.device_name, "torch_version": torch.__version__,
                      "preset": run.preset_name, "batch_size": run.batch_size,
                      "sizes": run.sizes, "config": run.config, "error": error,
                      "memory_budget": {"budget_mb": run.memory_budget_mb, "peak_mb": None,
                                        "peak_of": "out of memory at the cap", "fits": False},
                      "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            (run.out_dir / trace.OUT_OF_MEMORY_FILE).write_text(json.dumps(record, indent=2)
                                                               + "\n")
        fail(error)
    total_gib = torch.cuda.get_device_properties(run.device).total_memory / 2**30
    fail(f"out of GPU memory: {what} needs more than the {total_gib:.0f} GiB of "
         f"{run.device_name}; run it on a GPU with more memory, or with --smoke (tiny sizes) to "
         f"check that it runs")


def stop_on_out_of_memory(run: Run) -> None:
    """Out of memory before the steps (a model whose weights alone exceed the budget) is also one
    line and exit 2, not a traceback: a hook on uncaught exceptions, for this one kind."""
    chained = sys.excepthook

    def hook(kind, value, traceback) -> None:
        if issubclass(kind, torch.cuda.OutOfMemoryError):
            try:
                out_of_memory(run)
            except SystemExit as stop:  # an exception hook cannot raise: leave with its code
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(stop.code)
        chained(kind, value, traceback)

    sys.excepthook = hook


def steps_words(count: int) -> str:
    """"1 step", "40 steps": the progress lines' counts."""
    return f"{count} step" + ("" if count == 1 else "s")


def stop_on_ctrl_c(demo: str, variant: str) -> None:
    """Ctrl-C ends a run with one line, not the traceback of wherever its step was (30 lines into
    autograd, in a backward pass), or of torchrun's launcher once it has stopped the ranks. After
    the hook Python still ends the process as SIGINT ends it (exit status 130 in a shell), so
    that a shell loop around it stops too."""
    chained = sys.excepthook

    def hook(kind, value, traceback) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            chained(kind, value, traceback)
        elif os.environ.get("RANK", "0") == "0":  # one line for a job's ranks (torchrun's RANK)
            print(f"[{demo}/{variant}] stopped (Ctrl-C)", file=sys.stderr, flush=True)

    sys.excepthook = hook


def window_wait_shares_pct(step_ms: np.ndarray, wait_ms: np.ndarray, window: int) -> np.ndarray:
    """The data wait share of each run of `window` consecutive steps: their waits over their
    time (the steps' own clock: CUDA events on a GPU), in %; NaN for a run of no time; empty
    with fewer steps than the window, or a wait list of another length."""
    if window < 1 or len(step_ms) < window or len(wait_ms) != len(step_ms):
        return np.empty(0)
    time_ms = np.concatenate(([0.0], np.cumsum(step_ms)))
    waited_ms = np.concatenate(([0.0], np.cumsum(wait_ms)))
    spans_ms = time_ms[window:] - time_ms[:-window]
    return np.divide(100 * (waited_ms[window:] - waited_ms[:-window]), spans_ms,
                     out=np.full_like(spans_ms, np.nan), where=spans_ms > 0)


def loader_round_steps(recorded: int, workers: int, step_ms: np.ndarray, wait_ms: np.ndarray,
                       data_wait_pct: float) -> int:
    """Steps to record so that the trace's DataLoader share stands for the timed data wait
    (`data_wait_pct`; `step_ms`, `wait_ms`: each timed step's time and its wait for a batch).
    Workers that fall behind the step deliver in rounds: they start together and finish a batch
    each at about the same time, so the step waits once every `workers` batches, and fewer steps
    than that hold no wait or a round's whole wait. Where the share of some `recorded`
    consecutive timed steps stands more than trace.DATA_WAIT_GAP_POINTS (the gap at which
    compare warns) off the timed wait: one round, `workers` steps; else `recorded`."""
    shares = window_wait_shares_pct(step_ms, wait_ms, recorded)
    if workers <= recorded or np.isnan(shares).all():  # all() of none is True
        return recorded
    gap_points = np.nanmax(np.abs(shares - data_wait_pct))
    return workers if gap_points > trace.DATA_WAIT_GAP_POINTS else recorded


def record_a_loader_round(run: Run, step_ms: np.ndarray, wait_ms: np.ndarray | None,
                          data_wait_pct: float | None) -> None:
    """After the timed steps: where a few of them misread their data wait (loader_round_steps),
    the profiler records one round of the DataLoader's workers instead, and a note says why.
    Not for --recorded-steps (kept as given), more workers than the images last for
    (runs.Run.loader_steps), or ranks (each would decide alone, and a collective waits for all)."""
    workers = run.config.get("num_workers") or 0
    if (run.recorded_steps_given or wait_ms is None or data_wait_pct is None or run.distributed
            or not 0 < workers <= presets.MAX_LOADER_WORKERS):
        return
    steps = loader_round_steps(run.recorded_steps, workers, step_ms, wait_ms, data_wait_pct)
    if steps == run.recorded_steps:
        return
    shares = window_wait_shares_pct(step_ms, wait_ms, run.recorded_steps)
    run.notes.append(f"the timed steps waited for data {data_wait_pct:.1f} % of the time, "
                     f"{run.recorded_steps} of them in a row from {np.nanmin(shares):.1f} to "
                     f"{np.nanmax(shares):.1f} % (more than {trace.DATA_WAIT_GAP_POINTS:.0f} "
                     f"points off): the profiler records {steps} steps, a round of the {workers} "
                     f"DataLoader workers, whose batches come in bursts")
    run.preset = replace(run.preset, recorded_steps=steps)


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
    log(run, f"warm-up: {steps_words(run.preset.warmup_steps)}")
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
    log(run, f"timed: {steps_words(run.steps)} without the profiler")
    waits_before = None if run.data_waits_s is None else len(run.data_waits_s)
    tokens_before = (run.real_tokens, run.padded_tokens)
    requests_before = run.requests.mark() if run.requests else None
    profiler = cProfile.Profile() if run.cprofile else None
    if profiler:  # not in the profiled phase: cProfile and the profiler's Python tracer conflict
        profiler.enable()
    wall_s, step_ms = clocked_steps(run, step, run.steps, "timed")
    # A CPU's peak for the budget, before the profiler's phase adds its events and our reading
    # of its trace to the process
    resident_mb = None if run.is_cuda or run.memory_budget_mb is None else peak_resident_mb()
    if profiler:
        profiler.disable()
        write_cprofile(run, profiler)
    tokens_per_s = padding_pct = None
    if run.real_tokens is not None:  # over the timed steps, like samples/s
        real, padded = run.real_tokens - tokens_before[0], run.padded_tokens - tokens_before[1]
        tokens_per_s, padding_pct = real / wall_s, 100.0 * (1 - real / padded)
    wait_ms = (None if waits_before is None  # each timed step's
               else 1000 * np.asarray(run.data_waits_s[waits_before:], dtype=float))
    data_wait_pct = None if wait_ms is None else 100.0 * wait_ms.sum() / 1000 / wall_s
    inference = (inference_numbers(run.requests, requests_before, wall_s)
                 if run.requests else {"unit": "sample"})
    record_a_loader_round(run, step_ms, wait_ms, data_wait_pct)
    log(run, f"profiling: {steps_words(run.profiled_steps)} ({run.recorded_steps} recorded)")
    trace_path, profiled_ms, memory_by_step = profiled_steps(run, step)
    if run.config.get("torch_compile"):  # a recompile in the measured steps would be timed
        run.extra["dynamo_frames_compiled"] = {
            "warmup": compiled_in_warmup,
            "timed_and_profiled": dynamo_frames_compiled() - compiled_in_warmup}
        run.extra["dynamo"] = dynamo = dynamo_report()
        breaks = "; ".join(f"{count}x {reason}"
                           for reason, count in dynamo["graph_break_reasons"].items())
        compile_s = dynamo["compile_s"]
        recompiles = "n/a" if dynamo["recompiles"] is None else dynamo["recompiles"]
        log(run, f"torch.compile: {dynamo['frames_compiled']} frames compiled "
                 f"({run.extra['dynamo_frames_compiled']['timed_and_profiled']} after the "
                 f"warm-up), {recompiles} recompiles, {dynamo['graphs']} graphs, "
                 f"{dynamo['graph_breaks']} graph breaks"
                 f"{f' ({breaks})' if breaks else ''}, "
                 f"{'n/a' if compile_s is None else f'{compile_s:.1f} s'} compiling; recompile "
                 f"limit {'hit: a frame runs eagerly from then on' if dynamo['recompile_limit_hit'] else 'not hit'}")
    if run.compile_log:
        run.extra["compile_log"] = compile_log = finish_compile_log(run)
        log(run, f"compile log: {compile_log['log'] or 'none'}; {compile_log['note']}")
    events = trace.load_trace(trace_path)["traceEvents"]
    require_gpu_kernels(run, events)
    peak_reserved_mb = None  # the caching allocator's: what it holds from the GPU, used or not
    if run.is_cuda:
        peak_reserved_mb = torch.cuda.max_memory_reserved(run.device) / trace.BYTES_PER_MB
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
        "recorded_steps": run.recorded_steps,
        "profiled_step_ms_p50": profiled_step_ms_p50,
        "profiler_overhead_ratio": overhead_ratio,
        "first_step_s": first_step_s, "warmup_s": warmup_s,
        **flops_achieved(run, step_ms_p50),
        "peak_memory_mb": peak_mb, "peak_memory_source": peak_source,
        "peak_reserved_mb": peak_reserved_mb,
        # --memory-budget-gb: the budget, the peak held against it and whether it fits; else null
        "memory_budget": memory_budget_check(run, peak_reserved_mb, resident_mb),
        # On a GPU: torch.cuda.memory_allocated and memory_reserved at each recorded step's end.
        "memory_by_step": memory_by_step,
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
                 f"profiler's own cost per operator; on a GPU, also more GPU work in those steps "
                 f"or a GPU that ran slower: compare says which): the trace exaggerates their "
                 f"time; for speed, trust {speed_words(summary)}")
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
            profile_memory: bool | None = None, with_stack: bool = False,
            recorded_steps: int = PROFILE_ACTIVE_STEPS) -> dict:
    """Measure your own training (or inference) step the way the demos are measured, and write
    the same files, so that common.analyze, common.compare and the report read them:
    `warmup_steps` untimed steps; `steps` timed steps without the profiler (device synchronised,
    CUDA events on a GPU) -> samples_per_s from `batch_size`, step-time percentiles; then a few
    profiled steps (schedule: warm-up 1, record `recorded_steps`, none skipped) -> a gzip trace,
    key_averages.txt and summary.json in <out>/<name>/<variant>/ (`out` relative to where you
    stand), which is emptied of an earlier run's files first.

    `step` runs one whole step (forward, backward, optimizer) and must run on `device`.
    `record_shapes` (on by default: the batch and attention verdicts read shapes) and
    `profile_memory` (default: on a CPU only, where the peak comes from it) cost CPU time per
    operator. `with_stack` records Python frames (the analyzer's hot frames). More
    `recorded_steps` catch what three can miss (a loader's bursts), at a larger trace. One
    process: in a job of several ranks, call it on one rank with its own `name`. Returns the
    summary."""
    device = torch.device(device)
    for label, value in (("name", name), ("variant", variant)):
        if not isinstance(value, str) or not RUN_NAME.fullmatch(value):
            raise ValueError(f"profile_loop(): {label}={value!r} must be a folder name (letters, "
                             f"digits, _ - .; not starting with . or -)")
    for label, value in (("batch_size", batch_size), ("steps", steps),
                         ("warmup_steps", warmup_steps), ("recorded_steps", recorded_steps)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"profile_loop(): {label}={value!r} must be a whole number >= 1")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("profile_loop(): device cuda, but PyTorch sees no CUDA GPU here "
                         "(torch.cuda.is_available() is False)")
    if device.type == "cpu":
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_LOG_LEVEL_CPU)
    run = Run(demo=name, variant=variant, device=device, device_name=device_name(device),
              preset_name="own", preset=presets.Preset(batch_size=batch_size, steps=steps,
                                                       warmup_steps=warmup_steps,
                                                       recorded_steps=recorded_steps),
              steps=steps, seed=torch.initial_seed(), out_dir=Path(out) / name / variant,
              record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack)
    clear_run_dir(run.out_dir)  # a run that fails half-way must not leave the last one's results
    return measure_steps(run, step)


def budget_words(budget: dict) -> str:
    """The budget check in a line: "memory budget 2 GB: fits, 1,234.5 MB at the peak (...)"."""
    peak = budget["peak_mb"]
    said = "n/a" if peak is None else f"{peak:,.1f} MB"
    verdict = "fits" if budget["fits"] else "over it"
    return (f"memory budget {budget['budget_mb'] / MB_PER_GB:g} GB: {verdict}, {said} at the "
            f"peak, {budget['peak_of']}")


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
    budget = summary.get("memory_budget")
    if budget:
        log(run, budget_words(budget))
    log(run, f"config: {json.dumps(summary['config'])}")
    for note in summary["notes"]:
        log(run, f"note: {note}")
    log(run, f"trace: {trace_path}")
