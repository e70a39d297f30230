"""The order of the findings (verdicts.rank): severity first; within a level, the findings that
measure no share of the window (memory, compiling, the attention's shape) in rule order, then the
rest by the share of the window each measures its cause to hold, largest first. The first is what
compare's chain and the report call the top verdict. On the H100 reference, FP32 GEMMs at a few
per cent of the window no longer come before the bottleneck each pair is about."""
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
              and f["share_pct"] is not None]
    assert shares == sorted(shares, reverse=True)


def test_every_finding_on_a_time_share_says_it_within_the_window():
    """Each finding's share on the H100 reference: None or a share of the window, 0 to 100."""
    for summary in sorted(H100.glob("*/*/summary.json")):
        for f in analyze.analyze_trace(summary.parent)["findings"]:
            assert f["share_pct"] is None or 0.0 <= f["share_pct"] <= 100.0, (summary, f)
