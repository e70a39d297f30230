"""Harness units: flags, presets, device choice."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from common import devices, harness, presets, profiling, runs
from tests.conftest import ROOT, cpu_with_flags, read_summary, run_demo, run_python


def test_defaults(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = harness.setup("dataloader_workers", "bad", [])
    assert run.device.type == "cpu" and run.preset_name == "cpu"
    assert run.steps == presets.PRESETS["dataloader_workers"]["cpu"].steps
    assert run.out_dir == harness.DEFAULT_OUT / "dataloader_workers" / "bad"
    assert run.total_steps == (run.preset.warmup_steps + run.steps + runs.PROFILE_WAIT_STEPS
                               + runs.PROFILE_WARMUP_STEPS + runs.PROFILE_ACTIVE_STEPS)


def test_flags_override_the_preset(tmp_path):
    run = harness.setup("dataloader_workers", "fixed",
                        ["--device", "cpu", "--smoke", "--steps", "7", "--out", str(tmp_path),
                         "--seed", "3", "--recorded-steps", "6"])
    assert run.preset_name == "smoke" and run.steps == 7 and run.seed == 3
    assert run.recorded_steps == 6 and run.profiled_steps == (runs.PROFILE_WAIT_STEPS
                                                              + runs.PROFILE_WARMUP_STEPS + 6)
    assert run.batch_size == presets.PRESETS["dataloader_workers"]["smoke"].batch_size
    assert run.out_dir == tmp_path / "dataloader_workers" / "fixed"


def test_auto_picks_cuda_when_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    parser = harness.build_parser("d", "v")
    assert harness.pick_device("auto", parser).type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert harness.pick_device("auto", parser).type == "cpu"


def test_cuda_requested_without_a_gpu_is_a_clear_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        harness.setup("dataloader_workers", "bad", ["--device", "cuda"])
    assert exit_info.value.code == 2
    assert "PyTorch sees no CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--steps", "--recorded-steps"])
@pytest.mark.parametrize("steps", ["0", "-3", "many"])
def test_steps_must_be_a_positive_whole_number(flag, steps, capsys):
    with pytest.raises(SystemExit) as exit_info:
        harness.setup("dataloader_workers", "bad", [flag, steps])
    assert exit_info.value.code == 2
    assert f"{flag}:" in capsys.readouterr().err


def test_every_demo_has_the_three_presets_and_gpu_batches_are_not_smaller():
    for demo, by_kind in presets.PRESETS.items():
        extra = ({presets.CPU_WITHOUT_BF16_UNITS} if demo in ("mixed_precision", "memory_ladder")
                 else set())
        assert set(by_kind) == {"cuda", "cpu", "smoke"} | extra, demo
        assert by_kind["cuda"].batch_size >= by_kind["cpu"].batch_size >= by_kind["smoke"].batch_size
        assert by_kind["smoke"].steps <= 5  # smoke runs must stay seconds long


def test_threads_and_workers_split_the_cores(monkeypatch):
    for cores, device, threads, workers in ((1, "cpu", 1, 1), (2, "cpu", 1, 1), (16, "cpu", 8, 8),
                                            (3, "cpu", 1, 2), (16, "cuda", 2, 14), (1, "cuda", 1, 1)):
        monkeypatch.setattr(presets, "usable_cpu_count", lambda cores=cores: cores)
        assert (presets.main_process_threads(device), presets.loader_workers(device)) == (threads, workers)


def test_clear_run_dir_removes_only_what_a_run_writes(tmp_path):
    for name in ("old.123.pt.trace.json.gz", "old.pt.trace.json", "summary.json",
                 "key_averages.txt", "notes.md"):
        (tmp_path / name).write_text("x")
    runs.clear_run_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.md"]


def test_missing_compile_toolchain_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    run = harness.setup("launch_overhead", "fixed", ["--device", "cpu", "--smoke"])
    # A machine with a compiler and Python's headers, whatever this one has.
    include = tmp_path / "include"
    include.mkdir()
    (include / "Python.h").write_text("")
    monkeypatch.setattr(devices.sysconfig, "get_paths", lambda: {"include": str(include)})
    monkeypatch.setattr(devices.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.delenv("CXX", raising=False)
    harness.require_compile_toolchain(run)  # all there: no exit

    monkeypatch.setenv("CXX", "no-such-compiler-zzz")  # Inductor would use it and nothing else
    monkeypatch.setattr(devices.shutil, "which",
                        lambda name: None if name == "no-such-compiler-zzz" else f"/usr/bin/{name}")
    with pytest.raises(SystemExit) as exit_info:
        harness.require_compile_toolchain(run)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no-such-compiler-zzz" in error
    monkeypatch.delenv("CXX")
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit):
        harness.require_compile_toolchain(run)
    assert "a compiler (c++, g++, clang++)" in capsys.readouterr().err
    (include / "Python.h").unlink()
    monkeypatch.setattr(devices.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(SystemExit):
        harness.require_compile_toolchain(run)
    error = capsys.readouterr().err
    assert "Python's headers (Python.h)" in error and "compiler" not in error.split(";")[0]


class FakeClock:
    """time.perf_counter that moves only when a test moves it."""

    def __init__(self):
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_each_step_is_timed_from_its_start_to_its_end(monkeypatch, tmp_path):
    run = harness.setup("launch_overhead", "bad", ["--device", "cpu", "--smoke",
                                                   "--out", str(tmp_path)])
    clock = FakeClock()
    monkeypatch.setattr(profiling.time, "perf_counter", clock)
    durations_s = iter([0.004, 0.006, 0.005])
    markers = []

    def step():
        clock.now_s += next(durations_s)

    def after_step():  # the profiler's marker: it writes the trace after the last step
        markers.append(clock.now_s)
        clock.now_s += 2.0

    wall_s, step_ms = profiling.clocked_steps(run, step, 3, "test", after_step=after_step)
    assert step_ms.tolist() == pytest.approx([4.0, 6.0, 5.0])  # the markers' 2 s not included
    assert len(markers) == 3 and wall_s == pytest.approx(0.015 + 3 * 2.0)


def test_the_training_step_adds_up_its_wait_for_data(monkeypatch, tmp_path):
    run = harness.setup("launch_overhead", "bad", ["--device", "cpu", "--smoke",
                                                   "--out", str(tmp_path)])
    clock = FakeClock()
    monkeypatch.setattr(harness.time, "perf_counter", clock)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def next_batch():
        clock.now_s += 0.25  # the wait for a batch
        return torch.zeros(3, 4), torch.zeros(3, dtype=torch.long)

    def loss_fn(logits, targets):
        clock.now_s += 1.0  # model time: not a wait for data
        return torch.nn.functional.cross_entropy(logits, targets)

    def to_device(batch):
        clock.now_s += 2.0  # a blocking copy to a GPU, behind the step before's kernels
        return batch

    assert run.data_waits_s is None  # a demo with its own step has no data wait to report
    step = harness.training_step(run, model, optimizer, next_batch, loss_fn, to_device=to_device)
    started_s = clock.now_s
    step()
    step()
    assert run.data_waits_s == pytest.approx([0.25, 0.25])  # each step's wait
    # the copy ran, each step, outside the wait
    assert clock.now_s - started_s == pytest.approx(2 * (0.25 + 1.0 + 2.0))


def test_out_of_gpu_memory_is_one_line_exit_2_and_leaves_nothing(monkeypatch, capsys, tmp_path):
    run = harness.setup("activation_checkpointing", "bad", ["--device", "cpu", "--smoke",
                                                            "--out", str(tmp_path)])
    run.out_dir.mkdir(parents=True)
    (run.out_dir / "summary.json").write_text("{}")  # an earlier run's results
    (run.out_dir / "w.1.pt.trace.json.gz").write_bytes(b"")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=24 * 2**30))

    def step():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(SystemExit) as exit_info:
        harness.measure(run, step)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("error: out of GPU memory")
    for said in ("activation_checkpointing/bad", "smoke preset", f"batch {run.batch_size}",
                 "24 GiB", "--smoke"):
        assert said in error, said
    assert list(run.out_dir.iterdir()) == []


def test_a_cuda_trace_without_kernels_stops_the_run(monkeypatch, capsys, tmp_path):
    run = harness.setup("small_batch", "fixed", ["--device", "cpu", "--smoke",
                                                 "--out", str(tmp_path)])
    run.out_dir.mkdir(parents=True)
    (run.out_dir / "w.1.pt.trace.json.gz").write_bytes(b"")
    cpu_only = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 2}]
    profiling.require_gpu_kernels(run, cpu_only)  # a CPU run: nothing to check
    run.device = torch.device("cuda")
    for vocabulary in ("kernel", "Kernel"):  # today's category, and 2021's
        with_kernel = cpu_only + [{"ph": "X", "cat": vocabulary, "name": "sgemm", "ts": 3,
                                   "dur": 9}]
        profiling.require_gpu_kernels(run, with_kernel)
    with pytest.raises(SystemExit) as exit_info:
        profiling.require_gpu_kernels(run, cpu_only)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "holds no GPU kernel events" in error
    assert "small_batch/fixed" in error and "Nsight" in error
    assert list(run.out_dir.iterdir()) == []  # no CPU-looking result left behind


@pytest.mark.parametrize("flags, demo, expected", [
    ("fpu sse2 avx2", "mixed_precision", "cpu_no_amx"),  # no BF16 at all (an AMD EPYC)
    ("avx512f avx512_bf16", "mixed_precision", "cpu_no_amx"),  # BF16 dot products, no AMX
    ("avx512f avx512_bf16 amx_bf16 amx_tile", "mixed_precision", "cpu"),  # AMX tiles
    ("fpu sse2 avx2", "memory_ladder", "cpu_no_amx"),  # fewer steps, the same sizes
    ("avx512f avx512_bf16 amx_bf16 amx_tile", "memory_ladder", "cpu"),
    ("fpu sse2 avx2", "dataloader_workers", "cpu"),  # only those two have the extra preset
])
def test_a_cpu_without_bf16_units_gets_the_demo_s_own_preset(monkeypatch, tmp_path, flags, demo,
                                                             expected):
    """mixed_precision runs smaller without AMX; the memory ladder fewer steps, at the sizes and
    budget its fit is measured at."""
    cpu_with_flags(monkeypatch, tmp_path, flags)
    for variant in ("bad", "fixed"):  # the same preset for both: compare checks it
        run = harness.setup(demo, variant, ["--device", "cpu"])
        assert run.preset_name == expected
        assert run.preset == presets.PRESETS[demo][expected] and run.steps == run.preset.steps
        if demo == "memory_ladder":
            cpu = presets.PRESETS[demo]["cpu"]
            assert (run.sizes, run.memory_budget_mb) == (
                cpu.sizes, cpu.memory_budget_gb * devices.MB_PER_GB)
            assert run.total_steps == (4 if expected == "cpu_no_amx" else 9)
    assert harness.setup(demo, "bad", ["--device", "cpu", "--smoke"]).preset_name == "smoke"


@pytest.mark.parametrize("demo, variant", [("mixed_precision", "fixed"),
                                            ("memory_ladder", "rung1_bf16")])
def test_the_cpu_no_amx_note_gives_the_run_s_own_sizes(monkeypatch, tmp_path, demo, variant):
    """The note on BF16 under the smaller preset states that run's blocks, tokens and steps, and
    the emulated step measured for that demo, not another demo's."""
    cpu_with_flags(monkeypatch, tmp_path, "fpu sse2 avx2")
    run = harness.setup(demo, variant, ["--device", "cpu"])
    devices.note_cpu_bf16(run)
    [note] = [note for note in run.notes if "cpu_no_amx preset" in note]
    sizes = run.preset.sizes
    assert f"({sizes['blocks']} blocks, {sizes['seq_len']} tokens, {run.steps} timed step" in note
    assert f"{presets.CPU_EMULATED_BF16_STEP_S[demo]:g} s" in note and f"at {demo}'s" in note


