"""Host syncs attributed to the operator that issued them, and the verdict that follows: a value
read (.item(), .cpu(), nonzero) is host_sync's and its fix names the reads; a sync inside a
host-to-device copy (pageable memory, or a blocking copy) is h2d_copy's, whose fix is pinned
memory, and it does not hide small_batch; anything else (torch.cuda.synchronize()) is host_sync's
with a fix that finds the call. Also: cuda_sync events counted once with their runtime call, and
HIP (ROCm) names read as CUDA's."""
from __future__ import annotations

import numpy as np
import pytest

from common import analyze
from common.intervals import Spans
from common.syncs import innermost_holders
from tests.kineto_builder import KinetoTrace

T0 = 1_000_000.0  # µs
STEP_US = 1000.0
STEPS = 3
WINDOW_US = STEPS * STEP_US  # the steps touch; all GPU work ends inside its step
# Where a step's sync blocks start, and where the kernels after each block are launched, µs after
# the step's start: one block (10 kernels after it), or two (5 kernels after each).
ONE_BLOCK = ((10, 200, 10),)
TWO_BLOCKS = ((10, 200, 5), (450, 600, 5))
# By hand, for every step (S = its start): a block at B has its 10 µs GPU copy at B+25 .. B+35
# and its sync returning at B+90; the next kernel starts at K+10 (launched at K). The GPU idles
# from the copy's end to that kernel: block 1 (B = S+10): S+45 .. S+210 = 165 µs; block 2
# (B = S+450): S+485 .. S+610 = 125 µs. Over 3 steps in a 3000 µs window: 16.5 % and 12.5 %.
FIRST_GAP_PCT = 100 * 3 * 165 / WINDOW_US
SECOND_GAP_PCT = 100 * 3 * 125 / WINDOW_US
# Kernels: 10 per step of 5 µs each (launch calls of 4 µs), median 5 µs, all short, launch time
# 0.8x kernel time (not launch bound): an under-filled GPU. With the sync block's 10 µs copy a step,
# utilization (kernels, copies, memsets) is 180 / 3000 = 6 %.
UTILIZATION_PCT = 100 * 3 * (10 * 5 + 10) / WINDOW_US

# The operators around each kind of sync, outermost first, as PyTorch records them, and the
# direction of the copy inside (None: no operator, the copy and the sync at top level).
BLOCKS = {
    "h2d_copy": (("aten::to", "aten::_to_copy", "aten::copy_"), "HtoD"),  # x.to(device)
    "cpu": (("aten::to", "aten::_to_copy", "aten::copy_"), "DtoH"),  # loss.cpu()
    "item": (("aten::item", "aten::_local_scalar_dense"), "DtoH"),  # loss.item()
    "nonzero": (("aten::nonzero",), "DtoH"),  # x[mask]: the output's size is read
    "synchronize": ((), "HtoD"),  # torch.cuda.synchronize() after a copy, outside any operator
}


def sync_block(t: KinetoTrace, at: float, block: str, host_memory: str = "Pageable",
               sync_api: str = "cudaStreamSynchronize", tid=None) -> int:
    """At `at` µs: the block's operators (100 µs, nested 2 µs in on each side), a copy launched
    at +10 that runs on the GPU at +25 .. +35, and the sync call at +30 .. +90. Returns the sync
    call's correlation id."""
    ops, kind = BLOCKS[block]
    for depth, name in enumerate(ops):
        t.op(name, at + 2 * depth, 100 - 4 * depth, tid=tid)
    t.memcpy(at + 10, 10, at + 25, 10, kind=kind, host_memory=host_memory, tid=tid)
    api = sync_api if ops else "cudaDeviceSynchronize"
    return t.runtime(api, at + 30, 60, tid=tid)


# The MLP's batch, as record_shapes writes it at its first linear layer: small (under
# verdicts.SMALL_BATCH_INPUT_BATCH_BELOW), so the under-filled GPU is a small batch's, not the
# host's (host_overhead), where no sync explains it.
MLP_LINEAR_BATCH_8 = [[8, 64], [64, 64], [64]]


