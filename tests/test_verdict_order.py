"""The order of the findings (verdicts.rank): severity first; within a level, the findings that
measure no share of the window (memory, compiling, the attention's shape) in rule order, then the
rest by the share of the window each measures its cause to hold (share_pct), largest first; a
finding that sets the step's pace (DataLoader workers behind it) ranks as high, first of the
shares. The first is what compare's chain and the report call the top verdict. On the H100 reference, FP32
GEMMs at a few per cent of the window no longer come first; each rule's share, by hand."""
from __future__ import annotations

import pytest

from common import analyze, verdicts
from tests.conftest import ROOT

H100 = ROOT / "traces" / "reference" / "h100"


def found(rule_id: str, level: str, share: float | None) -> dict:
    return verdicts.finding(rule_id, level, "evidence", "fix", None, share_pct=share)


def test_a_level_is_ordered_by_share_after_the_findings_without_one():
    findings = [found("a", "high", 10.0), found("b", "high", None), found("c", "medium", 90.0),
                found("d", "high", 50.0), found("e", "high", 50.0), found("f", "medium", None)]
    ordered = [f["id"] for f in sorted(findings, key=verdicts.rank)]
    assert ordered == ["b", "d", "e", "a", "f", "c"]  # d before e: equal shares keep rule order
    # A medium finding that sets the pace ranks as high, first of the shares: after the high
    # findings without one, before every other.
    pace = verdicts.finding("p", "medium", "evidence", "fix", None, share_pct=5.0, sets_pace=True)
    ordered = [f["id"] for f in sorted([*findings, pace], key=verdicts.rank)]
    assert ordered == ["b", "p", "d", "e", "a", "f", "c"]


@pytest.mark.parametrize("run, top, below", [
    # The GPU idles 72 % of the window in sync gaps; FP32 GEMMs hold 2.8 % of it.
    ("host_roundtrip/bad", "host_roundtrip", "fp32_matmul"),
    # Gradient all-reduces in 98 % of the window; FP32 GEMMs under 1 %.
    ("ddp_no_sync/bad", "ddp_sync", "fp32_matmul"),
    # Memory and compiling are no slice of the window: they lead their level.
    ("activation_checkpointing/bad", "activation_memory", "fp32_matmul"),
    ("memory_leak/bad", "memory_growth", "fp32_matmul"),
    ("recompiles/bad", "recompiles", "fp32_matmul"),
])
def test_each_pairs_bottleneck_comes_before_a_smaller_share(run, top, below):
    findings = analyze.analyze_trace(H100 / run)["findings"]
    ids = [f["id"] for f in findings]
    assert ids[0] == top and below in ids[1:], ids
    shares = [f["share_pct"] for f in findings if f["severity"] == findings[0]["severity"]
              and f["share_pct"] is not None and not f["sets_pace"]]
    assert shares == sorted(shares, reverse=True)


def test_every_finding_on_a_time_share_says_it_within_the_window():
    """Each finding's share on the H100 reference: None or a share of the window, 0 to 100."""
    for summary in sorted(H100.glob("*/*/summary.json")):
        for f in analyze.analyze_trace(summary.parent)["findings"]:
            assert f["share_pct"] is None or 0.0 <= f["share_pct"] <= 100.0, (summary, f)


# Each rule's share_pct, read off the metrics by hand: the share of the window its cause holds.
SHARES = {
    "dataloader": lambda m: m["dataloader_pct"],
    "unfused_optimizer": lambda m: m["optimizer"]["pct"],
    "launch_overhead": lambda m: m["gpu"]["idle_by_cause_pct"]["launch"],
    "host_roundtrip": lambda m: m["gpu"]["sync_idle_pct"],
    "host_region": lambda m: max(r["gpu_idle_pct"] for r in m["host_regions"].values()),
    "memory_bound_kernels": lambda m: m["gpu"]["memory_bound_pct"],
    # FP32 GEMM time over the window: its share of kernel time x kernel time / window.
    "fp32_matmul": lambda m: (m["gpu"]["non_tensor_core_gemm_pct"]
                              - m["gpu"]["cuda_core_16bit_gemm_pct"])
    * m["gpu"]["kernel_ms_per_step"] * m["steps"] / m["window_ms"],
    # The idle time the trace accounts for: the window's idle less work from before it.
    "small_batch": lambda m: m["gpu"]["idle_pct"] - m["gpu"]["idle_by_cause_pct"]["unrecorded"],
    # The collectives' time on all but the last micro-batch: what no_sync() removes.
    "ddp_sync": lambda m: m["distributed"]["comm_pct"]
    * (1 - 1 / m["distributed"]["synced_forwards_per_step"]),
}


@pytest.mark.parametrize("run, rule_id", [
    ("dataloader_workers/bad", "dataloader"), ("unfused_optimizer/bad", "unfused_optimizer"),
    ("unfused_optimizer/bad", "launch_overhead"), ("host_roundtrip/bad", "host_roundtrip"),
    ("tokenizer_bound/bad", "host_region"), ("small_batch/fixed", "memory_bound_kernels"),
    ("mixed_precision/bad", "fp32_matmul"), ("host_roundtrip/bad", "fp32_matmul"),
    ("small_batch/bad", "small_batch"), ("ddp_no_sync/bad", "ddp_sync"),
])
def test_each_rules_share_is_its_cause_in_the_window(run, rule_id):
    result = analyze.analyze_trace(H100 / run)
    share = next(f["share_pct"] for f in result["findings"] if f["id"] == rule_id)
    assert share == pytest.approx(SHARES[rule_id](result), abs=1e-9)
    assert 0.0 < share <= 100.0


def test_fp32_matmul_is_graded_on_its_share_of_the_window():
    """High from twice its threshold of the window, whatever its share of kernel time: FP32
    GEMMs at 41 % of an idle GPU's kernel time but 2.8 % of the window are medium."""
    for run, level in (("mixed_precision/bad", "high"), ("host_roundtrip/bad", "medium")):
        found = next(f for f in analyze.analyze_trace(H100 / run)["findings"]
                     if f["id"] == "fp32_matmul")
        assert found["severity"] == level
        assert (found["share_pct"] >= verdicts.FP32_GEMM_MIN_PCT * verdicts.SEVERITY_HIGH_FACTOR
                ) is (level == "high")
