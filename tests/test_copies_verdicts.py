"""h2d_copy's fix drops what the copies already do. Below, at and above
H2D_PAGEABLE_MIN_PCT; a copy benchmark without kernels; host memory not named; the host waiting
in blocking copies from pinned memory."""
from __future__ import annotations

import pytest

from common import analyze
from common.verdicts import H2D_PAGEABLE_MIN_PCT
from tests.kineto_builder import KinetoTrace
from tests.test_copies import MB, T0, copy_trace

# Steps of 5000 µs holding 1000 µs of copies (20 % of the window, no kernel beside them): copy
# bound, at twice H2D_MIN_PCT. The pageable copy's share of the copy time is set to the cut.
COPY_BOUND_STEP_US = 5000.0


def h2d_finding(tmp_path, built: KinetoTrace) -> dict:
    result = analyze.analyze_trace(built.write(tmp_path / "t.json"))
    return next(f for f in result["findings"] if f["id"] == "h2d_copy")


def split_at(pageable_pct: float) -> list[tuple]:
    pageable_us = 1000.0 * pageable_pct / 100
    return [("HtoD", "Pinned", 40 * MB, 1000.0 - pageable_us),
            ("HtoD", "Pageable", 1 * MB, pageable_us)]


@pytest.mark.parametrize("pageable_pct, pin", [
    (H2D_PAGEABLE_MIN_PCT - 0.1, False),  # below: pinned already
    (H2D_PAGEABLE_MIN_PCT, True),  # at the cut: pin the rest
    (H2D_PAGEABLE_MIN_PCT + 0.1, True),
])
def test_pin_is_said_from_the_cut(tmp_path, pageable_pct, pin):
    found = h2d_finding(tmp_path, copy_trace(split_at(pageable_pct), step_us=COPY_BOUND_STEP_US))
    assert found["fix"].startswith("pin the source") == pin
    assert ("from pinned memory already" in found["fix"]) != pin
    assert "side CUDA stream" in found["fix"]  # kernels ran: overlap is still a fix
    assert f"{pageable_pct:.0f} % from pageable" in found["evidence"]


def test_a_pinned_copy_benchmark_is_told_its_rate_not_to_pin(tmp_path):
    # The microbenchmark: pinned copies, no kernels, recorded without a schedule.
    copies = [("HtoD", "Pinned", 50 * MB, 1000.0)] * 4
    found = h2d_finding(tmp_path, copy_trace(copies, kernel=False, with_steps=False))
    assert "50.0 GB/s, all from pinned memory" in found["evidence"]
    assert found["fix"].startswith("the copies run at 50.0 GB/s from pinned memory already; "
                                   "no kernel ran")
    assert "pin_memory" not in found["fix"] and "side CUDA stream" not in found["fix"]


def test_pageable_copies_are_told_to_pin(tmp_path):
    copies = [("HtoD", "Pageable", 10 * MB, 1000.0)]
    found = h2d_finding(tmp_path, copy_trace(copies, step_us=COPY_BOUND_STEP_US))
    assert "10.0 GB/s, all from pageable memory" in found["evidence"]
    assert found["fix"].startswith("pin the source (DataLoader pin_memory=True, or "
                                   "tensor.pin_memory()): 100 % of the copy time is from "
                                   "pageable memory")


@pytest.mark.parametrize("host_memory", [None, "Host"])
def test_host_memory_not_named_says_so(tmp_path, host_memory):
    copies = [("HtoD", host_memory, 10 * MB, 1000.0)]
    found = h2d_finding(tmp_path, copy_trace(copies, step_us=COPY_BOUND_STEP_US))
    assert "the trace does not say from which host memory" in found["evidence"]
    assert found["fix"].startswith("the trace does not say whether the copies come from pinned "
                                   "memory: if not, pin the source")


@pytest.mark.parametrize("host_memory, fix", [
    ("Pinned", "copy with .to(device, non_blocking=True): the copies come from pinned memory "
               "already"),
    ("Pageable", "pin the source (DataLoader pin_memory=True, or tensor.pin_memory()) and copy "
                 "with .to(device, non_blocking=True)"),
])
def test_a_wait_in_pinned_copies_is_a_blocking_copy(tmp_path, host_memory, fix):
    # x.to(device) blocking: aten::to > _to_copy > copy_ around a 10 µs copy and a stream sync
    # that returns at +90; the next kernel starts at +310: 200+ µs idle of a 1000 µs step.
    t = KinetoTrace()
    t.gpu()
    for number in range(1, 4):
        at = T0 + (number - 1) * 1000.0
        for depth, name in enumerate(("aten::to", "aten::_to_copy", "aten::copy_")):
            t.op(name, at + 2 * depth, 100 - 4 * depth)
        t.memcpy(at + 10, 10, at + 25, 10, host_memory=host_memory)
        t.runtime("cudaStreamSynchronize", at + 30, 60)
        t.launch(at + 300, 5, at + 310, 600)
        t.step(number, at, 1000.0)
    found = h2d_finding(tmp_path, t)
    assert found["fix"].startswith(fix)
