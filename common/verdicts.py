"""The bottleneck verdicts: one small pure function per rule over the metrics, each finding with
its evidence, the fix and the demo that shows it."""
from __future__ import annotations

from common.host_ops import CPU_SHORT_OP_US, HOST_OP_CAUSE_PREFIX
from common.memory import GROWTH_FIT_MIN_STEPS
from common.metrics import SHORT_KERNEL_US
from common.trace_steps import US_PER_MS

# --- Verdict thresholds. ----------------------------------------------------------------------
DATALOADER_SHARE_MIN_PCT = 20.0  # % of the window; gpu-idle and fournex use 20 %
# With worker processes the step waits for a batch only when they fall behind it: workers that
# keep up leave a ready batch in the queue, and taking it costs about 1 % of a step (our runs
# with workers read 0.0 to 0.9 %, the shared A100 and V100 traces 0.1 %). A wait is then the
# workers' pace showing: a fix that shortens the step's compute lengthens the wait by as much and
# wins nothing until they keep up. On the H100 ladder's compiled rung, 14 workers behind it: the
# fused optimizer gave 1.01x more samples/s with the step waiting 26.4 % (an earlier run), moving
# the workers' colour jitter to the GPU 1.43x with it waiting 17.5 %. (On a CPU the workers share
# the cores, and a lighter step leaves them more: there it wins a little.) Half the rule's share
# is our cut for such a loader, ten times what a ready batch costs. From it the finding fires, and
# ranks as high, first of the findings of a share (rank: it sets the pace). Its limit: workers that
# start in the window (each epoch, without persistent_workers) read the same, a one-off wait.
DATALOADER_WORKERS_BEHIND_MIN_PCT = DATALOADER_SHARE_MIN_PCT / 2  # % of the window
# % GPU utilization of the time the trace accounts for (gpu.recorded_utilization_pct); peers'
# small-batch rule
SMALL_BATCH_UTILIZATION_MAX_PCT = 50.0
SMALL_BATCH_MEDIAN_KERNEL_MAX_US = 25.0  # µs median kernel; peers' small-batch rule
# Short kernels on an idle GPU come from a batch too small to fill them (small_batch) or from a
# model of many small ops (launch_overhead); the timing is the same, the input shapes differ. Below
# this batch (input_batch, from record_shapes) it is the batch: a Hopper tensor-core MMA takes 64
# rows at a time (PTX ISA, wgmma.mma_async .m64nNk16), so with fewer even one tile of each GEMM
# runs part empty. The small_batch demo's GPU batch is 8, the launch_overhead demo's 64.
SMALL_BATCH_INPUT_BATCH_BELOW = 64  # samples (or rows) per forward conv/linear call
# Launch overhead: most kernels are short (our reading of peers' "kernels < 10 µs": a majority)
# and the CPU spends at least as long in launch calls as the GPU spends running kernels (peers).
LAUNCH_SHORT_KERNEL_MIN_PCT = 50.0  # % of kernels shorter than SHORT_KERNEL_US
LAUNCH_TO_KERNEL_TIME_MIN = 1.0  # launch-call time / kernel time, per step
HOST_SYNC_PER_STEP_MIN = 1.0  # synchronize calls per step; peers' rule
# Peers ask for "idle gaps after" the syncs without a number; 5 % of the window is our cut: it
# stays silent on one .item() per step in a GPU-bound loop (a gap of tens of µs in a 30 ms step).
HOST_SYNC_IDLE_MIN_PCT = 5.0
# Syncs are read by cause (syncs.SYNC_CAUSES): value reads and the rest are host_sync's; syncs
# inside host-to-device copies are h2d_copy's (same two thresholds), whose fix is pinned memory.
HOST_SYNC_CAUSES = ("value_read", "other")
# Host round trips: data sent to the host and back in a step (a device-to-host copy answered by a
# host-to-device one: .cpu() -> numpy -> .to(device), .tolist() -> torch.tensor(list, device)),
# or operators that must read a count before they allocate (syncs.DATA_DEPENDENT_OPS: x[mask],
# nonzero, unique). One round trip a step is already code written so; "several" data-dependent
# syncs is two (one mask a step is common). Either must cost: the GPU idles at least
# HOST_SYNC_IDLE_MIN_PCT of the window in the gaps the step's syncs end in, so a GPU-bound loop
# with one small round trip stays silent (the shared A100-80GB trace: 3 round trips a step,
# 2.8 % idle in sync gaps). Ours, with the peers' sync rule's idea.
HOST_ROUNDTRIP_PER_STEP_MIN = 1.0  # device -> host -> device round trips per step
DATA_DEPENDENT_SYNCS_PER_STEP_MIN = 2.0  # syncs from data-dependent operators per step
# FP32 math: peers fire when tensor cores run 0 % while GEMMs are >= 20 % of kernel time. We fire
# when GEMMs *not* on tensor cores are >= 20 % of kernel time: the same when no kernel uses them,
# and still right when a few (say TF32 convolutions) do while the matmuls run in FP32.
FP32_GEMM_MIN_PCT = 20.0  # % of kernel time
# fp32_matmul's fix names one's own kernels (kernel_names.handwritten_gemm_precision: autocast
# does not change their types) when they hold at least this share of the FP32 GEMM time it read.
HANDWRITTEN_FP32_FIX_MIN_SHARE = 0.5  # share of the rule's FP32 GEMM time; ours: half or more
# Memory-bound kernels: a GPU that spends most of the window in eager operators' memory-bound
# kernels (kernel_names.is_memory_bound_op: batch norm, element-wise ops, layout conversions) is
# busy moving activations, not multiplying them. Half the window is ours: the step is then mostly
# such kernels, and the GPU at least half busy, so the idle rules' causes are the smaller part.
MEMORY_BOUND_MIN_PCT = 50.0  # % of the window in eager memory-bound kernels
# memory_bound_kernels names BF16 first when FP32 data holds at least this share of its kernels'
# time (kernel_names.data_precision) and the matmuls are FP32: autocast halves the bytes each
# of them moves.
MEMORY_BOUND_FP32_MIN_SHARE = 0.5  # share of the memory-bound time; ours: half or more
# Its fix names a part of that time with its own remedy (layout conversions: channels_last;
# softmaxes with no fused attention: SDPA) from this share of the window: host_sync's cut.
MEMORY_BOUND_PART_MIN_PCT = 5.0  # % of the window
ACTIVATION_MEMORY_MIN_PCT = 85.0  # peak allocated, % of the GPU's memory; peers' rule
ACTIVATION_MEMORY_HIGH_PCT = 95.0  # % of the GPU: the next larger step is likely out of memory
H2D_MIN_PCT = 10.0  # % of the window in host-to-device copies no kernel overlaps; peers' rule
# h2d_copy says "pin" only where pageable copies hold a share of the copy time worth pinning: a
# tenth, as H2D_MIN_PCT is of the window. Below it the copies are pinned already (a stray
# pageable scalar, say: 0.4 % of a100_80gb's copy time), and pinning the rest saves less.
H2D_PAGEABLE_MIN_PCT = 10.0  # % of the host-to-device copy time from pageable memory
# Optimizer overhead: "high time in optimizer.step: use a fused optimizer" (practitioners'
# guides); 15 % of the step is the project's cut, set with the pair. Per-tensor: no multi-tensor
# operator (metrics.MULTI_TENSOR_MARKERS) runs in the optimizer region.
UNFUSED_OPTIMIZER_MIN_PCT = 15.0  # % of the window in the optimizer region
# ...and its time goes to per-operator overhead, not to moving bytes: the region's time over the
# operators in it. Eager PyTorch pays a few µs of dispatch (and, on a GPU, launch) per operator;
# AdamW(foreach=False) over 402 small tensors measured 4.3 µs per operator on the project's
# 2-core box, SGD over ResNet-18's 62 large tensors 45-51 µs (its time is the 11 M weights, which
# a fused kernel reads just the same). Our cut, between the two.
UNFUSED_OPTIMIZER_MAX_US_PER_OP = 20.0  # µs of the optimizer region per operator in it
# ...or, whatever each operator takes, the loop passes over every tensor several times: each
# update operator reads and writes the whole tensor, and a fused kernel reads and writes it once.
# AdamW's loop makes about 15 calls a tensor (31 with the copies they nest: the ladder's rung 1,
# 27 µs each over ResNet-18's 62 tensors), SGD's 1, SGD with momentum's 3.
UNFUSED_OPTIMIZER_CALLS_PER_TENSOR_MIN = 3.0  # operator calls per parameter tensor
# Hand-written attention: a softmax over a square [..., s, s] score matrix with s at least this
# (the project's cut, set with the pair; at 512 tokens the matrix of one head already holds 256 K
# scores a sample), and no scaled_dot_product_attention operator in the window.
NAIVE_ATTENTION_MIN_SEQ = 512  # tokens
# DDP gradient accumulation: DistributedDataParallel forwards (micro-batches) per step followed
# by collectives before the next; without no_sync every one is, with it only the last (the pair's
# rule: "collectives per step exceed one per gradient bucket per step").
DDP_SYNCED_MICRO_BATCHES_MIN = 2  # micro-batches per step that end in an all-reduce
# Host overhead: the GPU waits for the host to enqueue its next op (gpu.idle_by_cause_pct's
# "launch") for at least half the window, and the launch calls do not explain it (not launch
# bound): the host's time goes to operators, dispatch and Python between the launches. Half: the
# host then sets the pace, not the GPU; the same line as small_batch's utilization.
HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT = 50.0  # % of the window the GPU waits for an enqueue
HOST_OVERHEAD_OPERATORS_SHOWN = 3  # operators named in its evidence, by self time per step
# Host regions (idle_causes.host_regions: a record_function range that enqueues no GPU work and runs
# almost all outside PyTorch operators, a tokenizer say): one region is the cause of this share
# of the window's GPU idle time (on a CPU-only trace: holds this share of the window). A fifth
# of the window waiting on host work, as the DataLoader's 20 % is a fifth waiting on data.
HOST_REGION_MIN_PCT = DATALOADER_SHARE_MIN_PCT  # % of the window
# CPU runs (host_ops.cpu_run_metrics, a CPU-only trace). Operator overhead: the step spends this
# share of the window making calls rather than in arithmetic (cpu.call_pct: short operators' own
# time and the short gaps between operators, both under host_ops.CPU_SHORT_OP_US, where eager mode
# runs each call's Python): half, where the per-call cost sets the pace, as host_overhead's half
# on a GPU. A compiled step keeps short operators (tiny matmuls at batch 1) but few gaps: the
# pairs' full CPU runs read 1-43 % on their fixed scripts, 59-66 % on llm_decode/bad and
# launch_overhead/bad. Python between operators: no operator, DataLoader span, host region or
# collective call is open, in gaps of CPU_SHORT_OP_US or more (cpu.long_gap_pct: the shorter ones
# are each call's cost, cpu_op_overhead's), for this share of the window; removing it would run
# the step 1.43x faster. The full CPU runs: fixed scripts 1-18 %, host_roundtrip/bad 42 %.
CPU_CALLS_MIN_PCT = 50.0  # % of the window in short operators and the short gaps between them
PYTHON_OUTSIDE_OPS_MIN_PCT = 30.0  # % of the window in gaps of 10 µs or more between operators
# CUDA graphs: when at least this share of the window's kernels are replayed by graph launches
# (gpu.graph_kernels_per_step of kernels_per_step: "most"), the step is already captured, and the
# launch and host fixes speak of the host's work between the replays instead.
GRAPH_REPLAYED_MIN_PCT = 50.0  # % of the kernels
# Exposed communication: collectives run with no compute kernel beside them for this share of the
# window (gpu.exposed_comm_pct; TraceLens's "exposed communication"; on a CPU cpu.exposed_comm_pct,
# collectives in flight with no other operator running). A fifth of the step only waiting on the
# network, as the DataLoader's 20 % is a fifth waiting on data.
EXPOSED_COMM_MIN_PCT = 20.0  # % of the window
# Memory growth (a leak): the memory allocated at each recorded step's end rises along a line
# (memory.growth_fit: least squares over the step index, from memory.GROWTH_FIT_MIN_STEPS steps).
# R^2 at least 0.9: the line explains nine tenths of the spread, which start-up that grows for two
# of five steps and then holds (0.78) and a one-off jump in the second of five (0.5) do not reach.
MEMORY_GROWTH_R2_MIN = 0.9
# At least 1 % of the steps' peak allocated a step (the issue's bound for "flat"): below it the
# memory is flat for the rule, whatever the fit (the allocator's noise, a counter's few bytes).
MEMORY_GROWTH_MIN_PCT = 1.0  # % of the steps' peak allocated, per step
# ...and at that rate the memory would be full within this many steps: a day of training at about
# a step a second (86,400 steps), rounded up. A slower leak needs the same fix, but ends no run.
MEMORY_GROWTH_FULL_WITHIN_STEPS = 100_000  # steps
# The memory that fills, where the trace gives none (a CPU run; a GPU trace without
# deviceProperties): 16 GB, a laptop's or a small VM's RAM and the smallest data-centre GPUs'
# (V100 16 GB, T4 16 GB). Smaller than most machines: the rule errs towards speaking.
MEMORY_ASSUMED_CAPACITY_MB = 16_000.0  # MB
# Recompiles (compiled.compiled_metrics): a frame that runs under this many compile ids in the
# recorded steps is specialised on a value that keeps changing. Dynamo's automatic dynamic shapes
# give a frame two graphs (static, then dynamic after the first change), after which only the newer
# runs; a frame called in train() and in eval() mode runs under one id each: two at most in a
# steady window. Three is beyond both.
RECOMPILE_DISTINCT_IDS_MIN = 3
# Dynamo's default torch._dynamo.config.recompile_limit (cache_size_limit before torch 2.6):
# compiles of one frame, after which a call that fails every guard runs the frame eagerly, with one
# warning. A frame whose compile id reaches it less one has used up its compiles.
DYNAMO_RECOMPILE_LIMIT = 8
# Graph breaks: compiled regions holding eager operators of their own (code Dynamo ran eagerly
# between two graphs), per recorded step. One a step: the forward breaks every time it runs, as
# host_sync's one sync a step.
GRAPH_BREAKS_PER_STEP_MIN = 1.0
# Severity: "high" when a value is twice its threshold (half, for an upper limit). Our choice,
# only to order the findings.
SEVERITY_HIGH_FACTOR = 2.0


