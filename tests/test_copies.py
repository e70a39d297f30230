"""Copies described as they are: per direction, the share of the copy time from (or to) pinned
and pageable host memory, as each copy's name says, and the GB/s the copies ran at
(metrics.copy_metrics: gpu.copies_per_step[way] pinned_pct, pageable_pct, gb_per_s). Hand-built
traces for each case (pinned only, pageable only, mixed, the host memory not named, no bytes; both
directions), then the real traces, whose numbers are read by hand from their events."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from common import analyze
from tests.conftest import ROOT
from tests.kineto_builder import KinetoTrace

T0 = 1_000_000.0  # µs
STEP_US = 10_000.0
STEPS = 3
MB = 10 ** 6
# A copy: (direction, host memory, bytes or None, µs on the GPU). Host memory as Kineto names it:
# "Pinned", "Pageable", "Host" (ROCm's word for either), or None: a bare "Memcpy HtoD" (older
# Kineto), no kind at all.
PINNED_UP = ("HtoD", "Pinned", 50 * MB, 1000.0)  # 50 MB in 1 ms: 50 GB/s
PAGEABLE_UP = ("HtoD", "Pageable", 10 * MB, 1000.0)  # 10 GB/s


def copy_trace(copies: list[tuple], steps: int = STEPS, vocabulary: str = "current",
               with_steps: bool = True, kernel: bool = True, step_us: float = STEP_US
               ) -> KinetoTrace:
    """`steps` steps of `step_us`, each with `copies` one after another on the GPU (each launched
    10 µs after the one before, running 5 µs after its launch or when the one before ends) and,
    with `kernel`, a 50 µs kernel after them. Without ProfilerStep spans (`with_steps` False): a
    trace recorded around one call, no schedule."""
    t = KinetoTrace(vocabulary=vocabulary)
    t.gpu()
    for number in range(1, steps + 1):
        start = T0 + (number - 1) * step_us
        host, gpu_free = start + 10, start + 10
        for kind, host_memory, size, gpu_us in copies:
            gpu_start = max(host + 5, gpu_free)
            correlation = t.memcpy(host, 8, gpu_start, gpu_us, kind=kind,
                                   host_memory=host_memory or "Pageable")
            event = next(e for e in t.events if e.get("args", {}).get("correlation") == correlation
                         and e["pid"] == t.gpu_pid and e["ph"] == "X")
            if host_memory is None:
                event["name"] = f"Memcpy {kind}"
            if size is not None:
                event["args"]["bytes"] = size
            gpu_free = gpu_start + gpu_us
            host += 10
        if kernel:
            t.launch(host, 5, max(host + 5, gpu_free), 50)
        if with_steps:
            t.step(number, start, step_us)
    return t


def copies_of(tmp_path: Path, built: KinetoTrace) -> dict:
    return analyze.analyze_trace(built.write(tmp_path / "t.json"))["gpu"]["copies_per_step"]


def test_pinned_only(tmp_path):
    up = copies_of(tmp_path, copy_trace([PINNED_UP, PINNED_UP]))["h2d"]
    assert up["count"] == 2 and up["mb"] == pytest.approx(100) and up["ms"] == pytest.approx(2)
    assert (up["pinned_pct"], up["pageable_pct"]) == (100.0, 0.0)
    assert up["gb_per_s"] == pytest.approx(50.0)  # 100 MB in 2 ms; GB = 10^9 bytes


def test_pageable_only(tmp_path):
    up = copies_of(tmp_path, copy_trace([PAGEABLE_UP]))["h2d"]
    assert (up["pinned_pct"], up["pageable_pct"]) == (0.0, 100.0)
    assert up["gb_per_s"] == pytest.approx(10.0)


def test_mixed_is_a_share_of_time_not_of_bytes(tmp_path):
    # 3 pinned copies of 10 MB (200 µs each) and one pageable copy of 1 MB (600 µs): 97 % of
    # the bytes are pinned, half the time is pageable, and half is what pinning could save.
    pinned = ("HtoD", "Pinned", 10 * MB, 200.0)
    pageable = ("HtoD", "Pageable", 1 * MB, 600.0)
    up = copies_of(tmp_path, copy_trace([pinned, pinned, pinned, pageable]))["h2d"]
    assert up["pinned_pct"] == pytest.approx(50.0)
    assert up["pageable_pct"] == pytest.approx(50.0)
    assert up["gb_per_s"] == pytest.approx(31 * MB / 1200e-6 / 1e9)  # all copies: 25.8 GB/s


@pytest.mark.parametrize("host_memory", [None, "Host"])
def test_host_memory_not_named_is_none(tmp_path, host_memory):
    # Older Kineto's bare "Memcpy HtoD" and ROCm's "(Host -> Device)" say neither: no guess.
    up = copies_of(tmp_path, copy_trace([("HtoD", host_memory, 20 * MB, 1000.0)]))["h2d"]
    assert up["count"] == 1
    assert (up["pinned_pct"], up["pageable_pct"]) == (None, None)
    assert up["gb_per_s"] == pytest.approx(20.0)  # the bytes still give the rate


def test_partly_named_leaves_the_rest_unnamed(tmp_path):
    # 600 µs pinned, 400 µs not named: pinned 60 %, pageable 0 %, and 40 % neither.
    named = ("HtoD", "Pinned", 30 * MB, 600.0)
    bare = ("HtoD", None, 20 * MB, 400.0)
    up = copies_of(tmp_path, copy_trace([named, bare]))["h2d"]
    assert up["pinned_pct"] == pytest.approx(60.0)
    assert up["pageable_pct"] == 0.0


def test_no_bytes(tmp_path):
    # A trace without "bytes" (roctracer's, say): no MB and no GB/s, but the time shares hold.
    up = copies_of(tmp_path, copy_trace([("HtoD", "Pinned", None, 300.0),
                                         ("HtoD", "Pageable", None, 100.0)]))["h2d"]
    assert up["mb"] is None and up["gb_per_s"] is None
    assert up["ms"] == pytest.approx(0.4)
    assert (up["pinned_pct"], up["pageable_pct"]) == (pytest.approx(75.0), pytest.approx(25.0))


def test_rate_reads_the_copies_with_bytes_only(tmp_path):
    # One copy with its bytes (10 MB in 500 µs), one without (500 µs): 20 GB/s, not 10.
    up = copies_of(tmp_path, copy_trace([("HtoD", "Pinned", 10 * MB, 500.0),
                                         ("HtoD", "Pinned", None, 500.0)]))["h2d"]
    assert up["gb_per_s"] == pytest.approx(20.0)


def test_both_directions_each_their_own(tmp_path):
    down_pinned = ("DtoH", "Pinned", 4 * MB, 200.0)  # 20 GB/s
    down_pageable = ("DtoH", "Pageable", 1 * MB, 200.0)  # 5 GB/s
    copies = copies_of(tmp_path, copy_trace([PAGEABLE_UP, down_pinned, down_pageable]))
    up, down = copies["h2d"], copies["d2h"]
    assert (up["pinned_pct"], up["pageable_pct"], up["gb_per_s"]) == (0.0, 100.0,
                                                                        pytest.approx(10.0))
    assert (down["count"], down["pinned_pct"], down["pageable_pct"]) == (2, 50.0, 50.0)
    assert down["gb_per_s"] == pytest.approx(12.5)  # 5 MB in 400 µs


def test_no_copies_one_way(tmp_path):
    down = copies_of(tmp_path, copy_trace([PINNED_UP]))["d2h"]
    assert (down["count"], down["mb"], down["ms"]) == (0.0, 0.0, 0.0)
    assert (down["pinned_pct"], down["pageable_pct"], down["gb_per_s"]) == (None, None, None)


def test_copies_without_time(tmp_path):
    # Copies of 0 µs on the GPU: no share of no time, and no rate.
    up = copies_of(tmp_path, copy_trace([("HtoD", "Pinned", 1 * MB, 0.0)]))["h2d"]
    assert up["count"] == 1
    assert (up["pinned_pct"], up["pageable_pct"], up["gb_per_s"]) == (None, None, None)


def test_device_to_device_copies_are_neither_way(tmp_path):
    copies = copies_of(tmp_path, copy_trace([PINNED_UP, ("DtoD", "Device", 100 * MB, 100.0)]))
    assert copies["h2d"]["gb_per_s"] == pytest.approx(50.0)
    assert copies["d2h"]["count"] == 0


@pytest.mark.parametrize("vocabulary", ["2021", "current", "tensorboard"])
def test_every_vocabulary(tmp_path, vocabulary):
    up = copies_of(tmp_path, copy_trace([PINNED_UP, PAGEABLE_UP], vocabulary=vocabulary))["h2d"]
    assert (up["pinned_pct"], up["pageable_pct"]) == (50.0, 50.0)
    assert up["gb_per_s"] == pytest.approx(30.0)  # 60 MB in 2 ms


def test_a_pinned_copy_benchmark_without_steps(tmp_path):
    # A microbenchmark recorded the way people first record one: `with profile():` around the
    # copies, no schedule, no ProfilerStep: the whole trace is one step.
    up = copies_of(tmp_path, copy_trace([PINNED_UP] * 4, with_steps=False))["h2d"]
    assert up["count"] == 4 * STEPS
    assert (up["pinned_pct"], up["gb_per_s"]) == (100.0, pytest.approx(50.0))


# --- Real traces: the numbers read by hand from their copy events. ---------------------------

SHARED_TRACES = ROOT.parent / "shared" / "traces"
REFERENCE = ROOT / "traces" / "reference" / "h100"


def hand_rate(path: Path, name: str) -> float:
    """GB/s of every copy with this name, from the file with json and gzip only: bytes over µs
    on the GPU."""
    with gzip.open(path) as stream:
        events = json.load(stream)["traceEvents"]
    copies = [e for e in events if e.get("ph") == "X" and e.get("name") == name]
    return sum(e["args"]["bytes"] for e in copies) / sum(e["dur"] for e in copies) / 1e3


def reference_trace(pair: str, variant: str) -> Path:
    folder = REFERENCE / pair / variant
    if not folder.is_dir():
        pytest.skip(f"{folder} is missing")
    return next(folder.glob("*.pt.trace.json.gz"))


def test_dataloader_workers_on_the_h100_pageable_then_pinned():
    # bad: 6 copies of 154 MB from pageable memory, all in the steps; fixed: pin_memory=True.
    bad_path, fixed_path = (reference_trace("dataloader_workers", v) for v in ("bad", "fixed"))
    bad = analyze.analyze_trace(bad_path)["gpu"]["copies_per_step"]["h2d"]
    fixed = analyze.analyze_trace(fixed_path)["gpu"]["copies_per_step"]["h2d"]
    assert (bad["pinned_pct"], bad["pageable_pct"]) == (0.0, 100.0)
    assert (fixed["pinned_pct"], fixed["pageable_pct"]) == (100.0, 0.0)
    assert bad["gb_per_s"] == pytest.approx(hand_rate(bad_path,
                                                      "Memcpy HtoD (Pageable -> Device)"))
    assert fixed["gb_per_s"] == pytest.approx(hand_rate(fixed_path,
                                                        "Memcpy HtoD (Pinned -> Device)"))
    assert bad["gb_per_s"] == pytest.approx(7.78, abs=0.01)
    assert fixed["gb_per_s"] == pytest.approx(54.38, abs=0.01)  # the 2026-11-27 run


def shared(name: str) -> dict:
    path = SHARED_TRACES / f"{name}.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return analyze.analyze_trace(path)["gpu"]["copies_per_step"]


def test_shared_v100_and_a100_nccl_copies_up_pinned_down_pageable():
    # Both ranks' traces hold only "Memcpy HtoD (Pinned -> Device)" up and "Memcpy DtoH
    # (Device -> Pageable)" down (their DtoD copies are neither way).
    for name, up_rate in (("v100_nccl_rank1_6steps", 6.36), ("a100_nccl_rank3_6steps", 8.37)):
        copies = shared(name)
        assert (copies["h2d"]["pinned_pct"], copies["h2d"]["pageable_pct"]) == (100.0, 0.0)
        assert (copies["d2h"]["pinned_pct"], copies["d2h"]["pageable_pct"]) == (0.0, 100.0)
        assert copies["h2d"]["gb_per_s"] == pytest.approx(up_rate, abs=0.01)


def test_shared_a100_mixed_by_count_pinned_by_time():
    # 35 pinned copies of 7.2 MB on average and 45 pageable ones of 149 bytes: most copies are
    # pageable, but 99.6 % of the copy time is pinned.
    up = shared("a100_80gb_rank0_5steps")["h2d"]
    assert up["pinned_pct"] == pytest.approx(99.61, abs=0.01)
    assert up["pageable_pct"] == pytest.approx(0.39, abs=0.01)


def test_shared_rocm_names_no_host_memory():
    # MI250: "Memcpy HtoD (Host -> Device)" without bytes; MI300X vLLM: the same name, with bytes.
    mi250 = shared("mi250_rocm_3steps")["h2d"]
    assert mi250["count"] == 1
    assert (mi250["pinned_pct"], mi250["pageable_pct"], mi250["gb_per_s"]) == (None, None, None)
    vllm = shared("mi300x_vllm_prefill_decode_piecewise_graphs")["h2d"]
    assert (vllm["pinned_pct"], vllm["pageable_pct"]) == (None, None)
    assert vllm["gb_per_s"] == pytest.approx(4.46, abs=0.01)
