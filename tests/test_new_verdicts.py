"""The unfused_optimizer and naive_attention verdicts on hand-built traces: each threshold one step
either side, and what silences each (a multi-tensor op, an SDPA op, a non-square softmax)."""
from __future__ import annotations

import json

import pytest

from common import analyze
from common.verdicts import (
    NAIVE_ATTENTION_MIN_SEQ,
    UNFUSED_OPTIMIZER_CALLS_PER_TENSOR_MIN,
    UNFUSED_OPTIMIZER_MAX_US_PER_OP,
    UNFUSED_OPTIMIZER_MIN_PCT,
)
from tests.kineto_builder import KinetoTrace

T0 = 1_000_000.0  # µs
STEP_US = 10_000.0


def optimizer_trace(pct: float, ops: int, us_per_op: float, region: str = "optimizer",
                    op_name: str | tuple[str, ...] = "aten::mul_",
                    vocabulary: str = "current") -> KinetoTrace:
    """Two CPU steps of STEP_US, each with an optimizer region of pct % of it holding `ops`
    operators spaced evenly, each lasting us_per_op (the region's time over its ops is then
    pct % x STEP_US / ops; us_per_op only sets the ops' own length). Several names: a loop over
    tensors calling them in turn, each tensor's calls in that order."""
    names = (op_name,) if isinstance(op_name, str) else op_name
    t = KinetoTrace(vocabulary=vocabulary)
    for index in range(2):
        at = T0 + index * STEP_US
        t.step(index + 1, at, STEP_US)
        t.op("aten::addmm", at + 10, 100)
        region_us = STEP_US * pct / 100
        region_at = at + STEP_US - region_us - 1
        t.annotation(region, region_at, region_us)
        for k in range(ops):
            t.op(names[k % len(names)], region_at + k * region_us / ops, us_per_op)
    return t


# The hand-built CPU steps below leave most of the window outside operators, where the CPU-run
# rules read Python between operators (tests/test_new_user_traces.py pins them): these tests
# read the other rules' findings.
CPU_RUN_RULES = ("python_between_ops", "cpu_op_overhead")


def found_ids(result: dict) -> list[str]:
    return [f["id"] for f in result["findings"] if f["id"] not in CPU_RUN_RULES]


def ids(tmp_path, built: KinetoTrace) -> list[str]:
    return found_ids(analyze.analyze_trace(built.write(tmp_path / "t.pt.trace.json")))


@pytest.mark.parametrize("vocabulary", ["2021", "current", "tensorboard"])
def test_unfused_optimizer_share_threshold(tmp_path, vocabulary):
    # 200 ops in a region of 15.1 % of 10 ms: 7.55 µs of region per op.
    above = optimizer_trace(UNFUSED_OPTIMIZER_MIN_PCT + 0.1, 200, 5, vocabulary=vocabulary)
    result = analyze.analyze_trace(above.write(tmp_path / "a.json"))
    assert result["optimizer"]["pct"] == pytest.approx(UNFUSED_OPTIMIZER_MIN_PCT + 0.1)
    assert result["optimizer"]["ms_per_step"] == pytest.approx(STEP_US * 0.151 / 1000)
    assert result["optimizer"]["ops_per_step"] == 200
    assert found_ids(result) == ["unfused_optimizer"]
    below = optimizer_trace(UNFUSED_OPTIMIZER_MIN_PCT - 0.1, 200, 5, vocabulary=vocabulary)
    assert ids(tmp_path, below) == []


def test_unfused_optimizer_per_op_threshold(tmp_path):
    region_us = STEP_US * 0.30  # 30 % of the step, 3000 µs
    under = round(region_us / (UNFUSED_OPTIMIZER_MAX_US_PER_OP - 0.5))  # 154 ops: 19.5 µs each
    over = round(region_us / (UNFUSED_OPTIMIZER_MAX_US_PER_OP + 0.5))  # 146 ops: 20.5 µs each
    assert ids(tmp_path, optimizer_trace(30, under, 5)) == ["unfused_optimizer"]
    assert ids(tmp_path, optimizer_trace(30, over, 5)) == []  # the time is bytes, not overhead


