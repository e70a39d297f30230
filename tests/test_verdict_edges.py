"""Edge tests for the verdict thresholds in common/verdicts.py: each rule one small step below its
threshold, exactly at it and one small step above, so that a test fails exactly when a rule's
boundary is not where its named constant puts it: another number or constant compared, or the
comparison flipped (>= written as >, < as <=).

Most tests take the metrics the analyzer reads off a healthy hand-built trace (no findings), change
only the fields one rule reads and call verdicts.findings_for, the function analyze uses: the
values are then exact, and asserting the whole list of findings shows that the intended rule, and
no other, decides. Where a rule gives way to another (small_batch to dataloader and host_sync,
launch_overhead to small_batch on a small input batch) the edge of the hand-off is pinned too.
A few tests build a trace whose metric is known by hand (exactly at the threshold, or a step
either side) to pin the metric's computation and the rule together.

Every value is derived from the named constants, so changing a threshold on purpose moves these
tests with it; the step either side is relative (EPS), so "exactly at" is tested as well."""
from __future__ import annotations

import copy
import math
from fractions import Fraction

import pytest

from common import analyze, verdicts
from common.metrics import SHORT_KERNEL_US
from common.verdicts import (
    EXPOSED_COMM_MIN_PCT,
    GRAPH_REPLAYED_MIN_PCT,
    HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT,
    HOST_REGION_MIN_PCT,
    ACTIVATION_MEMORY_HIGH_PCT,
    ACTIVATION_MEMORY_MIN_PCT,
    DATALOADER_SHARE_MIN_PCT,
    DATALOADER_WORKERS_BEHIND_MIN_PCT,
    FP32_GEMM_MIN_PCT,
    H2D_MIN_PCT,
    HOST_SYNC_IDLE_MIN_PCT,
    HOST_SYNC_PER_STEP_MIN,
    LAUNCH_SHORT_KERNEL_MIN_PCT,
    LAUNCH_TO_KERNEL_TIME_MIN,
    MEMORY_BOUND_FP32_MIN_SHARE,
    MEMORY_BOUND_MIN_PCT,
    SEVERITY_HIGH_FACTOR,
    SMALL_BATCH_INPUT_BATCH_BELOW,
    SMALL_BATCH_MEDIAN_KERNEL_MAX_US,
    SMALL_BATCH_UTILIZATION_MAX_PCT,
    UNFUSED_OPTIMIZER_MIN_PCT,
)
from tests.kineto_builder import (
    BF16_GEMM,
    ELEMENTWISE,
    FP32_GEMM,
    H100_MEMORY_BYTES,
    KinetoTrace,
    simulate_training,
)

# The relative step either side of a threshold: ten orders of magnitude above float rounding, so
# "below" is never read as "at", and far below any threshold shift that means something.
EPS = 1e-6
# "Comfortably met": a condition not under test sits this far past its threshold (times it for a
# lower bound, divided for an upper one). Not SEVERITY_HIGH_FACTOR: a change to the severity rule
# must not move the other conditions of unrelated tests.
COMFORT = 2.0
# Kernel time per step in the launch cases: a power of two, so that launch time = KERNEL_MS x
# ratio divides back to exactly that ratio.
KERNEL_MS = 4.0
# An 80 GiB device in MB: 85 % and 95 % of it are whole MB, so peak / device is exactly the %.
DEVICE_MB = 80.0 * 1024
T0 = 1_000_000.0  # µs; a realistic absolute clock keeps float precision honest

# Which of (below, at, above) a rule fires on.
AT_LEAST = (False, True, True)  # value >= threshold
AT_MOST = (True, True, False)  # value <= threshold
UNDER = (True, False, False)  # value < threshold


def below(value: float) -> float:
    return value * (1 - EPS)


def above(value: float) -> float:
    return value * (1 + EPS)


def edges(threshold: float, fires: tuple[bool, bool, bool]) -> list:
    """(value, fires) for just below, exactly at and just above `threshold`."""
    values = (below(threshold), threshold, above(threshold))
    return [pytest.param(value, fire, id=name)
            for name, value, fire in zip(("below", "at", "above"), values, fires)]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict:
    """The analyzer's metrics of a healthy run: 200 µs bf16 GEMMs keep the GPU busy, memory at
    30 % of the GPU, no syncs, copies or DataLoader (test_analyze's healthy control)."""
    built = KinetoTrace()
    built.gpu()
    simulate_training(built, peak_memory_bytes=int(0.3 * H100_MEMORY_BYTES))
    path = built.write(tmp_path_factory.mktemp("base") / "t.pt.trace.json")
    result = analyze.analyze_trace(path)
    # Every edge below asserts the whole list of findings: a base that fires would fail them all
    # for a reason that is none of theirs.
    assert result["findings"] == [] and verdicts.findings_for(result) == []
    return result


def changed(base: dict, gpu: dict | None = None, syncs: dict | None = None,
            sync_idle: dict | None = None, **top) -> dict:
    """A copy of the base metrics with these GPU fields, syncs per step and sync idle % (by
    cause), and top-level fields, changed."""
    m = copy.deepcopy(base)
    del m["findings"]  # what findings_for returns is the answer; a stale copy would confuse
    m["gpu"].update(gpu or {})
    m["gpu"]["syncs_by_cause_per_step"].update(syncs or {})
    m["gpu"]["sync_idle_pct_by_cause"].update(sync_idle or {})
    m.update(top)
    return m


def finding_ids(m: dict) -> list[str]:
    return [f["id"] for f in verdicts.findings_for(m)]


def by_id(m: dict) -> dict[str, dict]:
    return {f["id"]: f for f in verdicts.findings_for(m)}


def only(rule_id: str, fires: bool) -> list[str]:
    return [rule_id] if fires else []


def launch_bound(base: dict, short_pct: float = 100.0,
                 ratio: float = LAUNCH_TO_KERNEL_TIME_MIN * COMFORT, **changes) -> dict:
    """The base with `short_pct` % short kernels and launch time `ratio` x kernel time; the
    base's GPU stays busy, so small_batch is not in play unless `changes` say otherwise."""
    gpu = {"short_kernel_pct": short_pct, "kernel_ms_per_step": KERNEL_MS,
           "launch_ms_per_step": KERNEL_MS * ratio, **changes.pop("gpu", {})}
    return changed(base, gpu=gpu, **changes)


def underfilled(base: dict, utilization: float = SMALL_BATCH_UTILIZATION_MAX_PCT / COMFORT,
                median_us: float = SMALL_BATCH_MEDIAN_KERNEL_MAX_US / COMFORT, **changes) -> dict:
    """The base with a GPU under-filled by both of small_batch's measures, unless overridden."""
    gpu = {"recorded_utilization_pct": utilization, "median_kernel_us": median_us,
           **changes.pop("gpu", {})}
    return changed(base, gpu=gpu, **changes)