def mlp_trace(*blocks: str, layout=None, vocabulary: str = "current", **options) -> KinetoTrace:
    """Three steps of a tiny MLP at batch 8 on an under-filled GPU, each with these sync blocks
    in order (layout: ONE_BLOCK or TWO_BLOCKS, by how many)."""
    t = KinetoTrace(vocabulary=vocabulary)
    t.gpu()
    layout = layout or (ONE_BLOCK if len(blocks) == 1 else TWO_BLOCKS)
    for number in range(1, STEPS + 1):
        start = T0 + (number - 1) * STEP_US
        t.step(number, start, STEP_US)
        t.op_with_shapes("aten::linear", start + 1, 1, MLP_LINEAR_BATCH_8)
        for block, (at, launch_at, kernels) in zip(blocks, layout):
            sync_block(t, start + at, block, **options)
            for k in range(kernels):
                t.launch(start + launch_at + 50 * k, 4, start + launch_at + 10 + 50 * k, 5)
    return t


def analysed(tmp_path, built: KinetoTrace) -> dict:
    return analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json"))


def ids(result: dict) -> list[str]:
    return [f["id"] for f in result["findings"]]


def by_id(result: dict) -> dict[str, dict]:
    return {f["id"]: f for f in result["findings"]}


def causes(value_read=0.0, h2d_copy=0.0, other=0.0) -> dict:
    return {"value_read": value_read, "h2d_copy": h2d_copy, "other": other}


@pytest.mark.parametrize("vocabulary", ["current", "2021", "tensorboard"])
def test_a_pageable_copy_sync_is_h2d_copy_and_does_not_hide_small_batch(tmp_path, vocabulary):
    """x.to(device, non_blocking=True) from pageable memory: cudaStreamSynchronize inside
    aten::copy_ <- aten::_to_copy <- aten::to, with Memcpy HtoD (Pageable -> Device). By hand:
    1 sync per step, 16.5 % of the window idle after it; the GPU is 6 % busy (5 µs kernels and the
    copy)."""
    result = analysed(tmp_path, mlp_trace("h2d_copy", vocabulary=vocabulary))
    gpu = result["gpu"]
    assert gpu["syncs_per_step"] == 1.0
    assert gpu["syncs_by_cause_per_step"] == causes(h2d_copy=1.0)
    assert gpu["sync_idle_pct_by_cause"] == pytest.approx(causes(h2d_copy=FIRST_GAP_PCT))
    assert gpu["sync_idle_pct"] == pytest.approx(FIRST_GAP_PCT)
    assert gpu["sync_sources_per_step"]["h2d_copy"] == {"aten::copy_ (HtoD, pageable)": 1.0}
    assert gpu["utilization_pct"] == pytest.approx(UTILIZATION_PCT)
    assert ids(result) == ["small_batch", "h2d_copy"]
    found = by_id(result)["h2d_copy"]
    assert found["severity"] == "high" and found["demo"] == "dataloader_workers"
    assert "pin_memory=True" in found["fix"] and "non_blocking=True" in found["fix"]
    assert "aten::copy_ (HtoD, pageable) 1.0/step" in found["evidence"]
    assert not any(".item()" in f["fix"] for f in result["findings"])


def test_a_blocking_copy_from_pinned_memory_is_h2d_copy_too(tmp_path):
    """x.to(device) (non_blocking=False) from a pinned batch still waits: Memcpy HtoD (Pinned ->
    Device) then the sync, inside aten::copy_."""
    gpu = analysed(tmp_path, mlp_trace("h2d_copy", host_memory="Pinned"))["gpu"]
    assert gpu["syncs_by_cause_per_step"] == causes(h2d_copy=1.0)
    assert gpu["sync_sources_per_step"]["h2d_copy"] == {"aten::copy_ (HtoD)": 1.0}