# One tensor's calls in a for-loop AdamW (torch.optim's _single_tensor_adamw, as the ladder's
# rung 4 records it, the copies they nest aside), and in SGD with momentum.
ADAMW_LOOP = ("aten::mul_", "aten::lerp_", "aten::mul_", "aten::addcmul_", "aten::sqrt",
              "aten::div", "aten::add_", "aten::addcdiv_")
SGD_MOMENTUM_LOOP = ("aten::mul_", "aten::add_", "aten::add_")


@pytest.mark.parametrize("loop, fires", [
    (ADAMW_LOOP, True),  # 8 calls a tensor: passes a fused kernel makes one
    (SGD_MOMENTUM_LOOP, True),  # 3: the threshold
    (("aten::mul_", "aten::add_"), False),  # 2 (each name once a tensor)
    (("aten::add_",), False),  # plain SGD: one pass a tensor, its time the bytes
])
def test_unfused_optimizer_passes_per_tensor_over_the_per_op_cut(tmp_path, loop, fires):
    """Operators slower than the per-operator cut (27 µs each, as the ladder's rung 1 measured
    over ResNet-18's large tensors) still leave a fused kernel less to do where the loop calls
    several per tensor: each reads and writes the whole tensor."""
    region_us = STEP_US * 0.30
    ops = round(region_us / 27.0) // len(loop) * len(loop)  # whole tensors
    built = optimizer_trace(30, ops, 5, op_name=loop)
    result = analyze.analyze_trace(built.write(tmp_path / "t.json"))
    optimizer = result["optimizer"]
    assert optimizer["ms_per_step"] * 1000 / optimizer["ops_per_step"] > (
        UNFUSED_OPTIMIZER_MAX_US_PER_OP)
    assert optimizer["tensors_per_step"] == ops // len(loop)
    assert optimizer["calls_per_tensor"] == pytest.approx(len(loop))
    assert (found_ids(result) == ["unfused_optimizer"]) is fires
    if fires:
        evidence = next(f["evidence"] for f in result["findings"]
                        if f["id"] == "unfused_optimizer")
        assert f"{len(loop)} calls per parameter tensor ({ops // len(loop)} tensors)" in evidence
    assert (len(loop) >= UNFUSED_OPTIMIZER_CALLS_PER_TENSOR_MIN) is fires


def test_a_multi_tensor_op_or_no_region_silences_it(tmp_path):
    assert ids(tmp_path, optimizer_trace(30, 200, 5, op_name="aten::_foreach_mul_")) == []
    assert ids(tmp_path, optimizer_trace(30, 200, 5, op_name="aten::_fused_adamw_")) == []
    result = analyze.analyze_trace(optimizer_trace(30, 200, 5, region="forward")
                                   .write(tmp_path / "t.json"))
    # No optimizer region, so no unfused_optimizer. Nor is the region named forward host work
    # (idle_causes.host_regions): two thirds of its time lies outside operators (5 µs operators
    # every 15 µs), under the four fifths a region of host work needs.
    assert result["optimizer"] is None
    assert found_ids(result) == []
    assert "forward" not in (result["host_regions"] or {})


def test_torch_optims_own_step_span_is_the_region(tmp_path):
    """A trace recorded without our harness: torch.optim's Optimizer.step#AdamW.step span."""
    built = optimizer_trace(30, 200, 5, region="Optimizer.step#AdamW.step")
    result = analyze.analyze_trace(built.write(tmp_path / "t.json"))
    assert result["optimizer"]["pct"] == pytest.approx(30)
    assert found_ids(result) == ["unfused_optimizer"]