def test_the_base_run_has_no_findings(base):
    assert base["gpu"]["recorded_utilization_pct"] > SMALL_BATCH_UTILIZATION_MAX_PCT
    assert base["input_batch"] is None and base["dataloader_pct"] == 0.0
    assert finding_ids(changed(base)) == []


# --- fp32_matmul ---------------------------------------------------------------------------------

@pytest.mark.parametrize("pct, fires", edges(FP32_GEMM_MIN_PCT, AT_LEAST))
def test_fp32_matmul_fires_from_its_gemm_share_on(base, pct, fires):
    m = changed(base, gpu={"non_tensor_core_gemm_pct": pct})
    assert finding_ids(m) == only("fp32_matmul", fires)


# --- memory_bound_kernels ----------------------------------------------------------------------

@pytest.mark.parametrize("pct, fires", edges(MEMORY_BOUND_MIN_PCT, AT_LEAST))
def test_memory_bound_kernels_fires_from_its_share_of_the_window(base, pct, fires):
    m = changed(base, gpu={"memory_bound_pct": pct, "memory_bound_fp32_pct": 0.0})
    assert finding_ids(m) == only("memory_bound_kernels", fires)


@pytest.mark.parametrize("share, bf16_first", [
    pytest.param(below(MEMORY_BOUND_FP32_MIN_SHARE), False, id="below"),
    pytest.param(MEMORY_BOUND_FP32_MIN_SHARE, True, id="at"),
    pytest.param(above(MEMORY_BOUND_FP32_MIN_SHARE), True, id="above")])
def test_memory_bound_kernels_names_bf16_from_its_fp32_share(base, share, bf16_first):
    """With FP32 matmuls (TF32 on the tensor cores: no autocast yet)."""
    pct = MEMORY_BOUND_MIN_PCT * (1 + COMFORT) / 2  # between the threshold and 100 %
    found = by_id(changed(base, gpu={"memory_bound_pct": pct, "memory_bound_fp32_pct": share * pct,
                                     "tensor_core_pct": 30.0, "tf32_pct": 30.0}))
    assert list(found) == ["memory_bound_kernels"]
    assert found["memory_bound_kernels"]["demo"] == (
        "mixed_precision" if bf16_first else "launch_overhead")
    assert found["memory_bound_kernels"]["fix"].startswith("BF16 first") is bf16_first


@pytest.mark.parametrize("sixteen_bit_pct, bf16_first", [
    pytest.param(below(30.0), True, id="below"), pytest.param(30.0, True, id="at"),
    pytest.param(above(30.0), False, id="above")])
def test_memory_bound_kernels_says_bf16_only_while_fp32_matmuls_outweigh_16_bit_ones(
        base, sixteen_bit_pct, bf16_first):
    """FP32 data on every memory-bound kernel; matmuls 30 % of kernel time in TF32 beside 16-bit
    tensor-core time below, at and above it: from above, autocast is on already."""
    pct = MEMORY_BOUND_MIN_PCT * (1 + COMFORT) / 2
    found = by_id(changed(base, gpu={"memory_bound_pct": pct, "memory_bound_fp32_pct": pct,
                                     "tensor_core_pct": 30.0 + sixteen_bit_pct,
                                     "tf32_pct": 30.0}))
    assert found["memory_bound_kernels"]["fix"].startswith("BF16 first") is bf16_first


def test_memory_bound_kernels_gives_way_to_naive_attention(base):
    """Written-out attention's softmax and copies are memory bound; naive_attention names them,
    with the fix (SDPA) that removes them rather than fusing them."""
    m = changed(base, gpu={"memory_bound_pct": 80.0, "memory_bound_fp32_pct": 0.0},
                attention={"square_softmax_max": float(verdicts.NAIVE_ATTENTION_MIN_SEQ),
                           "sdpa_ops_per_step": 0.0})
    assert finding_ids(m) == ["naive_attention"]


def test_memory_bound_kernels_is_high_from_the_upper_limits_fraction(base):
    """Graded as an upper limit on the rest of the window: high once the rest is at most half
    of what the threshold leaves (75 % of the window memory bound)."""
    rest = (100.0 - MEMORY_BOUND_MIN_PCT) / SEVERITY_HIGH_FACTOR
    for pct, level in ((100.0 - rest, "high"), (below(100.0 - rest), "medium")):
        found = by_id(changed(base, gpu={"memory_bound_pct": pct, "memory_bound_fp32_pct": 0.0}))
        assert found["memory_bound_kernels"]["severity"] == level, pct


# --- launch_overhead ---------------------------------------------------------------------------

@pytest.mark.parametrize("pct, fires", edges(LAUNCH_SHORT_KERNEL_MIN_PCT, AT_LEAST))
def test_launch_overhead_needs_its_share_of_short_kernels(base, pct, fires):
    m = launch_bound(base, short_pct=pct)
    assert finding_ids(m) == only("launch_overhead", fires)


@pytest.mark.parametrize("ratio, fires", edges(LAUNCH_TO_KERNEL_TIME_MIN, AT_LEAST))
def test_launch_overhead_needs_launch_time_at_least_kernel_time(base, ratio, fires):
    m = launch_bound(base, ratio=ratio)
    # The ratio the rule reports is the one set: KERNEL_MS x ratio / KERNEL_MS is exact.
    assert verdicts.launch_to_kernel_ratio(m["gpu"]) == (ratio if fires else None)
    assert finding_ids(m) == only("launch_overhead", fires)


# --- small_batch, and the rules it gives way to --------------------------------------------------

@pytest.mark.parametrize("median_us, fires", edges(SMALL_BATCH_MEDIAN_KERNEL_MAX_US, AT_MOST))
def test_small_batch_needs_a_short_median_kernel(base, median_us, fires):
    m = underfilled(base, median_us=median_us)
    assert verdicts.gpu_underfilled(m["gpu"]) is fires
    assert finding_ids(m) == only("small_batch", fires)


@pytest.mark.parametrize("utilization, fires", edges(SMALL_BATCH_UTILIZATION_MAX_PCT, UNDER))
def test_small_batch_needs_utilization_under_its_limit(base, utilization, fires):
    m = underfilled(base, utilization=utilization)
    assert verdicts.gpu_underfilled(m["gpu"]) is fires
    assert finding_ids(m) == only("small_batch", fires)