@pytest.mark.parametrize("block, source", [
    ("item", "aten::_local_scalar_dense"),
    ("cpu", "aten::copy_ (DtoH)"),
    ("nonzero", "aten::nonzero"),
])
def test_a_value_read_is_host_sync_and_its_fix_names_the_reads(tmp_path, block, source):
    """loss.item(), loss.cpu() and x[mask] make the host wait for a value: host_sync, whose fix
    names .item()/.cpu(); small_batch stays silent, since the syncs explain the idle GPU."""
    result = analysed(tmp_path, mlp_trace(block))
    gpu = result["gpu"]
    assert gpu["syncs_by_cause_per_step"] == causes(value_read=1.0)
    assert gpu["sync_idle_pct_by_cause"] == pytest.approx(causes(value_read=FIRST_GAP_PCT))
    assert gpu["sync_sources_per_step"]["value_read"] == {source: 1.0}
    assert ids(result) == ["host_sync"]
    found = by_id(result)["host_sync"]
    assert ".item()" in found["fix"] and found["demo"] == "item_sync"
    assert f"{source} 1.0/step" in found["evidence"]


def test_a_sync_outside_any_operator_is_other_and_the_fix_finds_the_call(tmp_path):
    """torch.cuda.synchronize() in the loop: cudaDeviceSynchronize with no operator around it."""
    result = analysed(tmp_path, mlp_trace("synchronize"))
    gpu = result["gpu"]
    assert gpu["syncs_by_cause_per_step"] == causes(other=1.0)
    assert gpu["sync_sources_per_step"]["other"] == {"(no operator)": 1.0}
    assert ids(result) == ["host_sync"]
    fix = by_id(result)["host_sync"]["fix"]
    assert "set_sync_debug_mode" in fix and ".item()" not in fix


@pytest.mark.parametrize("blocks, reads_dominate", [
    (("item", "synchronize"), True),  # the read returns in the 165 µs gap, the other in 125
    (("synchronize", "item"), False),
])
def test_the_fix_names_the_reads_only_when_they_cost_the_most(tmp_path, blocks, reads_dominate):
    result = analysed(tmp_path, mlp_trace(*blocks))
    gpu = result["gpu"]
    first, second = ("value_read", "other") if reads_dominate else ("other", "value_read")
    assert gpu["sync_idle_pct_by_cause"][first] == pytest.approx(FIRST_GAP_PCT)
    assert gpu["sync_idle_pct_by_cause"][second] == pytest.approx(SECOND_GAP_PCT)
    assert gpu["syncs_per_step"] == 2.0
    assert ids(result) == ["host_sync"]
    assert (".item()" in by_id(result)["host_sync"]["fix"]) == reads_dominate


def test_copy_syncs_and_value_reads_each_get_their_verdict(tmp_path):
    """A pageable input copy (165 µs gaps) and a loss.item() (125 µs gaps) per step: h2d_copy
    reads the first, host_sync the second; small_batch defers to host_sync."""
    result = analysed(tmp_path, mlp_trace("h2d_copy", "item"))
    gpu = result["gpu"]
    assert gpu["syncs_by_cause_per_step"] == causes(value_read=1.0, h2d_copy=1.0)
    assert gpu["sync_idle_pct_by_cause"] == pytest.approx(
        causes(value_read=SECOND_GAP_PCT, h2d_copy=FIRST_GAP_PCT))
    assert sorted(ids(result)) == ["h2d_copy", "host_sync"]
    # The host line prints 2.0 syncs/step; host_sync's count says it is the part of those 2.0
    # outside the copies, so the two counts do not read as one quantity with two values.
    assert by_id(result)["host_sync"]["evidence"].startswith(
        "host syncs: 1.0 per step (of 2.0 syncs/step, the rest in host-to-device copies; 1.0 "
        "read a value from the GPU;")


def test_without_copy_syncs_host_syncs_are_all_the_syncs(tmp_path):
    """No copy syncs: host_sync's count is the host line's syncs/step, said once."""
    evidence = by_id(analysed(tmp_path, mlp_trace("item")))["host_sync"]["evidence"]
    assert evidence.startswith("host syncs: 1.0 per step (1.0 read a value from the GPU;")