def attention_trace(softmax_dims: list, sdpa: bool = False) -> KinetoTrace:
    t = KinetoTrace()
    t.step(1, T0, STEP_US)
    t.span("op", "aten::softmax", T0 + 100, 500, **{"Input Dims": softmax_dims})
    t.span("op", "aten::_softmax", T0 + 110, 480, **{"Input Dims": softmax_dims})
    if sdpa:  # elsewhere in the step, SDPA does the attention (and a softmax is something else)
        t.op("aten::scaled_dot_product_attention", T0 + 1000, 500)
    return t


@pytest.mark.parametrize("side, fires", [(NAIVE_ATTENTION_MIN_SEQ, True),
                                         (NAIVE_ATTENTION_MIN_SEQ - 1, False)])
def test_naive_attention_sequence_threshold(tmp_path, side, fires):
    built = attention_trace([[4, 8, side, side], [], []])
    result = analyze.analyze_trace(built.write(tmp_path / "t.json"))
    assert result["attention"] == {"square_softmax_max": side, "sdpa_ops_per_step": 0.0}
    assert found_ids(result) == (["naive_attention"] if fires else [])


def test_naive_attention_needs_a_square_softmax_and_no_sdpa(tmp_path):
    assert ids(tmp_path, attention_trace([[4, 1024, 50000], [], []])) == []  # a vocabulary softmax
    assert ids(tmp_path, attention_trace([[4, 8, 1024, 1024], [], []], sdpa=True)) == []
    no_shapes = analyze.analyze_trace(attention_trace("").write(tmp_path / "t.json"))
    assert no_shapes["attention"]["square_softmax_max"] is None and found_ids(no_shapes) == []


def test_collectives_without_distributed_info(tmp_path, capsys):
    """A rank's trace that lost its distributedInfo: the collectives still count, the rest is
    said to be unknown (not "None")."""
    t = KinetoTrace()
    t.step(1, T0, STEP_US)
    t.annotation("gloo:all_reduce", T0 + 100, 2500)
    t.annotation("gloo:all_reduce", T0 + 5000, 2500)
    path = t.write(tmp_path / "t.json")
    result = analyze.analyze_trace(path)
    assert result["distributed"] == {"backend": None, "rank": None, "world_size": None,
                                     "collectives_per_step": 2.0, "collective_ms_per_step": 5.0,
                                     "comm_pct": 50.0, "ddp_forwards_per_step": 0.0,
                                     "synced_forwards_per_step": 0.0}
    assert analyze.main([str(path)]) == 0
    assert ("distributed  unknown backend rank n/a of n/a: 2.0 collectives/step, 5.0 ms/step in "
            "them (50.0 % of the steps)") in capsys.readouterr().out


def ddp_trace(rank: int, micro_batches: int, synced: int, wait_us: float,
              step_us: float = STEP_US, steps: int = 2) -> KinetoTrace:
    """`steps` steps of `micro_batches` DDP forwards each; the last `synced` micro-batches end in
    an all-reduce of wait_us (gloo span and its c10d op); distributedInfo of a 2-rank job."""
    t = KinetoTrace(cpu_pid=100 + rank)
    for index in range(steps):
        at = T0 + index * step_us
        t.step(index + 1, at, step_us)
        slot = step_us / micro_batches
        for micro in range(micro_batches):
            begin = at + micro * slot
            t.annotation("DistributedDataParallel.forward", begin + 10, slot / 4)
            if micro >= micro_batches - synced:
                t.op("c10d::allreduce_", begin + slot / 2, 20)
                t.annotation("gloo:all_reduce", begin + slot / 2, wait_us)
    return t


def write_rank(tmp_path, t: KinetoTrace, rank: int):
    import json
    data = t.to_json()
    data["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": 2}
    path = tmp_path / f"ddp_rank{rank}.1.pt.trace.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("synced, fires", [(4, True), (2, True), (1, False)])
def test_ddp_sync_counts_micro_batches_that_end_in_an_all_reduce(tmp_path, synced, fires):
    path = write_rank(tmp_path, ddp_trace(0, 4, synced, 500), 0)
    result = analyze.analyze_trace(path)
    assert result["distributed"]["ddp_forwards_per_step"] == 4
    assert result["distributed"]["synced_forwards_per_step"] == synced
    assert result["distributed"]["collectives_per_step"] == synced
    assert ("ddp_sync" in found_ids(result)) == fires