def test_small_batch_evidence_never_prints_its_limit_as_the_value(base):
    """Just under the strict limit the evidence must not round up to it ("utilization 50 % ...
    rule: < 50 %" would contradict itself)."""
    utilization = SMALL_BATCH_UTILIZATION_MAX_PCT - 0.3
    evidence = by_id(underfilled(base, utilization=utilization))["small_batch"]["evidence"]
    assert f"utilization {utilization:.1f} %" in evidence


@pytest.mark.parametrize("batch, verdict", [
    pytest.param(float(SMALL_BATCH_INPUT_BATCH_BELOW - 1), "small_batch", id="one-below"),
    # input_batch is a median: half a sample below is a batch too (63.5 of 63 and 64)
    pytest.param(SMALL_BATCH_INPUT_BATCH_BELOW - 0.5, "small_batch", id="half-below"),
    pytest.param(float(SMALL_BATCH_INPUT_BATCH_BELOW), "launch_overhead", id="at"),
    pytest.param(None, "launch_overhead", id="no-shapes"),
])
def test_the_input_batch_decides_small_batch_or_launch_overhead(base, batch, verdict):
    """A launch-bound, under-filled GPU fits both rules by its timing; only the batch at the
    conv/linear inputs tells them apart, and exactly one of them may fire."""
    gpu = {"recorded_utilization_pct": SMALL_BATCH_UTILIZATION_MAX_PCT / COMFORT,
           "median_kernel_us": SMALL_BATCH_MEDIAN_KERNEL_MAX_US / COMFORT}
    m = launch_bound(base, gpu=gpu, input_batch=batch)
    assert finding_ids(m) == [verdict]


@pytest.mark.parametrize("pct, verdict", [
    pytest.param(below(DATALOADER_SHARE_MIN_PCT), "small_batch", id="below"),
    pytest.param(DATALOADER_SHARE_MIN_PCT, "dataloader", id="at"),
])
def test_small_batch_gives_way_to_the_dataloader_at_its_threshold(base, pct, verdict):
    assert finding_ids(underfilled(base, dataloader_pct=pct)) == [verdict]


@pytest.mark.parametrize("pct, verdict", [
    pytest.param(below(DATALOADER_WORKERS_BEHIND_MIN_PCT), "small_batch", id="below"),
    pytest.param(DATALOADER_WORKERS_BEHIND_MIN_PCT, "dataloader", id="at"),
])
def test_small_batch_gives_way_to_workers_that_fall_behind_at_their_cut(base, pct, verdict):
    m = underfilled(base, dataloader_pct=pct, dataloader_workers=True)
    assert finding_ids(m) == [verdict]


@pytest.mark.parametrize("per_step, verdict", [
    pytest.param(below(HOST_SYNC_PER_STEP_MIN), "small_batch", id="below"),
    pytest.param(HOST_SYNC_PER_STEP_MIN, "host_sync", id="at"),
])
def test_small_batch_gives_way_to_host_sync_at_its_threshold(base, per_step, verdict):
    m = underfilled(base, syncs={"value_read": per_step},
                    sync_idle={"value_read": HOST_SYNC_IDLE_MIN_PCT * COMFORT})
    assert finding_ids(m) == [verdict]


# --- dataloader: who makes the batches -------------------------------------------------------------

def optimizer(pct: float) -> dict:
    """An optimizer region (metrics.optimizer_metrics) that unfused_optimizer names at `pct` % of
    the window: AdamW's per-tensor loop, 10 us an operator, 15 calls a tensor."""
    return {"pct": pct, "ms_per_step": 10.0, "cpu_ms_per_step": 10.0, "gpu_ms_per_step": None,
            "ops_per_step": 1000.0, "multi_tensor_ops_per_step": 0.0, "tensors_per_step": 62.0,
            "calls_per_tensor": 15.0}


LOADER_CUTS = [
    pytest.param(None, DATALOADER_SHARE_MIN_PCT, id="no-span"),
    pytest.param(False, DATALOADER_SHARE_MIN_PCT, id="in-process"),
    pytest.param(True, DATALOADER_WORKERS_BEHIND_MIN_PCT, id="workers"),
]


@pytest.mark.parametrize("workers, cut", LOADER_CUTS)
@pytest.mark.parametrize("nudge, fires", [(below, False), (float, True), (above, True)],
                         ids=["below", "at", "above"])
def test_dataloader_fires_from_its_cut_which_is_lower_with_workers(base, workers, cut, nudge,
                                                                    fires):
    m = changed(base, dataloader_pct=nudge(cut), dataloader_workers=workers)
    found = by_id(m)
    assert list(found) == only("dataloader", fires)
    if fires:  # with workers their wait paces the step; in the training process it does not
        assert found["dataloader"]["sets_pace"] is bool(workers)


def test_workers_that_fall_behind_come_before_a_larger_share_of_a_higher_level(base):
    """A wait of 15 % with workers (medium) and AdamW's loop at 30 % (high): the wait first, as
    it sets the step's pace; the same wait in the training process is under its cut, and the
    same two at 25 % in the training process (medium) rank by level and share."""
    wait = DATALOADER_WORKERS_BEHIND_MIN_PCT * 1.5
    loop = optimizer(UNFUSED_OPTIMIZER_MIN_PCT * SEVERITY_HIGH_FACTOR)
    behind = verdicts.findings_for(changed(base, dataloader_pct=wait, dataloader_workers=True,
                                           optimizer=loop))
    assert [(f["id"], f["severity"]) for f in behind] == [("dataloader", "medium"),
                                                          ("unfused_optimizer", "high")]
    in_process = changed(base, dataloader_pct=wait, dataloader_workers=False, optimizer=loop)
    assert finding_ids(in_process) == ["unfused_optimizer"]
    in_process["dataloader_pct"] = DATALOADER_SHARE_MIN_PCT * 1.25
    assert finding_ids(in_process) == ["unfused_optimizer", "dataloader"]


def test_a_high_finding_of_no_share_still_leads_workers_that_fall_behind(base):
    """Memory near full holds back the batch whatever the loader does: it stays first."""
    m = changed(base, dataloader_pct=DATALOADER_WORKERS_BEHIND_MIN_PCT * 1.5,
                dataloader_workers=True, device_memory_mb=DEVICE_MB,
                peak_memory_mb=DEVICE_MB * ACTIVATION_MEMORY_HIGH_PCT / 100)
    assert finding_ids(m) == ["activation_memory", "dataloader"]


# --- host_sync -----------------------------------------------------------------------------------

def split(value: float, causes: str) -> dict:
    """`value` on one of host_sync's causes, or half on each (halves add back exactly)."""
    if causes == "both":
        return {"value_read": value / 2, "other": value / 2}
    return {causes: value}