# --- Verdicts: one small pure function per bottleneck. -----------------------------------------

def severity(value: float, threshold: float, upper_limit: bool = False) -> str:
    """"high" at SEVERITY_HIGH_FACTOR times the threshold (or a fraction of an upper limit)."""
    if upper_limit:
        return "high" if value <= threshold / SEVERITY_HIGH_FACTOR else "medium"
    return "high" if value >= threshold * SEVERITY_HIGH_FACTOR else "medium"


def finding(rule_id: str, level: str, evidence: str, fix: str, demo: str | None, *,
            share_pct: float | None = None, sets_pace: bool = False) -> dict:
    """`share_pct`: the share of the window the finding measures its cause to hold (what its fix
    can win back at most); None for a finding that is no slice of the window (memory, compiling,
    the attention's shape). `sets_pace`: its cause paces the step whatever else gets faster
    (DataLoader workers that fall behind), so the other findings' fixes win nothing before its."""
    return {"id": rule_id, "severity": level, "evidence": evidence, "fix": fix, "demo": demo,
            "share_pct": share_pct, "sets_pace": sets_pace}


def dataloader_share_min_pct(workers: bool | None) -> float:
    """The dataloader rule's cut: lower where worker processes make the batches, whose wait means
    they fall behind (DATALOADER_WORKERS_BEHIND_MIN_PCT)."""
    return DATALOADER_WORKERS_BEHIND_MIN_PCT if workers else DATALOADER_SHARE_MIN_PCT


def rule_dataloader(m: dict) -> dict | None:
    pct, workers = m["dataloader_pct"], m.get("dataloader_workers")
    cut = dataloader_share_min_pct(workers)
    if pct < cut:
        return None
    up = m["gpu"]["copies_per_step"]["h2d"] if m["gpu"] else None
    pinned = (up is not None and up["pageable_pct"] is not None
              and up["pageable_pct"] < H2D_PAGEABLE_MIN_PCT)
    if workers:  # the workers are there and still too slow: each batch must cost them less
        fix = ("the worker processes do not keep up with the step: persistent_workers=True "
               "where each epoch starts them anew, more workers where cores are "
               "free, less work per sample in them (uint8 images, 4x fewer bytes to pass and "
               "copy than float32; images decoded at the size the model reads), or their "
               "heaviest work moved to the GPU, a whole batch at once (colour jitter and other "
               "augmentations, see demos/ladder/; JPEG decoding: nvJPEG, "
               "torchcodec.decoders.decode_jpeg(..., device=\"cuda\"); torchvision.io's is "
               "deprecated since torchvision 0.29)")
    else:
        fix = ("prepare batches in worker processes (DataLoader num_workers > 0, "
               "persistent_workers, prefetch_factor)")
    return finding(
        "dataloader", severity(pct, cut),
        f"data-loading bound: {pct:.0f} % of each step waits on the DataLoader"
        + (", whose worker processes (or their hand-over: unpickling, pinning) fall behind "
           "the step: they set its pace, and a faster step would only wait longer"
           if workers else "")
        + f" (enumerate(DataLoader)#...__next__; rule: >= {DATALOADER_SHARE_MIN_PCT:.0f} %, "
        f">= {DATALOADER_WORKERS_BEHIND_MIN_PCT:.0f} % with workers)",
        fix + "; on a GPU also "
        + ("the copy on a side CUDA stream (the batches come from pinned memory already)"
           if pinned else "pin_memory=True and the copy on a side CUDA stream"),
        "dataloader_workers", share_pct=pct, sets_pace=bool(workers))