@pytest.mark.parametrize("flags, bf16, why", [
    ("fpu sse2 avx2", False, "emulated"),  # no BF16 at all (an AMD EPYC): 34x slower a step
    ("avx512f avx512_bf16", False, "no faster than FP32"),  # BF16 dot products, no AMX
    ("avx512f avx512_bf16 amx_bf16 amx_tile", True, None),  # AMX tiles
])
def test_bf16_where_fast_keeps_fp32_on_a_cpu_without_amx_and_says_so(monkeypatch, tmp_path,
                                                                       flags, bf16, why):
    """The ladder's BF16 rungs autocast only where BF16 is faster; elsewhere the math stays FP32,
    the summary's extra says so (the chain reads it) and a note says why, in this CPU's case."""
    cpu_with_flags(monkeypatch, tmp_path, flags)
    run = harness.setup("ladder", "rung3_bf16", ["--device", "cpu", "--smoke"])
    assert harness.bf16_where_fast(run) == (torch.bfloat16 if bf16 else None)
    assert run.extra["bf16_kept_fp32"] is (not bf16)
    assert [(why in note and "stays FP32" in note) for note in run.notes] == (
        [] if bf16 else [True])


@pytest.mark.parametrize("native, name", [(True, "NVIDIA H100 80GB HBM3"), (False, "Tesla V100")])
def test_bf16_where_fast_on_a_gpu_asks_for_native_bf16(monkeypatch, native, name):
    """On a GPU the answer is torch's, without emulation counted (a V100 emulates BF16 and
    reports it with including_emulation=True): FP32 and a note naming the GPU where it is not
    native. The CUDA calls are stood in for: this checks what is asked and what is said."""
    asked = []

    def is_bf16_supported(including_emulation=True):
        asked.append(including_emulation)
        return native or including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    run = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0), extra={}, notes=[])
    assert devices.bf16_where_fast(run) == (torch.bfloat16 if native else None)
    assert asked == [False] and run.extra["bf16_kept_fp32"] is (not native)
    assert [(name in note and "no native BF16" in note and "stays FP32" in note)
            for note in run.notes] == ([] if native else [True])