def test_one_forward_per_step_is_no_accumulation(tmp_path):
    result = analyze.analyze_trace(write_rank(tmp_path, ddp_trace(0, 1, 1, 500), 0))
    assert result["distributed"]["synced_forwards_per_step"] == 1 and found_ids(result) == []


def test_a_folder_of_ranks_gets_the_cross_rank_view(tmp_path, capsys):
    """Rank 1 is the straggler: its all-reduces are short because the others wait for it there."""
    write_rank(tmp_path, ddp_trace(0, 2, 1, 2000), 0)
    write_rank(tmp_path, ddp_trace(1, 2, 1, 1000), 1)
    view = analyze.analyze_ranks(tmp_path)
    cross = view["cross_rank"]
    assert [r["distributed"]["rank"] for r in view["ranks"]] == [0, 1]
    assert cross["collective_ms_per_step_by_rank"] == {0: 2.0, 1: 1.0}
    assert cross["least_waiting_rank"] == 1 and cross["wait_spread_ms_per_step"] == 1.0
    assert cross["world_size"] == 2 and cross["ranks_read"] == 2
    assert analyze.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "rank 1 waits least in collectives (1.0 ms/step, 1.0 ms less than the most)" in out
    # Ranks of two jobs (another world size, or backend, in one of them): no cross-rank view.
    rank1 = tmp_path / "ddp_rank1.1.pt.trace.json"
    as_written = rank1.read_text()
    for other in ({"world_size": 8}, {"backend": "nccl"}):
        data = json.loads(as_written)
        data["distributedInfo"].update(other)
        rank1.write_text(json.dumps(data))
        assert analyze.analyze_ranks(tmp_path) is None
    # One trace, or traces that are not distinct ranks: the newest trace, as before.
    rank1.unlink()
    assert analyze.analyze_ranks(tmp_path) is None