@pytest.mark.parametrize("causes", ["value_read", "other", "both"])
@pytest.mark.parametrize("per_step, fires", edges(HOST_SYNC_PER_STEP_MIN, AT_LEAST))
def test_host_sync_needs_its_syncs_per_step(base, per_step, fires, causes):
    m = changed(base, syncs=split(per_step, causes),
                sync_idle=split(HOST_SYNC_IDLE_MIN_PCT * COMFORT, causes))
    assert finding_ids(m) == only("host_sync", fires)


@pytest.mark.parametrize("causes", ["value_read", "other", "both"])
@pytest.mark.parametrize("idle_pct, fires", edges(HOST_SYNC_IDLE_MIN_PCT, AT_LEAST))
def test_host_sync_needs_its_idle_share(base, idle_pct, fires, causes):
    m = changed(base, syncs=split(HOST_SYNC_PER_STEP_MIN * COMFORT, causes),
                sync_idle=split(idle_pct, causes))
    assert finding_ids(m) == only("host_sync", fires)


@pytest.mark.parametrize("short_of", ["count", "idle"])
def test_host_sync_does_not_count_copy_syncs_toward_its_thresholds(base, short_of):
    """Copy syncs are h2d_copy's: past both thresholds they do not lift host_sync's value reads
    over theirs (and h2d_copy stays silent, its other condition being unmet)."""
    reads = {"count": below(HOST_SYNC_PER_STEP_MIN), "idle": HOST_SYNC_PER_STEP_MIN * COMFORT}
    reads_idle = {"count": HOST_SYNC_IDLE_MIN_PCT * COMFORT, "idle": below(HOST_SYNC_IDLE_MIN_PCT)}
    copies = {"count": HOST_SYNC_PER_STEP_MIN * COMFORT, "idle": 0.0}
    copies_idle = {"count": 0.0, "idle": HOST_SYNC_IDLE_MIN_PCT * COMFORT}
    m = changed(base, syncs={"value_read": reads[short_of], "h2d_copy": copies[short_of]},
                sync_idle={"value_read": reads_idle[short_of],
                           "h2d_copy": copies_idle[short_of]})
    assert finding_ids(m) == []


# --- h2d_copy ------------------------------------------------------------------------------------

@pytest.mark.parametrize("exposed_pct, fires", edges(H2D_MIN_PCT, AT_LEAST))
def test_h2d_copy_fires_from_its_exposed_copy_share_on(base, exposed_pct, fires):
    m = changed(base, gpu={"h2d_exposed_pct": exposed_pct})
    assert finding_ids(m) == only("h2d_copy", fires)


@pytest.mark.parametrize("per_step, fires", edges(HOST_SYNC_PER_STEP_MIN, AT_LEAST))
def test_h2d_copy_waits_need_the_sync_count(base, per_step, fires):
    m = changed(base, syncs={"h2d_copy": per_step},
                sync_idle={"h2d_copy": HOST_SYNC_IDLE_MIN_PCT * COMFORT})
    assert finding_ids(m) == only("h2d_copy", fires)


@pytest.mark.parametrize("idle_pct, fires", edges(HOST_SYNC_IDLE_MIN_PCT, AT_LEAST))
def test_h2d_copy_waits_need_the_idle_share(base, idle_pct, fires):
    m = changed(base, syncs={"h2d_copy": HOST_SYNC_PER_STEP_MIN * COMFORT},
                sync_idle={"h2d_copy": idle_pct})
    assert finding_ids(m) == only("h2d_copy", fires)


# --- activation_memory ---------------------------------------------------------------------------

@pytest.mark.parametrize("pct, level", [
    pytest.param(below(ACTIVATION_MEMORY_MIN_PCT), None, id="below-min"),
    pytest.param(ACTIVATION_MEMORY_MIN_PCT, "medium", id="at-min"),
    pytest.param(below(ACTIVATION_MEMORY_HIGH_PCT), "medium", id="below-high"),
    pytest.param(ACTIVATION_MEMORY_HIGH_PCT, "high", id="at-high"),
    pytest.param(above(ACTIVATION_MEMORY_HIGH_PCT), "high", id="above-high"),
])
def test_activation_memory_is_medium_from_its_share_and_high_from_the_high_one(base, pct, level):
    m = changed(base, device_memory_mb=DEVICE_MB, peak_memory_mb=DEVICE_MB * pct / 100)
    if pct in (ACTIVATION_MEMORY_MIN_PCT, ACTIVATION_MEMORY_HIGH_PCT):
        # The share the rule computes must be the threshold itself, not a rounding either side.
        assert 100.0 * m["peak_memory_mb"] / m["device_memory_mb"] == pct
    found = by_id(m)
    assert list(found) == only("activation_memory", level is not None)
    if level:
        assert found["activation_memory"]["severity"] == level


# --- severity ------------------------------------------------------------------------------------

LOWER_BOUNDS = [
    pytest.param(DATALOADER_SHARE_MIN_PCT, id="dataloader"),
    pytest.param(LAUNCH_TO_KERNEL_TIME_MIN, id="launch_ratio"),
    pytest.param(HOST_SYNC_IDLE_MIN_PCT, id="sync_idle"),
    pytest.param(FP32_GEMM_MIN_PCT, id="fp32_gemm"),
    pytest.param(H2D_MIN_PCT, id="h2d"),
]


@pytest.mark.parametrize("threshold", LOWER_BOUNDS)
def test_severity_is_high_from_the_factor_times_a_threshold(threshold):
    high_from = threshold * SEVERITY_HIGH_FACTOR
    assert verdicts.severity(threshold, threshold) == "medium"
    assert verdicts.severity(below(high_from), threshold) == "medium"
    assert verdicts.severity(high_from, threshold) == "high"
    assert verdicts.severity(above(high_from), threshold) == "high"


def test_severity_of_an_upper_limit_is_high_from_the_fraction_down():
    limit = SMALL_BATCH_UTILIZATION_MAX_PCT
    high_until = limit / SEVERITY_HIGH_FACTOR
    assert verdicts.severity(limit, limit, upper_limit=True) == "medium"
    assert verdicts.severity(above(high_until), limit, upper_limit=True) == "medium"
    assert verdicts.severity(high_until, limit, upper_limit=True) == "high"
    assert verdicts.severity(below(high_until), limit, upper_limit=True) == "high"