def rule_host_region(m: dict) -> dict | None:
    """A named host region (idle_causes.host_regions) the GPU waits on, or, without a GPU, that
    holds the window: the largest by that share."""
    regions = m.get("host_regions") or {}
    gpu = m["gpu"]
    share = {name: region["gpu_idle_pct"] if gpu else region["pct"]
             for name, region in regions.items()}
    if not share or max(share.values()) < HOST_REGION_MIN_PCT:
        return None
    name = max(share, key=share.get)
    region = regions[name]
    held = (f"the GPU idles {share[name]:.0f} % of the window while it runs, which enqueues no "
            f"GPU work" if gpu else f"it holds {share[name]:.0f} % of the window")
    return finding(
        "host_region", severity(share[name], HOST_REGION_MIN_PCT),
        f"host work in region '{name}': {held} ({region['ms_per_step']:.1f} ms/step, "
        f"{region['outside_ops_pct']:.0f} % of it outside PyTorch operators; rule: >= "
        f"{HOST_REGION_MIN_PCT:.0f} %)",
        f"make the work in '{name}' cheaper or take it off the critical path: a native, "
        f"vectorised batch implementation (a Rust tokenizer's encode_batch instead of a Python "
        f"loop per request), worker processes or threads that run ahead of the step, as "
        f"DataLoader workers do, or overlap it with the GPU's work (prepare the next batch while "
        f"the GPU runs this one)", "tokenizer_bound", share_pct=share[name])


def host_work_ops_idle(gpu: dict | None) -> dict[str, float]:
    """The GPU's idle time caused by host operators that enqueue no GPU work, per operator name
    (the idle causes host_ops.with_host_work_ops names), largest first."""
    idle = (gpu or {}).get("idle_by_cause_pct") or {}
    ops = {cause[len(HOST_OP_CAUSE_PREFIX):]: pct for cause, pct in idle.items()
           if cause.startswith(HOST_OP_CAUSE_PREFIX)}
    return dict(sorted(ops.items(), key=lambda item: -item[1]))


def rule_host_work_ops(m: dict) -> dict | None:
    """The GPU waits while the host runs operators that enqueue nothing: inputs made on the CPU
    every step (torch.randn on the CPU, CPU math, decoding), outside any DataLoader."""
    ops = host_work_ops_idle(m["gpu"])
    total = sum(ops.values())
    if total < HOST_REGION_MIN_PCT:
        return None
    named = ", ".join(f"{name} {pct:.1f} %" for name, pct in
                      list(ops.items())[:HOST_OVERHEAD_OPERATORS_SHOWN])
    return finding(
        "host_work_ops", severity(total, HOST_REGION_MIN_PCT),
        f"host work in operators: the GPU idles {total:.1f} % of the window while the host runs "
        f"operators that enqueue no GPU work ({named}; rule: >= {HOST_REGION_MIN_PCT:.0f} %)",
        "the host makes or transforms data on the CPU every step: make the inputs on the device "
        "(torch.randn(..., device=\"cuda\"), CPU math moved after .to(device)), or move their "
        "preparation into a DataLoader whose workers prepare the next batch while the GPU runs",
        "dataloader_workers", share_pct=total)


def graph_replayed(gpu: dict) -> bool:
    """Most of the window's kernels are replayed from CUDA graphs (GRAPH_REPLAYED_MIN_PCT)."""
    return bool(gpu) and gpu["kernels_per_step"] > 0 and (
        100.0 * gpu.get("graph_kernels_per_step", 0.0) / gpu["kernels_per_step"]
        >= GRAPH_REPLAYED_MIN_PCT)


def graph_replay_words(gpu: dict) -> str:
    """"the kernels are already replayed from 2 CUDA graph launches a step (391 of 402)"."""
    launches = gpu["graph_launches_per_step"]
    return (f"the kernels are already replayed from {launches:.0f} CUDA graph "
            f"launch{'' if round(launches) == 1 else 'es'} a step "
            f"({gpu['graph_kernels_per_step']:.0f} of {gpu['kernels_per_step']:.0f})")


def eager_launch_ms(gpu: dict) -> float:
    """Launch-call time per step outside CUDA graph launches: one graph launch enqueues all its
    kernels at once, so its call is no per-kernel cost."""
    return gpu["launch_ms_per_step"] - gpu.get("graph_launch_ms_per_step", 0.0)


def host_bound_demo(m: dict) -> str | None:
    """The pair that shows the fix for a host-bound loop of this kind: CUDA graphs and fusion on
    a training step (launch_overhead), or on token-by-token generation, where a static KV cache
    makes the step capturable (llm_decode). A trace without a backward pass is inference. None
    where the step is already replayed from CUDA graphs: both pairs' fix is in place, and what
    is left (the host's work between the replays) no pair shows."""
    if m["gpu"] and graph_replayed(m["gpu"]):
        return None
    return "launch_overhead" if m.get("training", True) else "llm_decode"


def launch_to_kernel_ratio(gpu: dict) -> float | None:
    """Launch-call time over kernel time per step when the run is launch bound (most kernels
    short and the launches take at least as long as the kernels), else None. Graph launches
    are left out of the launch time: one graph launch for hundreds of short kernels is not
    launch bound."""
    if not gpu or gpu["kernel_ms_per_step"] <= 0:
        return None
    ratio = eager_launch_ms(gpu) / gpu["kernel_ms_per_step"]
    if gpu["short_kernel_pct"] < LAUNCH_SHORT_KERNEL_MIN_PCT or ratio < LAUNCH_TO_KERNEL_TIME_MIN:
        return None
    return ratio


def gpu_underfilled(gpu: dict) -> bool:
    """Low utilization with short kernels: the GPU has too little to do (peers' small-batch
    rule)."""
    return bool(gpu) and gpu["median_kernel_us"] is not None and (
        gpu["recorded_utilization_pct"] < SMALL_BATCH_UTILIZATION_MAX_PCT
        and gpu["median_kernel_us"] <= SMALL_BATCH_MEDIAN_KERNEL_MAX_US)


def batch_is_small(m: dict) -> bool:
    return m["input_batch"] is not None and m["input_batch"] < SMALL_BATCH_INPUT_BATCH_BELOW


def rule_launch_overhead(m: dict) -> dict | None:
    """Launch bound, unless the input shapes show a small batch (then rule_small_batch names it,
    and points here as the fix for a batch that cannot grow)."""
    gpu = m["gpu"]
    ratio = launch_to_kernel_ratio(gpu)
    if ratio is None or rule_small_batch(m):
        return None
    graphs = gpu.get("graph_launches_per_step", 0.0)
    evidence = (
        f"launch bound: {gpu['short_kernel_pct']:.0f} % of kernels run < {SHORT_KERNEL_US:.0f} us "
        f"and the CPU spends {eager_launch_ms(gpu):.2f} ms/step in "
        f"{gpu['launches_per_step'] - graphs:.0f} launch calls for "
        f"{gpu['kernel_ms_per_step']:.2f} ms of kernels ({ratio:.1f}x; rule: >= "
        f"{LAUNCH_SHORT_KERNEL_MIN_PCT:.0f} % short and >= {LAUNCH_TO_KERNEL_TIME_MIN:.0f}x)")
    if graphs:
        evidence += (f"; besides {graphs:.0f} CUDA graph launches a step replaying "
                     f"{gpu['graph_kernels_per_step']:.0f} kernels, not counted: one call "
                     f"enqueues a whole graph")
    if graph_replayed(gpu):
        fix = (f"{graph_replay_words(gpu)}: the launches left are the eager ops between the "
               f"replays; bring them into the compiled region (torch.compile over the whole "
               f"step, the optimizer and the loss included) or fuse them (a fused or foreach "
               f"optimizer, fewer small ops outside the model)")
    else:
        fix = ("launch fewer, larger kernels: torch.compile (fusion) and CUDA graphs "
               "(mode=\"reduce-overhead\")")
    if m["input_batch"] is not None:
        evidence += (f"; batch {m['input_batch']:.0f} at the conv/linear inputs"
                     + ("" if batch_is_small(m) else
                        f", not small (>= {SMALL_BATCH_INPUT_BATCH_BELOW}): many small ops"))
    elif gpu_underfilled(gpu):  # the timing fits a small batch as well: say both fixes
        fix += ("; or, if the batch is small, a larger one (see demos/small_batch/): the trace "
                "has no input shapes (record_shapes=True) to tell the two apart")
    if not m.get("training", True) and not graph_replayed(gpu):
        fix += ("; for generation, a static KV cache first (preallocated, written in place), so "
                "every token's step has the same shapes and can be captured")
    return finding("launch_overhead", severity(ratio, LAUNCH_TO_KERNEL_TIME_MIN), evidence, fix,
                   host_bound_demo(m), share_pct=gpu["idle_by_cause_pct"]["launch"])


def sync_sources(gpu: dict, causes: tuple[str, ...]) -> str:
    """"aten::copy_ (DtoH) 6.0/step, aten::_local_scalar_dense 4.0/step": the operators that
    issued the syncs of these causes."""
    return ", ".join(f"{source} {per_step:.1f}/step" for cause in causes
                     for source, per_step in gpu["sync_sources_per_step"][cause].items())