def test_a_gap_counts_once_for_the_sync_that_waited(tmp_path):
    """A value read, then torch.cuda.synchronize() just after its operators end (B+102 ..
    B+105): both return in the same idle gap; the first waited for it, the second at once."""
    t = mlp_trace("item")
    for number in range(STEPS):
        t.runtime("cudaDeviceSynchronize", T0 + number * STEP_US + 10 + 102, 3)
    gpu = analysed(tmp_path, t)["gpu"]
    assert gpu["syncs_by_cause_per_step"] == causes(value_read=1.0, other=1.0)
    assert gpu["sync_idle_pct_by_cause"] == pytest.approx(causes(value_read=FIRST_GAP_PCT))


def test_a_sync_is_its_own_threads_operators(tmp_path):
    """The backward thread copies (aten::copy_ on tid 2) while the main thread sits in an
    aten::item span over the same time: the sync is the copy's."""
    t = mlp_trace("h2d_copy", tid=2)
    for number in range(STEPS):
        t.op("aten::item", T0 + number * STEP_US + 5, 110)  # main thread
    gpu = analysed(tmp_path, t)["gpu"]
    assert gpu["syncs_by_cause_per_step"] == causes(h2d_copy=1.0)


def test_innermost_holders_by_hand():
    """Thread 0: A 0..100 holds B 10..20 and E 30..45, which holds C 30..40 (same start: the
    shorter is inside). Calls: 15..16 in B; 32..33 in C; 41..43 in E; 50..60 in A only (back
    past C, E and B); 150..160 in none; 32..33 on thread 1 (no operators) in none."""
    ops = Spans(np.array([0.0, 10, 30, 30]), np.array([100.0, 20, 45, 40]))
    a, b, e, c = range(4)
    calls = Spans(np.array([15.0, 32, 41, 50, 150, 32]), np.array([16.0, 33, 43, 60, 160, 33]))
    holders = innermost_holders(ops, np.zeros(4, np.int64), calls, np.array([0, 0, 0, 0, 0, 1]))
    assert holders.tolist() == [b, c, e, a, -1, -1]


def test_a_cuda_sync_event_and_its_runtime_call_are_one_sync(tmp_path):
    """Current Kineto writes a cudaStreamSynchronize twice: the runtime call and a "Stream Sync"
    cuda_sync event with its correlation id. Counted once; a "Stream Wait Event" (the GPU waits)
    not at all; an "Event Sync" with no runtime call of its own counts, by its own time, as other.
    By hand: the lone Event Sync returns at S+900, in the gap from the step's last kernel (S+665)
    to the next step's copy (S+1035), 370 µs, or to the window's end in step 3 (S+1000), 335 µs."""
    t = KinetoTrace()
    t.gpu()
    for number in range(1, STEPS + 1):
        start = T0 + (number - 1) * STEP_US
        t.step(number, start, STEP_US)
        correlation = sync_block(t, start + 10, "h2d_copy")
        t.cuda_sync("Stream Sync", start + 41, 48, correlation)
        for k in range(10):
            t.launch(start + 200 + 50 * k, 4, start + 210 + 50 * k, 5)
        wait = t.runtime("cudaStreamWaitEvent", start + 700, 2)
        t.cuda_sync("Stream Wait Event", start + 700, 1, wait)
        t.cuda_sync("Event Sync", start + 880, 20, 10_000 + number)  # no such runtime call
    gpu = analysed(tmp_path, t)["gpu"]
    assert gpu["syncs_per_step"] == 2.0
    assert gpu["syncs_by_cause_per_step"] == causes(h2d_copy=1.0, other=1.0)
    assert gpu["sync_idle_pct_by_cause"] == pytest.approx(
        causes(h2d_copy=FIRST_GAP_PCT, other=100 * (370 + 370 + 335) / WINDOW_US))