# Each: (rule id, threshold, upper limit?, metrics with the graded value set to `v`).
SEVERITY_CASES = {
    # Graded on its share of the window: kernel time made the whole window, so the GEMMs' share
    # of kernel time is that share (utilization 100 %, the cap).
    "fp32_matmul": (FP32_GEMM_MIN_PCT, False,
                    lambda base, v: changed(base, gpu={
                        "non_tensor_core_gemm_pct": v, "utilization_pct": 100.0,
                        "kernel_ms_per_step": base["window_ms"] / base["steps"]})),
    "dataloader": (DATALOADER_SHARE_MIN_PCT, False,
                   lambda base, v: changed(base, dataloader_pct=v)),
    "launch_overhead": (LAUNCH_TO_KERNEL_TIME_MIN, False,
                        lambda base, v: launch_bound(base, ratio=v)),
    "host_sync": (HOST_SYNC_IDLE_MIN_PCT, False,
                  lambda base, v: changed(
                      base, syncs={"value_read": HOST_SYNC_PER_STEP_MIN * COMFORT},
                      sync_idle={"value_read": v})),
    "h2d_copy": (H2D_MIN_PCT, False, lambda base, v: changed(base, gpu={"h2d_exposed_pct": v})),
    "small_batch": (SMALL_BATCH_UTILIZATION_MAX_PCT, True,
                    lambda base, v: underfilled(base, utilization=v)),
}


@pytest.mark.parametrize("rule_id", list(SEVERITY_CASES))
def test_a_findings_severity_turns_high_at_the_factor(base, rule_id):
    threshold, upper_limit, metrics_at = SEVERITY_CASES[rule_id]
    if upper_limit:
        high, medium = threshold / SEVERITY_HIGH_FACTOR, above(threshold / SEVERITY_HIGH_FACTOR)
    else:
        high, medium = threshold * SEVERITY_HIGH_FACTOR, below(threshold * SEVERITY_HIGH_FACTOR)
    for value, level in ((high, "high"), (medium, "medium")):
        found = by_id(metrics_at(base, value))
        assert list(found) == [rule_id]
        assert found[rule_id]["severity"] == level, value


@pytest.mark.parametrize("copy_level, wait_level, level", [
    ("medium", "medium", "medium"), ("high", "medium", "high"), ("medium", "high", "high")])
def test_h2d_copy_is_high_when_either_of_its_paths_is(base, copy_level, wait_level, level):
    def graded(threshold: float, grade: str) -> float:
        high_from = threshold * SEVERITY_HIGH_FACTOR
        return high_from if grade == "high" else below(high_from)
    m = changed(base, gpu={"h2d_exposed_pct": graded(H2D_MIN_PCT, copy_level)},
                syncs={"h2d_copy": HOST_SYNC_PER_STEP_MIN * COMFORT},
                sync_idle={"h2d_copy": graded(HOST_SYNC_IDLE_MIN_PCT, wait_level)})
    assert by_id(m)["h2d_copy"]["severity"] == level


# --- On traces: the metric's computation and the rule's edge together. -------------------------
# Each trace is laid out so that its metric is known by hand; the tests check the metric, then
# the verdict.

def analysed(tmp_path, built: KinetoTrace) -> dict:
    return analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))


def ids_of(result: dict) -> list[str]:
    return [f["id"] for f in result["findings"]]


@pytest.mark.parametrize("pct, fires", edges(FP32_GEMM_MIN_PCT, AT_LEAST))
def test_fp32_gemm_share_on_a_trace(tmp_path, pct, fires):
    """One step: an FP32 GEMM of pct % of 1000 µs of kernel time, then a bf16 GEMM of the rest,
    back to back inside the step (the GPU stays busy: no other rule in play)."""
    kernel_us = 1000.0
    fp32_us = kernel_us * pct / 100  # at the threshold: a whole µs, so the share is exact
    built = KinetoTrace()
    built.gpu()
    built.step(1, T0, kernel_us + 10)
    built.launch(T0 + 1, 1, T0 + 5, fp32_us, name=FP32_GEMM)
    built.launch(T0 + 2, 1, T0 + 5 + fp32_us, kernel_us - fp32_us, name=BF16_GEMM)
    result = analysed(tmp_path, built)
    share = result["gpu"]["non_tensor_core_gemm_pct"]
    assert share == pytest.approx(pct, rel=EPS / 100)
    assert (share >= FP32_GEMM_MIN_PCT) is fires  # the approximation did not cross the edge
    assert ids_of(result) == only("fp32_matmul", fires)


@pytest.mark.parametrize("step", [pytest.param(-1, id="below"), pytest.param(0, id="at"),
                                  pytest.param(1, id="above")])
def test_short_kernel_share_on_a_trace(tmp_path, step):
    """1000 kernels in one step, short ones (SHORT_KERNEL_US / 2) and not-short ones, each
    behind a launch call long enough that launches take well over the kernels' time: the share
    of short kernels alone decides. A kernel is 0.1 % of them: the finest step on a trace."""
    kernels = 1000
    n_short = round(kernels * LAUNCH_SHORT_KERNEL_MIN_PCT / 100) + step
    short_us, long_us = SHORT_KERNEL_US / 2, 2 * SHORT_KERNEL_US
    launch_us = long_us * 2 * LAUNCH_TO_KERNEL_TIME_MIN * COMFORT
    built = KinetoTrace()
    built.gpu()
    built.step(1, T0, kernels * (launch_us + 1) + 10)
    for index in range(kernels):
        at = T0 + 1 + index * (launch_us + 1)  # each kernel ends before the next launch
        built.launch(at, launch_us, at + 3, short_us if index < n_short else long_us)
    result = analysed(tmp_path, built)
    gpu = result["gpu"]
    assert gpu["short_kernel_pct"] == 100 * n_short / kernels
    assert (gpu["launch_ms_per_step"]
            >= gpu["kernel_ms_per_step"] * LAUNCH_TO_KERNEL_TIME_MIN * COMFORT)
    # Below the edge the GPU, idle between launches, may read as under-filled (small_batch's
    # case): only launch_overhead's presence is this test's.
    assert ("launch_overhead" in ids_of(result)) is (step >= 0)


