"""Why two runs' step times may not compare (compare.before_after_warnings): few recorded steps,
a wide spread, other hardware, each at its edge, on comparisons built by hand."""
from __future__ import annotations

import pytest

from common import compare, recorded


def side(steps: int = compare.FEW_STEPS, p50: float = 2.0, p95: float = 2.0,
         summary: bool = False, device: str = "cuda", gpu_name: str | None = "NVIDIA H100",
         ) -> dict:
    """One side of a comparison as before_after_warnings reads it: a summary's timed step
    percentiles, or without one the trace's steps and step percentiles, and the trace's device."""
    step_ms = {"p50": p50, "p95": p95}
    return {"summary": ({"step_ms_p50": p50, "step_ms_p95": p95} if summary else None),
            "analysis": {"steps": steps, "step_ms": step_ms, "device": device,
                         "gpu_name": gpu_name}}


def warnings_of(before: dict, after: dict) -> list[str]:
    return compare.before_after_warnings({"variants": ["before", "after"], "before": before,
                                          "after": after})


def test_two_runs_alike_have_no_warning():
    assert warnings_of(side(), side()) == []


@pytest.mark.parametrize("steps, warns", [(compare.FEW_STEPS - 1, True),
                                          (compare.FEW_STEPS, False)])
def test_few_steps_warn_below_their_count(steps, warns):
    found = warnings_of(side(steps=steps), side())
    assert [w.startswith(f"before: {steps} step(s) in the trace") for w in found] == (
        [True] if warns else [])


def test_few_steps_in_the_trace_do_not_matter_with_a_timed_summary():
    """The step time then comes from the timed phase, not from the few recorded steps."""
    assert warnings_of(side(steps=1, summary=True), side(summary=True)) == []


@pytest.mark.parametrize("summary", [False, True], ids=["trace", "summary"])
@pytest.mark.parametrize("factor, warns", [(1.0, False), (1 + 1e-6, True)],
                         ids=["at", "above"])
def test_a_wide_spread_warns_above_its_limit(summary, factor, warns):
    """p50 2 ms, p95 at STEP_SPREAD_MAX times it (exact in binary: 3.0) or a hair above."""
    p95 = 2.0 * recorded.STEP_SPREAD_MAX * factor
    found = warnings_of(side(p95=p95, summary=summary), side(summary=summary))
    assert [w.startswith("before: steps vary") for w in found] == ([True] if warns else [])


@pytest.mark.parametrize("before, after", [
    pytest.param(side(gpu_name="NVIDIA A100-SXM4-80GB"), side(gpu_name="NVIDIA H100 80GB HBM3"),
                 id="two-models-one-vendor"),
    pytest.param(side(gpu_name=None, device="cpu"), side(), id="cpu-and-gpu"),
])
def test_other_hardware_warns(before, after):
    """An A100 against an H100 is a change of hardware as much as CUDA against ROCm."""
    found = warnings_of(before, after)
    assert len(found) == 1 and found[0].startswith("the runs are on different devices")
    assert (before["analysis"]["gpu_name"] or before["analysis"]["device"]) in found[0]