def rule_host_sync(m: dict) -> dict | None:
    """Syncs that read a value or wait outright (not those of host-to-device copies: h2d_copy)."""
    gpu = m["gpu"]
    if not gpu:
        return None
    per_step = sum(gpu["syncs_by_cause_per_step"][cause] for cause in HOST_SYNC_CAUSES)
    idle = dict(gpu["sync_idle_pct_by_cause"])
    mid_step = host_starved(m)
    if mid_step:  # the gaps after a step's last sync are the host's work: host_overhead's
        idle = {cause: idle[cause] - gpu["step_end_sync_idle_pct_by_cause"][cause]
                for cause in idle}
    idle_pct = sum(idle[cause] for cause in HOST_SYNC_CAUSES)
    if per_step < HOST_SYNC_PER_STEP_MIN or idle_pct < HOST_SYNC_IDLE_MIN_PCT:
        return None
    reads = gpu["syncs_by_cause_per_step"]["value_read"]
    copies = gpu["syncs_by_cause_per_step"]["h2d_copy"]
    # The host line's syncs/step counts every sync; say which of them these are, so that the
    # two counts read as parts of one (tokenizer_bound: 1.0 here of 3.0 there).
    of_all = (f"of {gpu['syncs_per_step']:.1f} syncs/step, the rest in host-to-device copies; "
              if copies else "")
    evidence = (
        f"host syncs: {per_step:.1f} per step ({of_all}{reads:.1f} read a value from the GPU; "
        f"issued by {sync_sources(gpu, HOST_SYNC_CAUSES)}), and the GPU idles {idle_pct:.1f} % of the "
        f"window in the gaps they end in" + (" within their steps" if mid_step else "")
        + f" (rule: >= {HOST_SYNC_PER_STEP_MIN:.0f}/step and >= "
        f"{HOST_SYNC_IDLE_MIN_PCT:.0f} %)")
    if idle["value_read"] >= idle["other"]:  # the reads cost the most: name them
        fix = ("keep values on the GPU: no .item(), .cpu(), print(tensor) or `if tensor:` in the "
               "step; accumulate metrics on the device and read them every N steps")
    else:
        fix = ("find the call that waits: torch.cuda.set_sync_debug_mode(\"warn\") names the "
               "Python line of each syncing operation; a torch.cuda.synchronize() belongs only "
               "around a timer, not in every step")
    return finding("host_sync", severity(idle_pct, HOST_SYNC_IDLE_MIN_PCT), evidence, fix,
                   "item_sync", share_pct=idle_pct)


def rule_host_roundtrip(m: dict) -> dict | None:
    """Data taken to the host and back, or data-dependent operators, in every step, costing the
    GPU idle time in the gaps the syncs end in; with Python frames (--with-stack) the evidence
    names the user's lines that issued them."""
    gpu = m["gpu"]
    if not gpu:
        return None
    trips, dependent = gpu["round_trips_per_step"], gpu["data_dependent_syncs_per_step"]
    if (trips < HOST_ROUNDTRIP_PER_STEP_MIN and dependent < DATA_DEPENDENT_SYNCS_PER_STEP_MIN) \
            or gpu["sync_idle_pct"] < HOST_SYNC_IDLE_MIN_PCT:
        return None
    copies = gpu["copies_per_step"]
    evidence = (
        f"host round trips: {trips:.1f} per step (device -> host -> device; "
        f"{copies['d2h']['count']:.1f} copies to the host and {copies['h2d']['count']:.1f} back "
        f"a step) and {dependent:.1f} syncs a step from operators whose output size depends on "
        f"the data ({sync_sources(gpu, ('value_read', 'h2d_copy'))}); the GPU idles "
        f"{gpu['sync_idle_pct']:.1f} % of the window in the gaps the syncs end in (rule: >= "
        f"{HOST_ROUNDTRIP_PER_STEP_MIN:.0f} round trip or >= "
        f"{DATA_DEPENDENT_SYNCS_PER_STEP_MIN:.0f} data-dependent syncs a step, and >= "
        f"{HOST_SYNC_IDLE_MIN_PCT:.0f} %)")
    lines = {**((m.get("python") or {}).get("syncs_by_user_frame_per_step") or {})}
    for line, per_step in ((m.get("python") or {}).get("copies_by_user_frame_per_step")
                           or {}).items():
        lines[line] = max(lines.get(line, 0.0), per_step)
    if lines:
        evidence += "; your lines: " + ", ".join(f"{line} ({n:.1f}/step)"
                                                 for line, n in lines.items())
    fix = ("keep the step's data on the device: tensor ops instead of Python loops over "
           ".tolist() values, torch.where or a masked sum instead of x[mask], torch instead of "
           "a numpy detour, constant tensors built once outside the step; "
           "torch.cuda.set_sync_debug_mode(\"warn\") names each syncing line")
    return finding("host_roundtrip", severity(gpu["sync_idle_pct"], HOST_SYNC_IDLE_MIN_PCT),
                   evidence, fix, "host_roundtrip", share_pct=gpu["sync_idle_pct"])


def rule_small_batch(m: dict) -> dict | None:
    """Low utilization with short kernels, when nothing else named explains the idle GPU. A
    launch-bound run is a small batch's only when its input shapes show a small batch (a small
    batch is launch bound too); otherwise rule_launch_overhead names it."""
    gpu = m["gpu"]
    if (not gpu_underfilled(gpu) or rule_dataloader(m) or rule_host_region(m)
            or rule_host_work_ops(m)
            or rule_host_sync(m)):
        return None
    launch_ratio = launch_to_kernel_ratio(gpu)
    if launch_ratio is not None and not batch_is_small(m):
        return None
    if host_starved(m) and not batch_is_small(m):
        return None  # no shapes say the batch is small: the host is the limit (host_overhead)
    evidence = (
        # One decimal: the rule is strict (< 50 %), and 49.7 % rounded to a whole would read 50.
        f"GPU under-filled: utilization {gpu['recorded_utilization_pct']:.1f} % with a median "
        f"kernel of "
        f"{gpu['median_kernel_us']:.1f} us (rule: < {SMALL_BATCH_UTILIZATION_MAX_PCT:.0f} % and "
        f"<= {SMALL_BATCH_MEDIAN_KERNEL_MAX_US:.0f} us)")
    fix = ("give each kernel more work: a larger batch (scale the learning rate with it), or "
           "gradient accumulation if memory is the limit" if m.get("training", True) else
           "give each kernel more work: a larger batch per call (batch requests or samples "
           "together)")
    if batch_is_small(m):
        evidence += (f"; batch {m['input_batch']:.0f} at the conv/linear inputs "
                     f"(< {SMALL_BATCH_INPUT_BATCH_BELOW})")
    elif m["input_batch"] is not None:  # the timing says under-filled, the shapes disagree
        evidence += (f"; but batch {m['input_batch']:.0f} at the conv/linear inputs is not small "
                     f"(>= {SMALL_BATCH_INPUT_BATCH_BELOW}): the short kernels may come from "
                     f"other ops, where a larger batch helps less")
    if launch_ratio is not None:
        evidence += (f"; launch bound too, as a small batch is: {eager_launch_ms(gpu):.2f} "
                     f"ms/step of launch calls for {gpu['kernel_ms_per_step']:.2f} ms of kernels "
                     f"({launch_ratio:.1f}x)")
        fix += ("; if the batch cannot grow, launch fewer kernels: torch.compile and CUDA graphs "
                "(see demos/launch_overhead/)")
    return finding(
        "small_batch",
        severity(gpu["recorded_utilization_pct"], SMALL_BATCH_UTILIZATION_MAX_PCT,
                 upper_limit=True),
        evidence, fix, "small_batch",
        share_pct=gpu["idle_pct"] - gpu["idle_by_cause_pct"]["unrecorded"])


def host_side_idle_pct(gpu: dict) -> float:
    """The GPU waiting for the host's own work, as a whole: for its next enqueue (idle cause
    "launch") and, after a sync that ends its step, for the host's work between steps (the
    gaps syncs.ends_its_step marks; at most the idle split's host-sync share, so that no instant
    another cause holds counts twice)."""
    step_end = sum(gpu["step_end_sync_idle_pct_by_cause"].values())
    return gpu["idle_by_cause_pct"]["launch"] + min(step_end, gpu["idle_by_cause_pct"]["host_sync"])


def host_starved(m: dict) -> bool:
    """The GPU waits for the host's own work (host_side_idle_pct) HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT
    of the window or more, and the launch calls do not explain it (launch_to_kernel_ratio: not
    launch bound)."""
    gpu = m["gpu"]
    return (bool(gpu) and host_side_idle_pct(gpu) >= HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT
            and launch_to_kernel_ratio(gpu) is None)