@pytest.mark.parametrize("utilization, fires", edges(SMALL_BATCH_UTILIZATION_MAX_PCT, UNDER))
def test_gpu_utilization_on_a_trace(tmp_path, utilization, fires):
    """One 1000 µs step with 40 equal kernels spaced 25 µs apart, each 1 µs launch well inside
    the step: utilization is 40 x the kernel's length / 1000 µs, the median kernel the length.
    BF16 GEMMs: element-wise kernels would fill half the window at the edge (memory bound)."""
    step_us, kernels, spacing_us = 1000.0, 40, 25.0
    kernel_us = step_us * utilization / 100 / kernels  # 12.5 µs at 50 %: exact
    assert kernel_us < spacing_us and kernel_us <= SMALL_BATCH_MEDIAN_KERNEL_MAX_US
    built = KinetoTrace()
    built.gpu()
    built.step(1, T0, step_us)
    for index in range(kernels):
        at = T0 + 5 + index * spacing_us
        built.launch(at, 1, at + 5, kernel_us, name=BF16_GEMM)
    result = analysed(tmp_path, built)
    assert result["gpu"]["utilization_pct"] == pytest.approx(utilization, rel=EPS / 100)
    # every kernel launched in the recording: the rule's figure is the same one
    assert result["gpu"]["recorded_utilization_pct"] == result["gpu"]["utilization_pct"]
    assert (result["gpu"]["recorded_utilization_pct"] < SMALL_BATCH_UTILIZATION_MAX_PCT) is fires
    assert result["gpu"]["median_kernel_us"] == pytest.approx(kernel_us)
    assert ids_of(result) == only("small_batch", fires)


@pytest.mark.parametrize("missing", [pytest.param(1, id="below"), pytest.param(0, id="at")])
def test_syncs_per_step_on_a_trace(tmp_path, missing):
    """Ten 1000 µs steps, each with a 100 µs kernel, a 400 µs gap, then another; a sync outside
    any operator ("other") returns in the gap of all but `missing` steps. The idle the syncs end
    in (400 µs each, about 36-40 % of the window) is far above its threshold: the count
    decides."""
    steps, step_us = 10, 1000.0
    syncs = round(HOST_SYNC_PER_STEP_MIN * steps) - missing
    assert syncs <= steps  # one sync per step at most, as laid out
    built = KinetoTrace()
    built.gpu()
    for index in range(steps):
        at = T0 + index * step_us
        built.step(index + 1, at, step_us)
        built.launch(at + 1, 5, at + 10, 100, name=BF16_GEMM)
        if index < syncs:
            built.runtime("cudaStreamSynchronize", at + 20, 91)  # returns at +111, GPU idle
        built.launch(at + 500, 5, at + 510, 100, name=BF16_GEMM)
    result = analysed(tmp_path, built)
    gpu = result["gpu"]
    assert gpu["syncs_by_cause_per_step"]["other"] == syncs / steps
    assert gpu["sync_idle_pct_by_cause"]["other"] == pytest.approx(
        100 * syncs * 400 / (steps * step_us))
    assert ids_of(result) == only("host_sync", missing == 0)


@pytest.mark.parametrize("pct, fires", edges(H2D_MIN_PCT, AT_LEAST))
def test_exposed_copy_share_on_a_trace(tmp_path, pct, fires):
    """One 1000 µs step: a pinned host-to-device copy of pct % of it, then one kernel to 5 µs
    before the step's end; no kernel runs beside the copy, so all of it is exposed."""
    step_us = 1000.0
    copy_us = step_us * pct / 100  # 100 µs at 10 %: exact
    built = KinetoTrace()
    built.gpu()
    built.step(1, T0, step_us)
    built.memcpy(T0 + 1, 1, T0 + 5, copy_us, host_memory="Pinned")
    built.launch(T0 + 3, 1, T0 + 5 + copy_us, step_us - 10 - copy_us, name=BF16_GEMM)
    result = analysed(tmp_path, built)
    exposed = result["gpu"]["h2d_exposed_pct"]
    assert exposed == pytest.approx(pct, rel=EPS / 100)
    assert (exposed >= H2D_MIN_PCT) is fires
    assert ids_of(result) == only("h2d_copy", fires)


@pytest.mark.parametrize("pct, bytes_short, level", [
    pytest.param(ACTIVATION_MEMORY_MIN_PCT, 1, None, id="min-byte-below"),
    pytest.param(ACTIVATION_MEMORY_MIN_PCT, 0, "medium", id="min-first-byte"),
    pytest.param(ACTIVATION_MEMORY_HIGH_PCT, 1, "medium", id="high-byte-below"),
    pytest.param(ACTIVATION_MEMORY_HIGH_PCT, 0, "high", id="high-first-byte"),
])
def test_peak_memory_share_on_a_trace(tmp_path, pct, bytes_short, level):
    """The healthy run with its peak allocation at the first byte that reaches pct % of the H100's
    memory, or the byte before it: the bytes are integers, so the edge is exact to a byte."""
    first_byte = math.ceil(Fraction(H100_MEMORY_BYTES) * Fraction(pct) / 100)
    built = KinetoTrace()
    built.gpu()
    simulate_training(built, peak_memory_bytes=first_byte - bytes_short)
    found = {f["id"]: f for f in analysed(tmp_path, built)["findings"]}
    assert list(found) == only("activation_memory", level is not None)
    if level:
        assert found["activation_memory"]["severity"] == level


# --- host_overhead and exposed_communication ----------------------------------------------------

def with_wait(m: dict, launch_idle_pct: float) -> dict:
    """Changed metrics (a copy) with the GPU waiting launch_idle_pct of the window for the host's
    next enqueue (gpu.idle_by_cause_pct's "launch"); launch calls as they were."""
    m["gpu"]["idle_by_cause_pct"] = {**m["gpu"]["idle_by_cause_pct"], "launch": launch_idle_pct}
    return m


def waiting(base: dict, launch_idle_pct: float) -> dict:
    """The base (not launch bound) with the GPU waiting for the host."""
    return with_wait(changed(base), launch_idle_pct)


@pytest.mark.parametrize("pct, fires", edges(HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT, AT_LEAST))
def test_host_overhead_fires_from_its_waiting_share_on(base, pct, fires):
    assert verdicts.launch_to_kernel_ratio(base["gpu"]) is None  # not launch bound
    assert finding_ids(waiting(base, pct)) == only("host_overhead", fires)


@pytest.mark.parametrize("batch, verdict", [
    pytest.param(float(SMALL_BATCH_INPUT_BATCH_BELOW - 1), "small_batch", id="small"),
    pytest.param(float(SMALL_BATCH_INPUT_BATCH_BELOW), "host_overhead", id="not-small"),
    pytest.param(None, "host_overhead", id="no-shapes"),
])
def test_the_input_batch_decides_small_batch_or_host_overhead(base, batch, verdict):
    """An under-filled GPU waiting for the host: small_batch only where the shapes show a
    small batch; exactly one of the two fires."""
    m = with_wait(underfilled(base, input_batch=batch), HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT * 1.5)
    assert finding_ids(m) == [verdict]