# --- --memory-budget-gb ----------------------------------------------------------------------

def cpu_run_with_budget(budget_mb: float | None) -> SimpleNamespace:
    return SimpleNamespace(is_cuda=False, memory_budget_mb=budget_mb)


def test_memory_budget_check_on_a_cpu_holds_the_resident_peak_against_it():
    """On a CPU the budget is checked, not enforced: the process's peak resident memory (which
    only grows) against it, either way; no budget, no check."""
    peak = devices.peak_resident_mb()
    assert peak > 0
    roomy = devices.memory_budget_check(cpu_run_with_budget(10 * peak), None, peak)
    tight = devices.memory_budget_check(cpu_run_with_budget(peak / 10), None, peak)
    assert roomy["fits"] and not tight["fits"]
    assert tight["peak_mb"] == peak and "ru_maxrss" in tight["peak_of"]
    assert devices.memory_budget_check(cpu_run_with_budget(None), None, peak) is None


def test_a_preset_budget_above_the_gpu_gives_way_and_a_given_one_is_an_error(monkeypatch,
                                                                             capsys):
    """On a 16 GB card (15.8 GB reported) the memory ladder's 16 GB default caps the allocator
    at the whole card; the same budget given by the user stops in one line; one under the card
    is a fraction of it. The CUDA calls are stood in for: this checks the arithmetic, and that the
    device reaches torch as it accepts one (an index or None, never the bare "cuda", which
    torch's own check refuses)."""
    from torch.cuda._utils import _get_device_index

    def set_fraction(fraction, device=None):
        if device is not None:
            _get_device_index(device)  # raises on "cuda" without an index, as torch does
        fractions.append(fraction)

    fractions = []
    monkeypatch.setattr(devices.torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=15.8e9))
    monkeypatch.setattr(devices.torch.cuda, "set_per_process_memory_fraction", set_fraction)
    assert devices.cap_cuda_memory("cuda", 16_000.0, given=False) == pytest.approx(15_800.0)
    assert devices.cap_cuda_memory("cuda", 7_900.0) == 7_900.0
    assert fractions == [pytest.approx(1.0), pytest.approx(0.5)]
    with pytest.raises(SystemExit) as stopped:
        devices.cap_cuda_memory("cuda", 16_000.0)
    assert stopped.value.code == 2 and len(fractions) == 2
    assert capsys.readouterr().err == (
        "error: --memory-budget-gb 16: above this GPU's 15.8 GB\n")