def rule_host_overhead(m: dict) -> dict | None:
    """Host-bound without being launch-bound: the host's time between launches goes to
    operators, dispatch and Python. An under-filled GPU whose shapes show a small batch is
    small_batch's; launch-bound runs are launch_overhead's. Without shapes the timing fits a small
    batch too: the fix names a larger batch as well."""
    gpu = m["gpu"]
    # An under-filled GPU whose shapes show a small batch is small_batch's domain, also where
    # small_batch gives way to a named cause (the DataLoader, host syncs), as peers' rule has it.
    if not host_starved(m) or (gpu_underfilled(gpu) and batch_is_small(m)):
        return None
    waits = host_side_idle_pct(gpu)
    step_end = waits - gpu["idle_by_cause_pct"]["launch"]
    operators = m.get("host_operators") or []
    launch_ms, kernel_ms = eager_launch_ms(gpu), gpu["kernel_ms_per_step"]
    evidence = (
        f"host bound: the GPU waits {waits:.0f} % of the window for the host to enqueue its next "
        f"op"
        + (f" ({step_end:.0f} % of it after the sync that ends each step, while the host works "
           f"between steps)" if step_end >= 0.5 else "")
        + f" (utilization {gpu['utilization_pct']:.0f} %), while the launch calls take "
        f"{launch_ms:.2f} ms/step for {kernel_ms:.2f} ms of kernels"
        + (f" ({gpu['graph_launch_ms_per_step']:.2f} ms in CUDA graph launches aside)"
           if gpu.get("graph_launches_per_step") else "")
        + (": the host's time goes elsewhere" if launch_ms < kernel_ms else
           f", with too few short kernels to call it launch bound")
        + f" (rule: >= {HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT:.0f} % waiting, not launch bound)")
    if operators:
        evidence += ("; operators by self time per step: "
                     + ", ".join(f"{name} {ms:.2f} ms" for name, ms in operators))
    if m["input_batch"] is not None:
        evidence += (f"; batch {m['input_batch']:.0f} at the conv/linear inputs"
                     + ("" if batch_is_small(m) else ", not small"))
    elif gpu_underfilled(gpu):
        evidence += ("; no input shapes (record_shapes=True) to say whether a small batch leaves "
                     "the kernels short")
    if graph_replayed(gpu):  # already captured: what is left runs between the replays
        fix = (f"{graph_replay_words(gpu)}: what is left is the host's work between the "
               f"replays (Python, sampling, eager ops outside the graph); move it into the "
               f"captured region (static shapes and buffers, a static KV cache, sampling on the "
               f"device), fuse or drop the eager ops between replays, and give each replay more "
               f"work (a larger batch, more requests per call)")
    else:
        fix = ("do less on the host per GPU op: capture the step in a CUDA graph "
               "(torch.compile(mode=\"reduce-overhead\"), or torch.cuda.graphs for a static "
               "step; for generation, a static KV cache makes the decode step capturable), fuse "
               "ops with torch.compile, give each call more work (a larger batch, more requests "
               "per call), and move Python loops over tensors into vectorised ops")
    # Severity on the share the GPU is not waiting: "high" when it is half the rule's (waiting
    # 75 % or more), as twice a 50 % threshold could never be reached. The pair pointed to
    # (host_bound_demo): llm_decode for generation (a static KV cache, then
    # torch.compile(mode="reduce-overhead")), launch_overhead for a training step.
    return finding("host_overhead",
                   severity(100.0 - waits, 100.0 - HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT,
                            upper_limit=True), evidence, fix, host_bound_demo(m),
                   share_pct=waits)


def rule_cpu_op_overhead(m: dict) -> dict | None:
    """A CPU run paced by the per-operator cost: many short operators."""
    cpu = m.get("cpu")
    if not cpu or cpu["call_pct"] < CPU_CALLS_MIN_PCT:
        return None
    evidence = (
        f"operator bound on the CPU: {cpu['ops_per_step']:.0f} operators a step, median "
        f"{cpu['median_op_self_us'] or 0:.1f} us of self time; the step spends "
        f"{cpu['call_pct']:.1f} % of the window making calls rather than in arithmetic: "
        f"{cpu['short_op_pct']:.1f} % in operators' own time under {CPU_SHORT_OP_US:.0f} us each, "
        f"{cpu['short_gap_pct']:.1f} % in gaps under {CPU_SHORT_OP_US:.0f} us between operators "
        f"(rule: >= {CPU_CALLS_MIN_PCT:.0f} %)")
    fix = ("fewer, larger operators: torch.compile fuses the small ones into a few kernels; give "
           "each call more work (a larger batch, several requests at once); replace Python loops "
           "over small tensors by vectorised ops" + ("; for generation, a static KV cache (no "
           "torch.cat a token) and a compiled one-token step" if not m["training"] else ""))
    return finding("cpu_op_overhead", severity(100.0 - cpu["call_pct"], 100.0 - CPU_CALLS_MIN_PCT,
                                               upper_limit=True),
                   evidence, fix, host_bound_demo(m), share_pct=cpu["call_pct"])


def rule_python_between_ops(m: dict) -> dict | None:
    """A CPU run whose step is largely outside operators: Python (or native code outside torch)
    between them, which no other cause names."""
    cpu = m.get("cpu")
    if not cpu or cpu["long_gap_pct"] < PYTHON_OUTSIDE_OPS_MIN_PCT:
        return None
    evidence = (f"Python between operators: no PyTorch operator runs {cpu['long_gap_pct']:.1f} "
                f"% of the window in gaps of {CPU_SHORT_OP_US:.0f} us or more (the DataLoader, "
                f"host regions and collective calls aside; the shorter gaps are each call's own "
                f"cost; rule: >= {PYTHON_OUTSIDE_OPS_MIN_PCT:.0f} %)")
    hot = [frame for frame in ((m.get("python") or {}).get("hot_frames") or []) if frame["user"]]
    if hot:
        evidence += "; your hot frames: " + ", ".join(
            f"{frame['frame']} ({frame['self_ms_per_step']:.2f} ms/step)" for frame in hot)
        find = "the frames above run it"
    else:
        find = ("record with --with-stack (torch.profiler.profile(with_stack=True)) and the "
                "analyzer names the hot Python frames, or sample the run with py-spy")
    fix = (f"find the Python between the operators ({find}), then keep the work on tensors: "
           f"vectorise loops over .tolist() or .item() values, move per-sample Python into a "
           f"DataLoader or out of the step")
    return finding("python_between_ops", severity(cpu["long_gap_pct"],
                                                  PYTHON_OUTSIDE_OPS_MIN_PCT),
                   evidence, fix, "host_roundtrip", share_pct=cpu["long_gap_pct"])


def rule_exposed_communication(m: dict) -> dict | None:
    """Collectives that nothing hides: on a GPU, collective kernels with no compute kernel
    beside them; on a CPU, collectives in flight with no other operator running. A GPU run over
    gloo has no collective kernel (0 here): its all-reduces are host work that the GPU waits on,
    which host_sync and the idle causes read."""
    gpu, cpu = m["gpu"], m.get("cpu")
    if gpu:
        pct = gpu["exposed_comm_pct"]
        evidence = (f"collective kernels run with no compute kernel beside them {pct:.0f} % of "
                    f"the window (compute kernels {gpu['compute_pct']:.0f} %; utilization "
                    f"{gpu['utilization_pct']:.0f} % counts the collectives as work")
    elif cpu and m.get("distributed") and cpu["exposed_comm_pct"] is not None:
        # None: no operator but collective calls in the steps, so nothing shows what could have
        # hidden them (a real gloo rank's trace, 1 of 300, holds its all-reduces alone).
        pct = cpu["exposed_comm_pct"]
        evidence = (f"collectives are in flight with no other operator running {pct:.0f} % of "
                    f"the window, the training thread waiting on them (in collectives "
                    f"{m['distributed']['comm_pct']:.0f} %, the rest beside operators")
    else:
        return None
    if pct < EXPOSED_COMM_MIN_PCT:
        return None
    return finding(
        "exposed_communication", severity(pct, EXPOSED_COMM_MIN_PCT),
        f"communication bound: {evidence}; rule: >= {EXPOSED_COMM_MIN_PCT:.0f} % exposed)",
        "overlap communication with compute, or communicate less: smaller DDP buckets "
        "(bucket_cap_mb) start all-reducing during the backward pass; no_sync() on all but the "
        "last micro-batch when accumulating (see demos/ddp_no_sync/); fewer, larger collectives; "
        "FSDP's forward_prefetch and backward_prefetch", "ddp_no_sync", share_pct=pct)


def matrix_units(m: dict) -> str:
    """What a GPU's matrix-multiply units are called: tensor cores (NVIDIA), matrix cores (AMD)."""
    return "matrix cores" if m.get("device") == "rocm" else "tensor cores"