def test_a_small_batch_stays_small_batchs_where_small_batch_gives_way(base):
    """A small batch on an under-filled GPU whose idle time the DataLoader explains: small_batch
    gives way to the named cause (peers' rule), and host_overhead does not claim the batch's
    wait either; at batch 64 (not small) host_overhead names it, its evidence without a
    "small" batch."""
    def run(batch: float) -> dict:
        return with_wait(underfilled(base, input_batch=batch,
                                     dataloader_pct=DATALOADER_SHARE_MIN_PCT),
                         HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT * 1.5)
    assert finding_ids(run(8.0)) == ["dataloader"]
    large = run(float(SMALL_BATCH_INPUT_BATCH_BELOW))
    assert sorted(finding_ids(large)) == ["dataloader", "host_overhead"]
    assert "not small" in by_id(large)["host_overhead"]["evidence"]


def test_host_overhead_evidence_says_small_only_where_it_is(base):
    """Kernels not short (no under-filled GPU) at batch 8: host_overhead, whose evidence quotes
    the batch without calling it "not small"."""
    m = with_wait(changed(base, input_batch=8.0), HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT * 1.5)
    found = by_id(m)["host_overhead"]["evidence"]
    assert "batch 8 at the conv/linear inputs" in found and "not small" not in found


@pytest.mark.parametrize("pct, level", [
    (100 - (100 - HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT) / SEVERITY_HIGH_FACTOR, "high"),
    (below(100 - (100 - HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT) / SEVERITY_HIGH_FACTOR), "medium"),
])
def test_host_overhead_is_high_when_the_gpu_works_half_the_rules_share(base, pct, level):
    """Severity on the share the GPU is not waiting (twice a 50 % wait cannot be reached):
    high from 75 %."""
    assert by_id(waiting(base, pct))["host_overhead"]["severity"] == level


@pytest.mark.parametrize("pct, fires", edges(EXPOSED_COMM_MIN_PCT, AT_LEAST))
def test_exposed_communication_fires_from_its_share_on(base, pct, fires):
    m = changed(base, gpu={"exposed_comm_pct": pct})
    assert finding_ids(m) == only("exposed_communication", fires)


# --- host_region: which share it reads, and small_batch's hand-off to it ------------------------

def with_regions(m: dict, **regions: tuple[float, float]) -> dict:
    """Changed metrics (a copy) with host regions name=(pct of the window, GPU idle it causes,
    % of the window); the other fields are the evidence's only."""
    m["host_regions"] = {name: {"pct": pct, "gpu_idle_pct": idle, "ms_per_step": 1.0,
                                "outside_ops_pct": 100.0}
                         for name, (pct, idle) in regions.items()}
    return m


@pytest.mark.parametrize("idle_pct, fires", edges(HOST_REGION_MIN_PCT, AT_LEAST))
def test_on_a_gpu_host_region_reads_the_gpu_idle_it_causes_not_its_window_share(
        base, idle_pct, fires):
    """The window share is set to the opposite side of the threshold from the idle share, so a
    rule reading the wrong one flips the answer either way."""
    window_pct = HOST_REGION_MIN_PCT / COMFORT if fires else HOST_REGION_MIN_PCT * COMFORT
    m = with_regions(changed(base), tokenize=(window_pct, idle_pct))
    assert finding_ids(m) == only("host_region", fires)
    if fires:
        assert f"the GPU idles {idle_pct:.0f} % of the window" in by_id(m)["host_region"][
            "evidence"]


def test_on_a_gpu_host_region_names_the_region_the_gpu_waits_on_most(base):
    """Two regions: 'render' holds more of the window, 'tokenize' causes more GPU idle time."""
    m = with_regions(changed(base), render=(HOST_REGION_MIN_PCT * 3, HOST_REGION_MIN_PCT / 2),
                     tokenize=(HOST_REGION_MIN_PCT * 1.5, HOST_REGION_MIN_PCT * 1.5))
    assert "region 'tokenize'" in by_id(m)["host_region"]["evidence"]


@pytest.mark.parametrize("pct, fires", edges(HOST_REGION_MIN_PCT, AT_LEAST))
def test_without_a_gpu_host_region_reads_its_window_share(base, pct, fires):
    m = with_regions(changed(base), tokenize=(pct, None))
    m["gpu"] = None  # a CPU-only trace: no GPU idle to read
    assert finding_ids(m) == only("host_region", fires)


@pytest.mark.parametrize("idle_pct, verdict", [
    pytest.param(below(HOST_REGION_MIN_PCT), "small_batch", id="below"),
    pytest.param(HOST_REGION_MIN_PCT, "host_region", id="at"),
])
def test_small_batch_gives_way_to_host_region_at_its_threshold(base, idle_pct, verdict):
    """An under-filled GPU whose idle time a host region explains (a tokenizer on a GPU run with
    short kernels): the region, named, and not small_batch beside it (common/README.md's rules
    table: small_batch gives way to it as to dataloader); below the region's threshold
    small_batch fires alone."""
    m = with_regions(underfilled(base), tokenize=(HOST_REGION_MIN_PCT / COMFORT, idle_pct))
    assert finding_ids(m) == [verdict]


# --- CUDA graphs: "most kernels replayed" at its edge -------------------------------------------

GRAPH_KERNELS_PER_STEP = 400.0  # kernels a step; the replayed ones a share of it
GRAPH_LAUNCHES_PER_STEP = 2.0


def replaying(base: dict, replayed_pct: float) -> dict:
    """A training step (its pair: launch_overhead), launch bound by the eager launches, with
    replayed_pct % of the kernels replayed from GRAPH_LAUNCHES_PER_STEP graph launches a step."""
    replayed = GRAPH_KERNELS_PER_STEP * replayed_pct / 100
    return launch_bound(base, training=True, gpu={
        "kernels_per_step": GRAPH_KERNELS_PER_STEP, "graph_kernels_per_step": replayed,
        "graph_launches_per_step": GRAPH_LAUNCHES_PER_STEP, "graph_launch_ms_per_step": 0.0,
        "launches_per_step": GRAPH_KERNELS_PER_STEP - replayed + GRAPH_LAUNCHES_PER_STEP})


@pytest.mark.parametrize("replayed_pct, replayed", edges(GRAPH_REPLAYED_MIN_PCT, AT_LEAST))
def test_most_kernels_replayed_from_its_share_on(base, replayed_pct, replayed):
    m = replaying(base, replayed_pct)
    assert verdicts.graph_replayed(m["gpu"]) is replayed
    found = by_id(m)
    assert list(found) == ["launch_overhead"]  # launch bound either way: the fix differs
    launch = found["launch_overhead"]
    kernels = GRAPH_KERNELS_PER_STEP * replayed_pct / 100
    assert (f"besides {GRAPH_LAUNCHES_PER_STEP:.0f} CUDA graph launches a step replaying "
            f"{kernels:.0f} kernels, not counted") in launch["evidence"]
    if replayed:  # the step is captured: what is left is the eager ops between the replays
        assert launch["fix"].startswith(
            f"the kernels are already replayed from {GRAPH_LAUNCHES_PER_STEP:.0f} CUDA graph "
            f"launches a step ({kernels:.0f} of {GRAPH_KERNELS_PER_STEP:.0f}): the launches "
            f"left are the eager ops between the replays")
        assert launch["demo"] is None  # both pairs' fix is in place
    else:
        assert launch["fix"].startswith("launch fewer, larger kernels: torch.compile")
        assert launch["demo"] == "launch_overhead"