def test_a_sync_named_only_by_its_cuda_sync_event_counts(tmp_path):
    """A sync API the name pattern does not know (here a made-up per-thread variant) is a sync
    when a cuda_sync event of a host kind carries its correlation id."""
    t = KinetoTrace()
    t.gpu()
    for number in range(1, STEPS + 1):
        start = T0 + (number - 1) * STEP_US
        t.step(number, start, STEP_US)
        correlation = sync_block(t, start + 10, "item", sync_api="cudaStreamSynchronize_spt")
        t.cuda_sync("Stream Sync", start + 41, 48, correlation)
        for k in range(10):
            t.launch(start + 200 + 50 * k, 4, start + 210 + 50 * k, 5)
    gpu = analysed(tmp_path, t)["gpu"]
    assert gpu["syncs_by_cause_per_step"] == causes(value_read=1.0)
    assert gpu["sync_idle_pct"] == pytest.approx(FIRST_GAP_PCT)


# --- ROCm: HIP's names, and the device read as rocm. -------------------------------------------
HIP_LAUNCHES = ("hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel",
                "hipExtLaunchKernel", "hipGraphLaunch")
MI250_NAME = "AMD Instinct MI250X"
MI250_MEMORY_BYTES = 68_702_699_520


def rocm_trace(with_runtime: bool = True) -> KinetoTrace:
    """Three steps as PyTorch on ROCm records them: one launch of each HIP launch API, the input
    copy as a blocking hipMemcpyWithStream inside aten::copy_ (memcpy_and_sync: the copy is the
    sync), and loss.item() as hipMemcpyAsync + hipStreamSynchronize."""
    t = KinetoTrace()
    t.gpu(MI250_NAME, MI250_MEMORY_BYTES)
    for number in range(1, STEPS + 1):
        start = T0 + (number - 1) * STEP_US
        t.step(number, start, STEP_US)
        if not with_runtime:
            t.gpu_event("kernel", "Cijk_Alik_Bljk_SB_MT64x16x32", start + 210, 5, -1, start)
            continue
        for depth, name in enumerate(("aten::to", "aten::_to_copy", "aten::copy_")):
            t.op(name, start + 10 + 2 * depth, 100 - 4 * depth)
        t.memcpy(start + 20, 60, start + 25, 10, host_memory="Host", api="hipMemcpyWithStream")
        for k, api in enumerate(HIP_LAUNCHES):
            t.launch(start + 200 + 50 * k, 4, start + 210 + 50 * k, 5, api=api)
        for depth, name in enumerate(("aten::item", "aten::_local_scalar_dense")):
            t.op(name, start + 500 + 2 * depth, 100 - 4 * depth)
        t.memcpy(start + 510, 10, start + 525, 10, kind="DtoH", host_memory="Host",
                 api="hipMemcpyAsync")
        t.runtime("hipStreamSynchronize", start + 530, 60)
    return t


def test_hip_launches_and_syncs_are_read(tmp_path):
    result = analysed(tmp_path, rocm_trace())
    gpu = result["gpu"]
    assert result["device"] == "rocm" and result["gpu_name"] == MI250_NAME
    assert gpu["launches_per_step"] == len(HIP_LAUNCHES)
    assert gpu["kernels_per_step"] == len(HIP_LAUNCHES)
    assert gpu["syncs_per_step"] == 2.0  # hipMemcpyAsync is no sync
    assert gpu["syncs_by_cause_per_step"] == causes(value_read=1.0, h2d_copy=1.0)
    assert gpu["sync_sources_per_step"] == {"value_read": {"aten::_local_scalar_dense": 1.0},
                                            "h2d_copy": {"aten::copy_ (HtoD)": 1.0},
                                            "other": {}}


def test_the_device_is_rocm_by_its_properties_without_runtime_calls(tmp_path):
    assert analysed(tmp_path, rocm_trace(with_runtime=False))["device"] == "rocm"
    nvidia = KinetoTrace()
    nvidia.gpu()
    nvidia.step(1, T0, STEP_US)
    nvidia.launch(T0 + 10, 4, T0 + 20, 5)
    assert analysed(tmp_path, nvidia)["device"] == "cuda"