def rule_fp32_matmul(m: dict) -> dict | None:
    gpu = m["gpu"]
    if not gpu:
        return None
    # GEMMs off the tensor cores, less those whose signature gives 16-bit operands (FP16/BF16
    # math on the CUDA cores: no FP32 math to cast down)
    pct = gpu["non_tensor_core_gemm_pct"] - gpu.get("cuda_core_16bit_gemm_pct", 0.0)
    if pct < FP32_GEMM_MIN_PCT:
        return None
    units = matrix_units(m)
    own = gpu.get("handwritten_fp32_gemm_pct", 0.0)
    evidence = (f"FP32 math: GEMMs take {gpu['gemm_pct']:.0f} % of kernel time, {pct:.0f} % of "
                f"it not on {units} at a reduced precision (TF32, BF16, FP16, FP8; {units} share "
                f"{gpu['tensor_core_pct']:.0f} %; rule: >= {FP32_GEMM_MIN_PCT:.0f} % of kernel "
                f"time)")
    if own > 0:
        evidence += (f"; {own:.0f} % FP32 on the CUDA cores from the kernel's signature "
                     f"({gpu['handwritten_fp32_gemm_top']}: only float operands)")
    fix = ("run matmuls on tensor cores: torch.autocast(\"cuda\", dtype=torch.bfloat16), or at "
           "least TF32 (torch.backends.cuda.matmul.allow_tf32 = True)" if units == "tensor cores"
           else "run matmuls in BF16 on the matrix cores: torch.autocast(\"cuda\", "
                "dtype=torch.bfloat16) (ROCm takes the \"cuda\" device name)")
    if own >= HANDWRITTEN_FP32_FIX_MIN_SHARE * pct:  # autocast does not change their types
        fix += ("; your own kernel stays FP32 under autocast: call torch.matmul on 16-bit "
                "tensors instead, or give it 16-bit operands and WMMA or mma.sync")
    # Its share of the window: that kernel time over the window (pct is of kernel time), at most
    # the GPU's busy share (kernels on several streams can overlap). Graded on it, as the other
    # rules' shares: FP32 GEMMs that fill a small kernel time on an idle GPU are no high finding.
    window_pct = min(pct * gpu["kernel_ms_per_step"] * m["steps"] / m["window_ms"],
                     gpu["utilization_pct"])
    evidence += f"; {window_pct:.1f} % of the window"
    return finding("fp32_matmul", severity(window_pct, FP32_GEMM_MIN_PCT), evidence, fix,
                   "mixed_precision", share_pct=window_pct)


def matmuls_in_16_bit(gpu: dict) -> bool:
    """More tensor-core time in 16- or 8-bit math than FP32 matmul time (TF32 or off the tensor
    cores): autocast (or a 16-bit model) is on already."""
    fp32 = gpu["tf32_pct"] + gpu["non_tensor_core_gemm_pct"]
    return gpu["tensor_core_pct"] - gpu["tf32_pct"] > fp32


def rule_memory_bound_kernels(m: dict) -> dict | None:
    """A busy GPU in eager memory-bound kernels: fuse them (torch.compile), after BF16 halves
    the bytes where they move FP32 data and the matmuls are FP32 too (no autocast yet). A softmax
    over written-out attention scores is naive_attention's: its fix removes those kernels."""
    gpu = m["gpu"]
    pct = gpu.get("memory_bound_pct", 0.0) if gpu else 0.0
    if pct < MEMORY_BOUND_MIN_PCT or rule_naive_attention(m):
        return None
    fp32, layout = gpu["memory_bound_fp32_pct"], gpu["layout_conversion_pct"]
    evidence = (f"memory bound: the GPU spends {pct:.0f} % of the window in eager operators' "
                f"memory-bound kernels (batch norm, element-wise ops, reductions, layout "
                f"conversions), {fp32:.0f} % on FP32 data; GEMMs are {gpu['gemm_pct']:.0f} % of "
                f"kernel time (rule: >= {MEMORY_BOUND_MIN_PCT:.0f} % of the window)")
    fuse = ("fuse them: torch.compile writes one kernel per chain of them, which reads each "
            "tensor once")
    if layout >= MEMORY_BOUND_PART_MIN_PCT:
        fuse += (f"; layout conversions around the convolutions take {layout:.1f} % of the "
                 f"window, which channels_last (NHWC) removes")
    softmax = gpu.get("softmax_pct", 0.0)
    if (softmax >= MEMORY_BOUND_PART_MIN_PCT
            and not (m.get("attention") or {}).get("sdpa_ops_per_step")):
        fuse += (f"; softmaxes take {softmax:.1f} % of the window and no "
                 f"scaled_dot_product_attention ran: if they are attention's, SDPA never writes "
                 f"the scores (see demos/naive_attention/)")
    fix, demo = fuse, "launch_overhead"
    if fp32 >= MEMORY_BOUND_FP32_MIN_SHARE * pct and not matmuls_in_16_bit(gpu):
        fix, demo = ("BF16 first: torch.autocast(\"cuda\", dtype=torch.bfloat16) halves the bytes "
                     "each kernel moves; then " + fuse, "mixed_precision")
    return finding("memory_bound_kernels",
                   severity(100.0 - pct, 100.0 - MEMORY_BOUND_MIN_PCT, upper_limit=True),
                   evidence, fix, demo, share_pct=pct)


def rule_activation_memory(m: dict) -> dict | None:
    if not m["gpu"] or m["peak_memory_mb"] is None or not m.get("device_memory_mb"):
        return None
    pct = 100.0 * m["peak_memory_mb"] / m["device_memory_mb"]
    if pct < ACTIVATION_MEMORY_MIN_PCT:
        return None
    return finding(
        "activation_memory", "high" if pct >= ACTIVATION_MEMORY_HIGH_PCT else "medium",
        f"memory bound: peak allocated {m['peak_memory_mb']:.0f} MB is {pct:.0f} % of the GPU's "
        f"{m['device_memory_mb']:.0f} MB (rule: >= {ACTIVATION_MEMORY_MIN_PCT:.0f} %)",
        "recompute activations in the backward pass instead of keeping them: "
        "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) per block"
        if m.get("training", True) else
        "no backward pass keeps activations here (inference): a smaller batch per call, "
        "weights and caches (a KV cache) in BF16 or FP8, or memory-efficient attention "
        "(scaled_dot_product_attention)",
        "activation_checkpointing" if m.get("training", True) else None)


def rule_memory_growth(m: dict) -> dict | None:
    """Memory allocated at the steps' ends grows along a line (memory.memory_metrics), by at least
    MEMORY_GROWTH_MIN_PCT of the steps' peak a step, fast enough to fill the memory within
    MEMORY_GROWTH_FULL_WITHIN_STEPS steps: something each step allocates outlives it."""
    memory = m.get("memory")
    if not memory or memory["growth_fit_r2"] is None:
        return None
    growth, r2 = memory["growth_mb_per_step"], memory["growth_fit_r2"]
    peak = memory["steps_peak_allocated_mb"]
    pct = 100.0 * growth / peak if peak > 0 else 0.0
    if r2 < MEMORY_GROWTH_R2_MIN or pct < MEMORY_GROWTH_MIN_PCT:
        return None
    capacity = m.get("device_memory_mb")
    of = (f"the GPU's {capacity:,.0f} MB" if capacity else
          f"{MEMORY_ASSUMED_CAPACITY_MB:,.0f} MB (assumed: the trace gives no memory size)")
    capacity = capacity or MEMORY_ASSUMED_CAPACITY_MB
    full_in = max(0.0, (capacity - memory["allocated_mb_at_step_end"][-1]) / growth)
    if full_in > MEMORY_GROWTH_FULL_WITHIN_STEPS:
        return None
    ends = memory["allocated_mb_at_step_end"]
    evidence = (
        f"memory grows {growth:,.2f} MB a step ({pct:.1f} % of the steps' peak {peak:,.1f} MB): "
        f"allocated at the ends of {memory['steps_read']} recorded steps {ends[0]:,.1f} -> "
        f"{ends[-1]:,.1f} MB, a line with R^2 {r2:.2f}; at that rate it fills {of} in "
        f"{full_in:,.0f} steps")
    kept = memory["kept_by_operator"]
    if kept:
        evidence += (f"; kept from each step and never freed: {memory['kept_mb_per_step']:,.2f} "
                     f"MB a step, allocated by " + ", ".join(
                         f"{op['operator']} ({op['mb_per_step']:,.2f} MB, "
                         f"{op['allocations_per_step']:.1f} allocations a step)" for op in kept))
    evidence += (f" (rule: R^2 >= {MEMORY_GROWTH_R2_MIN:g} over >= {GROWTH_FIT_MIN_STEPS} steps, "
                 f">= {MEMORY_GROWTH_MIN_PCT:g} % of the peak a step, full within "
                 f"{MEMORY_GROWTH_FULL_WITHIN_STEPS:,} steps)")
    return finding(
        "memory_growth", severity(full_in, MEMORY_GROWTH_FULL_WITHIN_STEPS, upper_limit=True),
        evidence,
        "keep nothing across steps that holds a step's tensors or its autograd graph: sum "
        "loss.detach() (or read loss.item() every N steps) instead of adding the loss tensor to "
        "a total; append detached summaries (.detach(), .argmax(-1), a running count of correct "
        "predictions) instead of outputs that hold their graph; clear lists and caches you fill "
        "each step", "memory_leak")


