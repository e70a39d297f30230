"""Harness units: flags, presets, device choice."""
from __future__ import annotations

import pytest
import torch

from common import harness, presets


def test_defaults(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = harness.setup("dataloader_workers", "bad", [])
    assert run.device.type == "cpu" and run.preset_name == "cpu"
    assert run.steps == presets.PRESETS["dataloader_workers"]["cpu"].steps
    assert run.out_dir == harness.DEFAULT_OUT / "dataloader_workers" / "bad"
    assert run.total_steps == (run.preset.warmup_steps + run.steps + harness.PROFILE_WAIT_STEPS
                               + harness.PROFILE_WARMUP_STEPS + harness.PROFILE_ACTIVE_STEPS)


def test_flags_override_the_preset(tmp_path):
    run = harness.setup("dataloader_workers", "fixed",
                        ["--device", "cpu", "--smoke", "--steps", "7", "--out", str(tmp_path),
                         "--seed", "3"])
    assert run.preset_name == "smoke" and run.steps == 7 and run.seed == 3
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


@pytest.mark.parametrize("steps", ["0", "-3", "many"])
def test_steps_must_be_a_positive_whole_number(steps, capsys):
    with pytest.raises(SystemExit) as exit_info:
        harness.setup("dataloader_workers", "bad", ["--steps", steps])
    assert exit_info.value.code == 2
    assert "--steps" in capsys.readouterr().err


def test_every_demo_has_the_three_presets_and_gpu_batches_are_not_smaller():
    for demo, by_kind in presets.PRESETS.items():
        assert set(by_kind) == {"cuda", "cpu", "smoke"}, demo
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
    harness.clear_run_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.md"]


def test_missing_compile_toolchain_is_one_line_exit_2(monkeypatch, capsys):
    run = harness.setup("launch_overhead", "fixed", ["--device", "cpu", "--smoke"])
    harness.require_compile_toolchain(run)  # this machine (and CI) has g++ and Python.h
    monkeypatch.setenv("CXX", "no-such-compiler-zzz")  # Inductor would use it and nothing else
    with pytest.raises(SystemExit) as exit_info:
        harness.require_compile_toolchain(run)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no-such-compiler-zzz" in error
    monkeypatch.delenv("CXX")
    monkeypatch.setattr(harness.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit):
        harness.require_compile_toolchain(run)
    assert "a compiler (c++, g++, clang++)" in capsys.readouterr().err