@pytest.mark.parametrize("text", ["0", "-1", "nan", "abc"])
def test_memory_budget_must_be_a_positive_number(text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be a number > 0"):
        harness.positive_float(text)


def test_a_cpu_run_over_its_budget_says_so_and_finishes(tmp_path):
    """A CPU cannot enforce a budget: the run finishes, writes the check into its summary and
    prints it (1 KB: any Python process is over it)."""
    result = run_demo("item_sync", "bad", "--smoke", "--device", "cpu", "--memory-budget-gb",
                      "0.000001", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    budget = read_summary(tmp_path, "item_sync", "bad")["memory_budget"]
    assert budget["budget_mb"] == pytest.approx(0.001) and budget["fits"] is False
    assert budget["peak_mb"] > budget["budget_mb"]
    assert (f"memory budget 1e-06 GB: over it, {budget['peak_mb']:,.1f} MB at the peak, "
            f"{budget['peak_of']}") in result.stdout


OUT_OF_MEMORY_SCRIPT = """
import sys, torch
from common import harness
run = harness.setup("item_sync", "bad", sys.argv[1:])
def step():
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
if "--steps" in sys.argv:
    harness.measure(run, step)
raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
"""


@pytest.mark.parametrize("where", ["before the steps", "in a step"])
def test_out_of_memory_anywhere_is_one_line_exit_2_and_nothing_left(tmp_path, where):
    """A CUDA out-of-memory error in the model's set-up (weights over the budget) or in a step
    stops the script the same way: one line naming the budget, exit 2, no traceback, and the
    run folder emptied of an earlier run's results. (Raised by hand: this machine has no GPU.)"""
    stale = tmp_path / "item_sync" / "bad" / "summary.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    args = ["--smoke", "--device", "cpu", "--memory-budget-gb", "2", "--out", str(tmp_path)]
    if where == "in a step":
        args += ["--steps", "1"]
    result = subprocess.run([sys.executable, "-c", OUT_OF_MEMORY_SCRIPT, *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: over the memory budget: item_sync/bad")
    assert "--memory-budget-gb 2 on" in result.stderr
    assert not stale.exists()


# A run stopped by SIGTERM while the profiler records (its second profiled step; warm-up 1,
# timed 2 before it): the step sends it to its own process.
SIGTERM_IN_A_STEP_SCRIPT = """
import os, signal, sys
from common import harness
calls = []
def step():
    calls.append(1)
    if len(calls) == 1 + 2 + 2:
        os.kill(os.getpid(), signal.SIGTERM)
harness.profile_loop(step, name=sys.argv[1], variant="run", batch_size=1, steps=2,
                     warmup_steps=1, out=sys.argv[2])
"""


def test_sigterm_in_a_step_ends_the_run_as_sigterm_does_and_leaves_no_staging_folder(tmp_path):
    """SIGTERM (a kill; torchrun stopping its ranks) unwinds the run: the trace's staging folder
    in the temporary directory is removed, and the process ends as SIGTERM ends it, without a
    traceback. By default Python would end at once and leave the folder behind."""
    script, name = tmp_path / "stopped.py", f"stopped{os.getpid()}"
    script.write_text(SIGTERM_IN_A_STEP_SCRIPT)
    result = run_python([str(script), name, str(tmp_path / "out")], in_a_fork=True)
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert "Traceback" not in result.stderr
    assert "profiling" in result.stdout  # it was stopped in the profiled phase
    assert list(Path(tempfile.gettempdir()).glob(f"{name}_run_*")) == []


def test_every_cpu_no_amx_preset_has_its_measured_emulated_step():
    """note_cpu_bf16 quotes the demo's measured emulated BF16 step under its cpu_no_amx preset:
    a demo given that preset without the measurement would stop there with a KeyError."""
    with_preset = {demo for demo, by_name in presets.PRESETS.items()
                   if presets.CPU_WITHOUT_BF16_UNITS in by_name}
    assert with_preset == set(presets.CPU_EMULATED_BF16_STEP_S)


def test_progress_lines_count_one_step_as_one_step():
    assert [profiling.steps_words(n) for n in (0, 1, 40)] == ["0 steps", "1 step", "40 steps"]