def frame_ids(frame: str, ids: list[int]) -> str:
    """"frame 1 under compile ids 2, 3, 5 (up to its 6th compile)"."""
    return (f"frame {frame} under compile id{'s' * (len(ids) > 1)} {', '.join(map(str, ids))} "
            f"(up to its {ordinal(ids[-1] + 1)} compile)")


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def rule_recompiles(m: dict) -> dict | None:
    """torch.compile recompiling in the recorded steps (compiled.compiled_metrics): compiling
    inside them, or a frame under RECOMPILE_DISTINCT_IDS_MIN compile ids, or one whose compile id
    has reached DYNAMO_RECOMPILE_LIMIT (its later new values run eagerly). Withheld under
    initialization: a cold trace compiles in its first steps, and may recompile once for a shape."""
    compiled = m.get("compiled")
    if not compiled:
        return None
    frames = {frame: entry["compile_ids"] for frame, entry in compiled["frames"].items()
              if len(entry["compile_ids"]) >= RECOMPILE_DISTINCT_IDS_MIN
              or (entry["compile_ids"] and entry["compile_ids"][-1] >= DYNAMO_RECOMPILE_LIMIT - 1)}
    compiling = compiled["compiling_ms"]
    if not frames and compiling <= 0:
        return None
    parts = []
    if frames:
        parts.append("; ".join(frame_ids(frame, ids) for frame, ids in frames.items())
                     + f" in {compiled['steps_read']} recorded steps: a graph per value of "
                       f"something that changes between calls")
    at_limit = [frame for frame, ids in frames.items() if ids[-1] >= DYNAMO_RECOMPILE_LIMIT - 1]
    if at_limit:
        parts.append(f"frame {', '.join(at_limit)} reached Dynamo's default recompile_limit "
                     f"({DYNAMO_RECOMPILE_LIMIT}): a call that fails its guards now runs it "
                     f"eagerly, with one warning")
    if compiling > 0:
        steps = compiled["compiling_steps"]
        built = (f"; it built compile id{'s' * (len(compiled['compiled_in_steps']) > 1)} "
                 f"{', '.join(compiled['compiled_in_steps'])}" if compiled["compiled_in_steps"]
                 else "")
        parts.append(f"{compiling:,.1f} ms of compiling inside the steps (step"
                     f"{'s' * (len(steps) > 1)} {', '.join(str(k + 1) for k in steps)}{built})")
    evidence = "; ".join(parts) + (
        f" (rule: >= {RECOMPILE_DISTINCT_IDS_MIN} compile ids of one frame, or id >= "
        f"{DYNAMO_RECOMPILE_LIMIT - 1}, or compiling inside the steps after start-up)")
    level = "high" if at_limit or compiling > 0 else "medium"
    return finding(
        "recompiles", level, evidence,
        "run with TORCH_LOGS=recompiles: it prints each recompile's failed guard (the value and "
        "its line). A Python int or float that changes every call and steers the code (a loop "
        "count, a slice, a branch) makes a graph per value: pass it as a tensor (a mask over a "
        "fixed maximum), round it to a few buckets, or mark a changing size dynamic "
        "(torch._dynamo.mark_dynamic); torch.compiler.set_stance('fail_on_recompile') makes a "
        "recompile an error", "recompiles")


def rule_graph_breaks(m: dict) -> dict | None:
    """Compiled regions that run operators eagerly between their graphs (a graph break), at least
    GRAPH_BREAKS_PER_STEP_MIN a recorded step (compiled.compiled_metrics)."""
    compiled = m.get("compiled")
    if not compiled or compiled["graph_breaks_per_step"] < GRAPH_BREAKS_PER_STEP_MIN:
        return None
    breaks = compiled["graph_breaks_per_step"]
    eager = ", ".join(f"{op['name']} ({op['calls_per_step']:.1f} a step, "
                      f"{op['ms_per_step']:.2f} ms)" for op in compiled["eager_operators"])
    nested = compiled["nested_regions_per_step"]
    evidence = (
        f"{breaks:.1f} graph break{'s' * (breaks != 1)} a step: the compiled region of frame"
        f"{'s' * (len(compiled['broken_frames']) > 1)} {', '.join(compiled['broken_frames'])} "
        f"runs operators eagerly between its graphs, {compiled['eager_in_regions_ms_per_step']:.2f}"
        f" ms a step ({eager})"
        + (f", and {nested:.1f} region{'s' * (nested != 1)} a step of a frame resumed after a "
           f"break nest{'s' * (nested == 1)} in it" if nested else "")
        + f"; {compiled['regions_per_step']:.1f} compiled regions a step in all (rule: >= "
          f"{GRAPH_BREAKS_PER_STEP_MIN:g} a step)")
    return finding(
        "graph_breaks", severity(breaks, GRAPH_BREAKS_PER_STEP_MIN), evidence,
        "run with TORCH_LOGS=graph_breaks: it prints each break's line and reason. Keep .item(), "
        ".tolist(), print and Python branches on tensor values out of the compiled code (a "
        "torch.where or clamp instead of an if on a tensor, logging after the step), or compile "
        "with fullgraph=True so that a break is an error", "recompiles")


def copies_up(up: dict) -> str:
    """"2.0 copies a step of 77.1 MB each at 7.8 GB/s, all from pageable memory": the
    host-to-device copies as the trace shows them (metrics.copy_metrics)."""
    size = (f" of {up['mb'] / up['count']:.1f} MB each" if up["mb"] is not None and up["count"]
            else "")
    rate = f" at {up['gb_per_s']:.1f} GB/s" if up["gb_per_s"] is not None else ""
    pinned, pageable = up["pinned_pct"], up["pageable_pct"]
    if pinned is None:
        memory = "the trace does not say from which host memory (pinned or pageable)"
    elif pinned == 100.0 or pageable == 100.0:
        memory = f"all from {'pinned' if pinned == 100.0 else 'pageable'} memory"
    else:
        memory = f"{pinned:.0f} % of their time from pinned memory, {pageable:.0f} % from pageable"
    return f"{up['count']:.1f} copies a step{size}{rate}, {memory}"


def rule_h2d_copy(m: dict) -> dict | None:
    """Host-to-device copies that the step waits for: copy time with no kernel beside it, or
    syncs inside the copies (from pageable memory, or blocking) with the GPU idle after them.
    The fix leaves out what the copies do already: pinning, where pageable memory holds under
    H2D_PAGEABLE_MIN_PCT of their time; overlap, where the trace runs no kernel."""
    gpu = m["gpu"]
    if not gpu:
        return None
    up = gpu["copies_per_step"]["h2d"]
    pageable = up["pageable_pct"]
    pinned_already = pageable is not None and pageable < H2D_PAGEABLE_MIN_PCT
    exposed = gpu["h2d_exposed_pct"]
    syncs = gpu["syncs_by_cause_per_step"]["h2d_copy"]
    sync_idle = gpu["sync_idle_pct_by_cause"]["h2d_copy"]
    copy_bound = exposed >= H2D_MIN_PCT
    waits = syncs >= HOST_SYNC_PER_STEP_MIN and sync_idle >= HOST_SYNC_IDLE_MIN_PCT
    if not copy_bound and not waits:
        return None
    evidence, levels = [], []
    if copy_bound:
        evidence.append(
            f"copy bound: host-to-device copies with no kernel beside them take {exposed:.0f} % "
            f"of the window (all copies: {gpu['h2d_pct']:.0f} %; rule: >= {H2D_MIN_PCT:.0f} % "
            f"uncovered)")
        levels.append(severity(exposed, H2D_MIN_PCT))
        if up["count"]:
            evidence.append(copies_up(up))
    if waits:
        evidence.append(
            f"the host waits for the GPU in {syncs:.1f} host-to-device copies per step "
            f"({sync_sources(gpu, ('h2d_copy',))}), and the GPU idles {sync_idle:.0f} % of the "
            f"window in the gaps they end in (rule: >= {HOST_SYNC_PER_STEP_MIN:.0f}/step and "
            f">= {HOST_SYNC_IDLE_MIN_PCT:.0f} %)")
        levels.append(severity(sync_idle, HOST_SYNC_IDLE_MIN_PCT))
    fixes = []
    if waits and pinned_already:
        fixes.append("copy with .to(device, non_blocking=True): the copies come from pinned "
                     "memory already, so the host waits in blocking ones")
    elif waits:
        fixes.append("pin the source (DataLoader pin_memory=True, or tensor.pin_memory()) and copy "
                     "with .to(device, non_blocking=True): a copy from pageable memory, or a "
                     "blocking one, makes the host wait for the GPU")
    if copy_bound:
        rate = f" at {up['gb_per_s']:.1f} GB/s" if up["gb_per_s"] is not None else ""
        if pinned_already:
            source = f"the copies run{rate} from pinned memory already"
        elif pageable is not None:
            source = (f"pin the source (DataLoader pin_memory=True, or tensor.pin_memory()): "
                      f"{pageable:.0f} % of the copy time is from pageable memory, which the "
                      f"driver copies through a pinned buffer")
        else:
            source = ("the trace does not say whether the copies come from pinned memory: if "
                      "not, pin the source (DataLoader pin_memory=True, or tensor.pin_memory())")
        less = "copy less (uint8 images, normalise on the GPU), or keep the data on the GPU"
        fixes.append(f"{source}; no kernel ran, so nothing can hide the copies: {less}"
                     if not gpu["kernels_per_step"] else
                     f"{source}; copy on a side CUDA stream one batch ahead, so the copy runs "
                     f"under the previous step's kernels (non_blocking=True alone still queues "
                     f"it behind them), {less}")
    return finding("h2d_copy", "high" if "high" in levels else "medium", "; ".join(evidence),
                   "; ".join(fixes), "dataloader_workers",
                   share_pct=max(exposed if copy_bound else 0.0, sync_idle if waits else 0.0))