def test_a_folder_of_unequal_ranks_in_json(tmp_path, capsys):
    """Three ranks whose steps differ: the slowest is the one with the longest mean step, not the
    first or the last in the folder, and --json prints the whole view as one object."""
    step_us = {0: STEP_US, 1: 1.3 * STEP_US, 2: 0.8 * STEP_US}  # rank 1 is the slowest
    wait_us = {0: 900.0, 1: 300.0, 2: 1500.0}  # ...and the others wait for it: it waits least
    for rank in (2, 0, 1):  # written out of order: the view sorts by rank
        built = ddp_trace(rank, 2, 1, wait_us[rank], step_us=step_us[rank])
        path = write_rank(tmp_path, built, rank)
        data = json.loads(path.read_text())
        data["distributedInfo"]["world_size"] = 3
        path.write_text(json.dumps(data))
    assert analyze.main([str(tmp_path), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)  # one JSON object: rank keys become strings
    cross = view["cross_rank"]
    assert [r["distributed"]["rank"] for r in view["ranks"]] == [0, 1, 2]
    assert cross["step_ms_by_rank"] == {str(r): pytest.approx(us / 1000)
                                        for r, us in step_us.items()}
    assert cross["slowest_rank"] == 1 and cross["least_waiting_rank"] == 1
    assert cross["collective_ms_per_step_by_rank"] == {str(r): pytest.approx(us / 1000)
                                                       for r, us in wait_us.items()}
    assert cross["wait_spread_ms_per_step"] == pytest.approx(1.2)
    assert cross["world_size"] == 3 and cross["ranks_read"] == 3


def nested_or_accumulating(tmp_path, pattern: str) -> dict:
    """Two steps of 10 000 µs on rank 0 of 2 (gloo). "dlrm": one outer DDP forward holding an
    inner DDP module's forward and an all_to_all (embeddings), then the backward's three
    all-reduces of distinct sizes. "gan": two DDP models one after the other (a generator and a
    discriminator), each forward followed by its own buckets' all-reduces. "accumulation": two
    micro-batches, each forward followed by the same two bucket all-reduces (no no_sync).
    "rebuilt": the same, but the first micro-batch's buckets are other sizes of the same sum
    (DDP rebuilds its buckets after its first iteration, which a cold trace records)."""
    t = KinetoTrace(cpu_pid=100)

    def all_reduce(at: float, elements: int, name: str = "gloo:all_reduce") -> None:
        t.span("annotation", name, at, 100, **{"Input Dims": [[elements]]})

    for index in range(2):
        at = T0 + index * STEP_US
        t.step(index + 1, at, STEP_US)
        if pattern == "dlrm":
            t.annotation("DistributedDataParallel.forward", at + 10, 4000)
            t.annotation("DistributedDataParallel.forward", at + 100, 1000)  # the inner module
            all_reduce(at + 2000, 8 * 1024, name="gloo:all_to_all")
            for k, elements in enumerate((1000, 2000, 3000)):
                all_reduce(at + 5000 + 500 * k, elements)
        else:
            buckets = {"gan": ((1000, 2000), (3000, 4000)),
                       "accumulation": ((1000, 2000), (1000, 2000)),
                       "rebuilt": ((500, 1500, 1000) if index == 0 else (1000, 2000),
                                   (1000, 2000))}[pattern]
            for micro, sizes in enumerate(buckets):
                begin = at + micro * STEP_US / 2
                t.annotation("DistributedDataParallel.forward", begin + 10, 1000)
                for k, elements in enumerate(sizes):
                    all_reduce(begin + 2000 + 500 * k, elements)
    return analyze.analyze_trace(write_rank(tmp_path, t, 0))


@pytest.mark.parametrize("pattern, forwards, synced, fires", [
    ("dlrm", 1.0, 1.0, False),  # the inner forward is no micro-batch; all_to_all no gradient sync
    ("gan", 2.0, 1.0, False),  # two models, two sums of gradient elements: no accumulation
    ("accumulation", 2.0, 2.0, True),  # the same buckets after every micro-batch
    ("rebuilt", 2.0, 2.0, True),  # the same gradients, in other buckets at first
])
def test_ddp_sync_counts_outermost_forwards_and_every_bucket(tmp_path, pattern, forwards,
                                                             synced, fires):
    result = nested_or_accumulating(tmp_path, pattern)
    dist = result["distributed"]
    assert dist["ddp_forwards_per_step"] == forwards
    assert dist["synced_forwards_per_step"] == synced
    assert ("ddp_sync" in found_ids(result)) == fires


@pytest.mark.parametrize("no_sync, synced, fires", [(True, 1.0, False), (False, 4.0, True)])
def test_a_loss_all_reduced_after_each_micro_batch_is_no_bucket_sync(tmp_path, no_sync, synced,
                                                                      fires):
    """Four micro-batches a step, each followed by a scalar all_reduce of the loss (logging);
    the gradient buckets (sizes 1000 and 2000) follow the last one only with no_sync, every one
    without it."""
    t = KinetoTrace(cpu_pid=100)
    for index in range(2):
        at = T0 + index * STEP_US
        t.step(index + 1, at, STEP_US)
        for micro in range(4):
            begin = at + micro * STEP_US / 4
            t.annotation("DistributedDataParallel.forward", begin + 10, 500)
            t.span("annotation", "gloo:all_reduce", begin + 600, 20, **{"Input Dims": [[1]]})
            if micro == 3 or not no_sync:
                for k, elements in enumerate((1000, 2000)):
                    t.span("annotation", "gloo:all_reduce", begin + 1000 + 300 * k, 100,
                           **{"Input Dims": [[elements]]})
    dist = analyze.analyze_trace(write_rank(tmp_path, t, 0))["distributed"]
    assert dist["ddp_forwards_per_step"] == 4.0 and dist["synced_forwards_per_step"] == synced
    assert (dist["synced_forwards_per_step"] >= 2) == fires