@pytest.mark.parametrize("replayed_pct, replayed", edges(GRAPH_REPLAYED_MIN_PCT, AT_LEAST))
def test_host_overhead_speaks_of_the_replays_from_the_same_share(base, replayed_pct, replayed):
    m = with_wait(changed(base, gpu={
        "kernels_per_step": GRAPH_KERNELS_PER_STEP,
        "graph_kernels_per_step": GRAPH_KERNELS_PER_STEP * replayed_pct / 100,
        "graph_launches_per_step": GRAPH_LAUNCHES_PER_STEP, "graph_launch_ms_per_step": 0.0},
        training=True), HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT * 1.5)
    found = by_id(m)["host_overhead"]
    assert ("what is left is the host's work between the replays" in found["fix"]) is replayed
    assert found["demo"] == (None if replayed else "launch_overhead")


# --- The short-kernel cut: a kernel of exactly SHORT_KERNEL_US is not short ---------------------

@pytest.mark.parametrize("kernel_us, short", [
    pytest.param(SHORT_KERNEL_US - 1, True, id="a-microsecond-under"),
    pytest.param(SHORT_KERNEL_US, False, id="exactly"),  # whole-µs traces write many such
    pytest.param(SHORT_KERNEL_US + 1, False, id="a-microsecond-over"),
])
def test_a_kernel_is_short_only_under_the_cut(tmp_path, kernel_us, short):
    """Ten kernels of one length in a step (whole microseconds, as many traces write them): all
    short or none."""
    built = KinetoTrace()
    built.gpu()
    built.step(1, T0, 1000)
    for index in range(10):
        at = T0 + 1 + index * 50
        built.launch(at, 1, at + 5, kernel_us, name=ELEMENTWISE)
    gpu = analysed(tmp_path, built)["gpu"]
    assert gpu["median_kernel_us"] == kernel_us
    assert gpu["short_kernel_pct"] == (100.0 if short else 0.0)


@pytest.mark.parametrize("ratio, verdict", [
    pytest.param(below(LAUNCH_TO_KERNEL_TIME_MIN), "host_overhead", id="below"),
    pytest.param(LAUNCH_TO_KERNEL_TIME_MIN, "launch_overhead", id="at"),
])
def test_host_overhead_gives_way_to_launch_overhead_at_its_ratio(base, ratio, verdict):
    """A GPU waiting for the host's enqueues, with mostly short kernels: once the launch calls
    take as long as the kernels the launches explain the wait (launch_overhead, alone); short
    of that the host's time goes elsewhere (host_overhead, alone)."""
    m = with_wait(launch_bound(base, ratio=ratio), HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT * 1.5)
    assert finding_ids(m) == [verdict]


# --- The sync that ends a step: host_overhead's, not host_sync's --------------------------------

def step_end_syncs(base: dict, launch_pct: float, step_end_pct: float, mid_step_pct: float,
                   per_step: float = HOST_SYNC_PER_STEP_MIN * COMFORT) -> dict:
    """The base with the GPU waiting launch_pct of the window for enqueues, and other syncs (per
    step) whose gaps hold step_end_pct (gaps that outlast their step: the host's work between
    steps) and mid_step_pct (gaps inside their steps) of the window."""
    m = changed(base, syncs={"other": per_step},
                sync_idle={"other": step_end_pct + mid_step_pct})
    m["gpu"]["step_end_sync_idle_pct_by_cause"] = {
        **m["gpu"]["step_end_sync_idle_pct_by_cause"], "other": step_end_pct}
    m["gpu"]["idle_by_cause_pct"] = {**m["gpu"]["idle_by_cause_pct"], "launch": launch_pct,
                                     "host_sync": step_end_pct + mid_step_pct}
    return m


@pytest.mark.parametrize("step_end_pct, verdicts_", [
    pytest.param(below(HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT), ["host_sync"], id="below"),
    pytest.param(HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT, ["host_overhead"], id="at"),
    pytest.param(above(HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT), ["host_overhead"], id="above"),
])
def test_a_sync_that_ends_each_step_is_host_overheads_from_its_threshold_on(
        base, step_end_pct, verdicts_):
    """One sync at the end of each step, the GPU then idle while the host works between steps:
    the host-side idle (launch waits plus those gaps) reaches host_overhead's threshold, and
    host_sync does not claim the same gaps; below it, the sync's gaps are host_sync's."""
    assert finding_ids(step_end_syncs(base, 0.0, step_end_pct, 0.0)) == verdicts_


def test_host_side_idle_adds_launch_waits_and_step_end_gaps(base):
    """Half the threshold each way: neither alone fires host_overhead, together they do."""
    half = HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT / 2
    assert verdicts.host_side_idle_pct(step_end_syncs(base, half, half, 0.0)["gpu"]) == \
        pytest.approx(HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT)
    assert finding_ids(step_end_syncs(base, half, half, 0.0)) == ["host_overhead"]
    assert finding_ids(waiting(base, half)) == []


@pytest.mark.parametrize("mid_step_pct, fires", edges(HOST_SYNC_IDLE_MIN_PCT, AT_LEAST))
def test_host_sync_beside_host_overhead_reads_its_mid_step_gaps(base, mid_step_pct, fires):
    """Where host_overhead takes the step-end gaps, host_sync fires on the gaps inside the steps
    alone, at its own threshold, and says so."""
    m = step_end_syncs(base, 0.0, HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT * 1.5, mid_step_pct)
    assert finding_ids(m) == ["host_overhead"] + only("host_sync", fires)
    if fires:
        assert "in the gaps they end in within their steps" in by_id(m)["host_sync"]["evidence"]


def test_step_end_gaps_count_at_most_the_idle_splits_host_sync_share(base):
    """A step-end gap that the idle split gives to another cause (the DataLoader, a host region)
    is not host-side idle twice over."""
    m = step_end_syncs(base, 0.0, HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT * 1.5, 0.0)
    m["gpu"]["idle_by_cause_pct"]["host_sync"] = below(HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT)
    assert verdicts.host_side_idle_pct(m["gpu"]) == below(HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT)
    assert "host_overhead" not in finding_ids(m)