def optimizer_side(optimizer: dict) -> str:
    """Which side the optimizer's time (metrics.optimizer_metrics: the longer of the two) is, with
    the other beside it: its two times have their own names in every output."""
    cpu, gpu = optimizer["cpu_ms_per_step"], optimizer["gpu_ms_per_step"]
    if gpu is None:
        return "on the CPU"
    return (f"on the GPU; {cpu:.1f} ms on the CPU" if gpu > cpu
            else f"on the CPU; {gpu:.1f} ms on the GPU")


def rule_unfused_optimizer(m: dict) -> dict | None:
    optimizer = m.get("optimizer")
    if (not optimizer or optimizer["pct"] < UNFUSED_OPTIMIZER_MIN_PCT
            or optimizer["multi_tensor_ops_per_step"] > 0 or not optimizer["ops_per_step"]):
        return None
    us_per_op = optimizer["ms_per_step"] * US_PER_MS / optimizer["ops_per_step"]
    calls = optimizer.get("calls_per_tensor")
    passes = calls is not None and calls >= UNFUSED_OPTIMIZER_CALLS_PER_TENSOR_MIN
    if us_per_op > UNFUSED_OPTIMIZER_MAX_US_PER_OP and not passes:
        return None  # one pass a tensor, its time the bytes: a fused kernel reads them the same
    how = ("one small update per parameter tensor" if us_per_op <= UNFUSED_OPTIMIZER_MAX_US_PER_OP
           else f"{calls:.0f} calls per parameter tensor ({optimizer['tensors_per_step']:.0f} "
                f"tensors), each a pass over the tensor that a fused kernel makes once")
    return finding(
        "unfused_optimizer", severity(optimizer["pct"], UNFUSED_OPTIMIZER_MIN_PCT),
        f"optimizer bound: optimizer.step takes {optimizer['pct']:.0f} % of the window "
        f"({optimizer['ms_per_step']:.1f} ms/step, {optimizer_side(optimizer)}) in "
        f"{optimizer['ops_per_step']:.0f} operators "
        f"per step ({us_per_op:.1f} us each), none of them multi-tensor (_foreach_/_fused_): "
        f"{how} (rule: >= {UNFUSED_OPTIMIZER_MIN_PCT:.0f} %, "
        f"<= {UNFUSED_OPTIMIZER_MAX_US_PER_OP:.0f} us per operator or >= "
        f"{UNFUSED_OPTIMIZER_CALLS_PER_TENSOR_MIN:.0f} calls per tensor, no multi-tensor op)",
        "update every tensor in a few kernels: torch.optim.AdamW(params, fused=True) (CUDA; CPU "
        "since torch 2.4), or foreach=True; a hand-written loop over parameters becomes "
        "torch._foreach_* calls", "unfused_optimizer", share_pct=optimizer["pct"])


def rule_naive_attention(m: dict) -> dict | None:
    attention = m.get("attention") or {}
    side = attention.get("square_softmax_max")
    if side is None or side < NAIVE_ATTENTION_MIN_SEQ or attention["sdpa_ops_per_step"] > 0:
        return None
    return finding(
        "naive_attention", severity(side, NAIVE_ATTENTION_MIN_SEQ),
        f"attention written out: a softmax over a square [..., {side:.0f}, {side:.0f}] score "
        f"matrix and no scaled_dot_product_attention operator (rule: s >= "
        f"{NAIVE_ATTENTION_MIN_SEQ} tokens, from record_shapes): each head's s x s scores are "
        f"written to memory, read back and kept for backward",
        "torch.nn.functional.scaled_dot_product_attention(q, k, v): Flash or memory-efficient "
        "kernels on a GPU, a fused kernel on a CPU, that never hold the s x s matrix",
        "naive_attention")


def rule_ddp_sync(m: dict) -> dict | None:
    dist = m.get("distributed")
    if not dist or dist["synced_forwards_per_step"] < DDP_SYNCED_MICRO_BATCHES_MIN:
        return None
    return finding(
        "ddp_sync", severity(dist["synced_forwards_per_step"], DDP_SYNCED_MICRO_BATCHES_MIN),
        f"gradients all-reduced on every micro-batch: {dist['synced_forwards_per_step']:.1f} of "
        f"{dist['ddp_forwards_per_step']:.1f} DistributedDataParallel forwards per step are "
        f"followed by collectives ({dist['collectives_per_step']:.1f} per step, "
        f"{dist['comm_pct']:.0f} % of the window in them; rule: >= "
        f"{DDP_SYNCED_MICRO_BATCHES_MIN} synced micro-batches per step)",
        "accumulate locally and all-reduce once per step: run every micro-batch but the last "
        "(forward and backward) inside `with model.no_sync():`", "ddp_no_sync",
        # the collectives' time the fix removes: all but the last micro-batch's
        share_pct=dist["comm_pct"] * (1 - 1 / dist["synced_forwards_per_step"]))


RULES = (rule_dataloader, rule_host_region, rule_host_work_ops, rule_small_batch, rule_fp32_matmul,
         rule_memory_bound_kernels, rule_activation_memory, rule_memory_growth, rule_recompiles,
         rule_graph_breaks, rule_launch_overhead, rule_host_overhead,
         rule_cpu_op_overhead, rule_python_between_ops, rule_host_sync,
         rule_host_roundtrip, rule_h2d_copy,
         rule_unfused_optimizer, rule_naive_attention, rule_ddp_sync, rule_exposed_communication)


# Initialization (idle_causes.initialization_regime: context creation, module loading, first
# calls, compiling): when it holds at least this share of the window, the verdicts that read idle
# time or shares of the window (STEADY_STATE_RULES) are withheld, and a finding says why. The
# smallest share any of them fires on (host_sync's): initialization alone could make one fire.
# memory_growth too: start-up allocates as it goes (cuBLAS and cuDNN workspaces, autotuning,
# compiled graphs' buffers, the optimizer's state on its first step), and start-up that compiles a
# step at a time grows along a line as a leak does; its memory is not a leak. recompiles too: a cold
# trace compiles in its first steps, and a frame recompiles once when a shape first changes.
INIT_WITHHOLD_MIN_PCT = HOST_SYNC_IDLE_MIN_PCT  # % of the window in initialization
STEADY_STATE_RULES = ("dataloader", "host_region", "host_work_ops", "small_batch",
                      "launch_overhead", "exposed_communication", "unfused_optimizer",
                      "host_overhead", "host_sync", "host_roundtrip", "h2d_copy",
                      "cpu_op_overhead", "python_between_ops", "memory_growth", "recompiles")


def rule_initialization(m: dict) -> dict | None:
    found = m.get("initialization")
    if not found or found["pct"] < INIT_WITHHOLD_MIN_PCT:
        return None
    return finding("initialization", "high" if found["mostly"] else "medium",
                   "; ".join(found["evidence"]), found["fix"], None)


def findings_for(metrics: dict) -> list[dict]:
    found = [f for f in (rule(metrics) for rule in RULES) if f]
    start_up = rule_initialization(metrics)
    if start_up:  # what reads idle time reads the start-up's: withheld, and said
        withheld = [f["id"] + (" (its memory)" if f["id"] == "memory_growth" else "")
                    for f in found if f["id"] in STEADY_STATE_RULES]
        found = [start_up] + [f for f in found if f["id"] not in STEADY_STATE_RULES]
        start_up["evidence"] += (
            f" (rule: >= {INIT_WITHHOLD_MIN_PCT:.0f} % of the window; withheld, as they would "
            f"read the start-up's idle time: {', '.join(withheld) if withheld else 'none'})")
    return sorted(found, key=rank)


def rank(f: dict) -> tuple:
    """The findings' order: high before medium; within a level, first the findings that measure
    no share of the window (memory, compiling, the attention's shape: no slice of the step to
    weigh, but each holds the others back: a frame past the recompile limit runs eagerly, memory
    near full blocks a larger batch) in rule order, then the rest by share_pct, largest first (what
    the fix can win back). A finding that sets the step's pace (sets_pace) ranks as high, first
    of those with a share: the others' fixes win nothing before its. The sort is stable: equal
    shares keep rule order."""
    paces = f.get("sets_pace", False)
    return (f["severity"] != "high" and not paces, f["share_pct"] is not None, not paces,
            -(f["share_pct"] or 0.0))
