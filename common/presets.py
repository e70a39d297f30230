"""Size presets: one per demo and device kind. The GPU preset is sized so the effect is large on a
real GPU; the CPU preset so a full run finishes in minutes on 2 cores and still shows the effect
where a CPU can; the smoke preset so a run takes seconds (tests, --smoke)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class Preset:
    batch_size: int
    steps: int  # timed steps, without the profiler
    warmup_steps: int  # run before timing: allocator, cuDNN autotune, DataLoader workers start
    sizes: dict[str, int] = field(default_factory=dict)  # demo-specific model and data sizes
    # Steps the profiler records; None: the schedule's default (runs.PROFILE_ACTIVE_STEPS). A demo
    # whose lesson is a trend over the steps (memory growing) records more.
    recorded_steps: int | None = None
    # The memory the run may use (--memory-budget-gb's default), for a demo whose lesson is a
    # budget (memory_ladder); None: no budget unless the flag gives one.
    memory_budget_gb: float | None = None


# The ladder's first rungs train at this batch on every device: a first script's batch, before
# rung 2 takes one that fills the device (the preset's).
LADDER_FIRST_BATCH = 16  # samples per step

# The preset a demo may add for a CPU without BF16 matrix units (mixed_precision's smaller
# sizes, the memory ladder's fewer steps).
CPU_WITHOUT_BF16_UNITS = "cpu_no_amx"

# Why those demos have it: a BF16 step at the demo's cpu preset where BF16 is emulated, in
# seconds, measured on a 2-core AMD EPYC with no BF16 instructions (the memory ladder's: rung 1's
# first step; see each preset's comment).
CPU_EMULATED_BF16_STEP_S = {"mixed_precision": 18.5, "memory_ladder": 96.6}

# The memory ladder on a CPU: a quarter of the width and half the depth of its cuda preset over
# 8 x 1024 tokens: rung 0's tensors peak at 1.26 GB, its process at 2.34 GB resident, ~3.7 s a
# step on a 2-core Xeon. The budget, 0.9 GB with PyTorch's own ~0.5 GB in it, is one that only
# the last rung (0.83 GB) fits: every fix is needed.
MEMORY_LADDER_CPU = Preset(batch_size=8, steps=4, warmup_steps=1, memory_budget_gb=0.9,
                           sizes=dict(vocab=1024, d_model=256, heads=4, blocks=4, seq_len=1024,
                                      mlp_ratio=4))

PRESETS: dict[str, dict[str, Preset]] = {
    "dataloader_workers": {
        # ResNet-50 on 224 px crops of ~ImageNet-sized JPEGs, the model of the published
        # data-loading figures. Measured on the H100 reference machine (16 cores, 2026-11-22): one
        # process prepares a batch of 256 in ~2 s (7.7 ms an image), 14 workers ~2,300 images/s;
        # ResNet-18 trained 4,900 images/s there, so its fixed run still waited for data half
        # the time, while ResNet-50 (~2.3x the math) trained 1,850 images/s, GPU bound. The warm-up
        # outlasts the first round of batches, which all workers finish at once: timing that
        # burst would flatter the fixed variant. 60 timed steps: bad's take 2 s each.
        "cuda": Preset(batch_size=256, steps=60, warmup_steps=20,
                       sizes=dict(source_px=256, crop_px=224, num_classes=1000, distinct_images=64,
                                  resnet_depth=50)),
        # Low-resolution training (64 px crops of 800 px photos) so that one CPU core trains a
        # batch in about twice the time another core takes to prepare it (measured on a 2-core
        # Xeon: 10.4 ms vs 5.7 ms per image); at 224 px training would hide the data cost.
        "cpu": Preset(batch_size=32, steps=40, warmup_steps=3,
                      sizes=dict(source_px=800, crop_px=64, num_classes=100, distinct_images=64)),
        "smoke": Preset(batch_size=4, steps=3, warmup_steps=1,
                        sizes=dict(source_px=64, crop_px=32, num_classes=10, distinct_images=4)),
    },
    # batch_size is the fixed variant's; bad.py asks setup() for a batch of 8.
    "small_batch": {
        # ResNet-18 at 128 px: ~0.6 GMAC forward per image (1.8 at 224 px x (128/224)^2), so a
        # training step of batch 256 is ~0.9 TFLOP: tens of ms on an H100, enough to hide the CPU's
        # ~10 ms of launches for ~300 kernels. Batch 8 is ~30 GFLOP: well under a millisecond of GPU
        # math behind the same launches, so the GPU idles. Activations ~3.5 GB at batch 256.
        # 200 steps: at batch 8 a step takes milliseconds, and a shorter window is mostly noise.
        "cuda": Preset(batch_size=256, steps=200, warmup_steps=10,
                       sizes=dict(image_px=128, num_classes=1000)),
        # 32 px images on one core: a step of 8 costs ~70 ms, most of it per-step work that does not
        # shrink with the batch (the SGD update of 11 M weights); 256 costs ~0.7 ms per sample.
        "cpu": Preset(batch_size=256, steps=25, warmup_steps=2,
                      sizes=dict(image_px=32, num_classes=100)),
        "smoke": Preset(batch_size=16, steps=3, warmup_steps=1,
                        sizes=dict(image_px=32, num_classes=10)),
    },
    "mixed_precision": {
        # 4 blocks of d_model 4096 (32 heads of 128; 805 M weights, 72 M in embedding, positions,
        # head), 16 x 1024 tokens: 86 TFLOP a step (models.transformer_train_flop). Wide enough
        # that BF16 matmuls dominate the step: at d_model 1024 (the first H100 run) the weight
        # casts, norms and the optimizer took two thirds of the BF16 step, which reached 20 % of
        # the H100's BF16 peak. Measured at this size there: FP32 (no TF32) 48.7 TFLOPS, 1.76 s a
        # step; BF16 autocast 453.6 TFLOPS, 45.8 % of the peak. Peak memory 29.6 GB in FP32.
        "cuda": Preset(batch_size=16, steps=10, warmup_steps=3,
                       sizes=dict(vocab=8192, d_model=4096, heads=32, blocks=4, seq_len=1024)),
        # A quarter-width model: ~0.5 s per FP32 step on one core, so the pair takes about a minute.
        "cpu": Preset(batch_size=8, steps=16, warmup_steps=2,
                      sizes=dict(vocab=1024, d_model=256, heads=4, blocks=4, seq_len=256)),
        "smoke": Preset(batch_size=2, steps=3, warmup_steps=1,
                        sizes=dict(vocab=128, d_model=64, heads=2, blocks=2, seq_len=32)),
        # A CPU without AMX tiles emulates BF16 (or runs it no faster than FP32), so the pair can
        # only show that, and says so: at the cpu preset the emulated BF16 step took 18.5 s on a
        # 2-core AMD EPYC (5 of a full CPU run's 14 minutes). Half the blocks, half the sequence,
        # half the batch and a few steps keep the pair near a minute there.
        CPU_WITHOUT_BF16_UNITS: Preset(batch_size=4, steps=4, warmup_steps=1,
                                       sizes=dict(vocab=1024, d_model=256, heads=4, blocks=2,
                                                  seq_len=128)),
    },
    "activation_checkpointing": {
        # 16 blocks of d_model 1024 over 32 x 2048 tokens, FP32: each block keeps ~4.5 GB of
        # activations for backward (measured on the H100 at batch 8: 2.27 GB a sample over all
        # blocks, beside ~3.5 GB of weights, gradients and AdamW state); at 32 the peak measured 79
        # GB, 97 % of an 80 GB H100, where the analyzer's activation_memory rule (>= 85 %) reads
        # memory bound, as a model that barely fits is (batch 8 used 27 % there). Checkpointed, a
        # block keeps only its input (270 MB) and one block is recomputed at a time. On a GPU with
        # more memory the bad run fits with room to spare and the rule stays silent, rightly.
        "cuda": Preset(batch_size=32, steps=10, warmup_steps=2,
                       sizes=dict(vocab=8192, d_model=1024, heads=16, blocks=16, seq_len=2048)),
        # Narrow and deep (12 blocks of 128 over 4 x 512 tokens) so activations dominate memory:
        # ~220 MB of them against ~10 MB of gradients; ~0.6 s per step on one core.
        "cpu": Preset(batch_size=4, steps=12, warmup_steps=2,
                      sizes=dict(vocab=1024, d_model=128, heads=4, blocks=12, seq_len=512)),
        "smoke": Preset(batch_size=2, steps=3, warmup_steps=1,
                        sizes=dict(vocab=128, d_model=32, heads=2, blocks=4, seq_len=64)),
    },
    "memory_leak": {
        # A 4-block transformer LM (d_model 512) over 16 x 512 tokens of a vocabulary of 8192: the
        # logits bad.py keeps are 16 x 512 x 8192 x 4 bytes = 268 MB a step, beside ~340 MB of
        # weights, gradients and AdamW state (21.3 M parameters), so an H100's 85,000 MB fill in
        # about 315 steps. 24 recorded steps: the fit of memory over the steps needs at least 5.
        "cuda": Preset(batch_size=16, steps=30, warmup_steps=5, recorded_steps=24,
                       sizes=dict(vocab=8192, d_model=512, heads=8, blocks=4, seq_len=512)),
        # 2 blocks of d_model 128 over 8 x 128 tokens of 4096: 16.8 MB of logits kept a step,
        # nearly three times the 5.9 MB of weights (1.47 M parameters); ~83 ms a step (p50) on one
        # training thread of a 2-core Xeon.
        "cpu": Preset(batch_size=8, steps=20, warmup_steps=3, recorded_steps=24,
                      sizes=dict(vocab=4096, d_model=128, heads=4, blocks=2, seq_len=128)),
        # 8 recorded steps: enough for the analyzer's fit, and a smoke run still takes seconds.
        # 2 x 64 x 2048 x 4 bytes = 1 MB of logits a step: at smaller sizes the leak would not
        # fill the analyzer's assumed CPU memory within its horizon, and rightly no verdict fires.
        "smoke": Preset(batch_size=2, steps=3, warmup_steps=1, recorded_steps=8,
                        sizes=dict(vocab=2048, d_model=32, heads=2, blocks=1, seq_len=64)),
    },
    "fragmentation": {
        # padding_waste's texts in random batches (median 128 tokens, up to 1024; 64 a batch)
        # through a 4-block classifier of d_model 1024: every step's activations have another
        # size, the pattern that strands cached blocks in the CUDA caching allocator.
        "cuda": Preset(batch_size=64, steps=100, warmup_steps=10,
                       sizes=dict(vocab=8192, d_model=1024, heads=16, blocks=4, max_len=1024,
                                  median_len=128, num_classes=10)),
        # A CPU has no caching allocator to fragment: a short run that only shows the scripts work.
        "cpu": Preset(batch_size=16, steps=5, warmup_steps=1,
                      sizes=dict(vocab=1024, d_model=64, heads=2, blocks=1, max_len=256,
                                 median_len=32, num_classes=10)),
        "smoke": Preset(batch_size=8, steps=3, warmup_steps=1,
                        sizes=dict(vocab=64, d_model=32, heads=2, blocks=1, max_len=128,
                                   median_len=16, num_classes=10)),
    },
    # The ladder: one training script made fast a fix a rung (demos/ladder/). Rungs 0-1 train
    # at LADDER_FIRST_BATCH; rung 2 takes the preset's batch, one that fills the device.
    "ladder": {
        # dataloader_workers' GPU setting: ResNet-50 on 224 px crops of ~ImageNet-sized JPEGs,
        # GPU bound at batch 256 in eager FP32 with the workers of the H100 machine's 16 cores;
        # compiled in BF16 the step outruns them (demos/ladder/README.md).
        "cuda": Preset(batch_size=256, steps=40, warmup_steps=10,
                       sizes=dict(source_px=256, crop_px=224, num_classes=1000,
                                  distinct_images=64, resnet_depth=50)),
        # dataloader_workers' CPU setting (64 px crops of 800 px photos, ResNet-18): a core
        # prepares an image in about half the time another trains on it.
        "cpu": Preset(batch_size=64, steps=12, warmup_steps=3,
                      sizes=dict(source_px=800, crop_px=64, num_classes=100, distinct_images=64)),
        # 32 a step from rung 2 (16 before): tiny images, so a smoke rung still takes seconds.
        "smoke": Preset(batch_size=32, steps=2, warmup_steps=1,
                        sizes=dict(source_px=64, crop_px=32, num_classes=10, distinct_images=4)),
    },
    # The memory ladder: one model made to fit a memory budget a fix a rung (demos/memory_ladder/).
    # Attention written out and a 4x MLP, so activations, not weights, fill the memory: per token
    # and block about 16 d_model numbers of linear layers' activations beside heads x seq_len of
    # the softmax kept for backward.
    "memory_ladder": {
        # 8 blocks of d_model 1024 (16 heads) over 16 x 2048 tokens: ~120 M weights (1.9 GB with
        # FP32 gradients and AdamW state). One sequence's step at these sizes, on a CPU, grew the
        # process by 3.96 GB in FP32, 1.79 GB in BF16 (rung 1): so rung 0 needs ~42 GB, rung 1
        # ~18 GB, both over the 16 GB budget (a 16 GB card's, a cap on an 80 GB H100), and
        # checkpointing (a block's activations at a time) should bring rung 2 to ~6 GB. On the
        # H100 rungs 0 and 1 stopped at the cap, and rung 2 fit at 10.3 GB of tensors (11.4 GB
        # reserved): the recomputed block's attention scores, 2.1 GB a tensor, were left out.
        "cuda": Preset(batch_size=16, steps=10, warmup_steps=2, memory_budget_gb=16.0,
                       sizes=dict(vocab=8192, d_model=1024, heads=16, blocks=8, seq_len=2048,
                                  mlp_ratio=4)),
        "cpu": MEMORY_LADDER_CPU,
        # A CPU without AMX tiles emulates the BF16 rungs' math (their BF16 weights are the memory
        # lesson, so they keep them): the cpu preset's 9 steps a rung (1 warm-up, 4 timed, 4 with
        # the profiler) ran past 10 minutes on a 2-core AMD EPYC, its first step 96.6 s. The same
        # sizes and budget (the fit needs them), the fewest steps that measure: 1 timed, 1 recorded
        # (the five rungs then took 32 minutes there; the tensors' peaks and the fit: the Xeon's).
        CPU_WITHOUT_BF16_UNITS: replace(MEMORY_LADDER_CPU, steps=1, recorded_steps=1),
        # Every rung fits, with room: the process alone is ~0.75 GB resident at these sizes, so a
        # fit here would be PyTorch's size, not the rungs'. Tests read the table, not the fit.
        "smoke": Preset(batch_size=4, steps=2, warmup_steps=1, memory_budget_gb=2.0,
                        sizes=dict(vocab=64, d_model=32, heads=2, blocks=2, seq_len=128,
                                   mlp_ratio=4)),
    },
    "recompiles": {
        # Early-exit training over 16 residual blocks 1024 wide, batch 256: depths 5..16 are 12
        # values, 4 more than Dynamo's recompile limit (8), so a third of the steps run eagerly.
        "cuda": Preset(batch_size=256, steps=200, warmup_steps=3, recorded_steps=8,
                       sizes=dict(width=1024, blocks=16, num_classes=10, min_depth=5)),
        # launch_overhead's 32 blocks 64 wide, batch 32, where compiling the whole model is 2.5x
        # faster than eager; depths 17..32 are 16 values, so half the steps run eagerly once the
        # limit is hit. Each new depth compiled in 3-7 s on a 2-core Xeon. 8 recorded steps: the
        # trace shows several depths' graphs, and the depths run eagerly, side by side.
        "cpu": Preset(batch_size=32, steps=200, warmup_steps=3, recorded_steps=8,
                      sizes=dict(width=64, blocks=32, num_classes=10, min_depth=17)),
        # 3 depths (2..4), under the limit: three compiles of a tiny graph, seconds in all.
        "smoke": Preset(batch_size=8, steps=5, warmup_steps=1,
                        sizes=dict(width=16, blocks=4, num_classes=10, min_depth=2)),
    },
    "launch_overhead": {
        # 48 blocks 256 wide, batch 64: each kernel does ~8 M multiply-adds or less, a few us on an
        # H100, while eager PyTorch needs ~5-10 us of CPU to launch each of the >1,000 per step.
        # warmup_steps 5: compilation, then CUDA-graph warm-up and recording take the next steps.
        "cuda": Preset(batch_size=64, steps=100, warmup_steps=5,
                       sizes=dict(width=256, blocks=48, num_classes=10)),
        # 32 blocks 64 wide, batch 32: on one core eager spends ~5 ms per step, most of it
        # dispatching ~500 tiny ops; compiling fuses them (measured 2.5x, after ~25 s of compiling).
        "cpu": Preset(batch_size=32, steps=300, warmup_steps=3,
                      sizes=dict(width=64, blocks=32, num_classes=10)),
        "smoke": Preset(batch_size=8, steps=5, warmup_steps=2,
                        sizes=dict(width=16, blocks=2, num_classes=10)),
    },
    "naive_attention": {
        # 4 attention blocks of d_model 1024 (16 heads of 64) over 8 x 2048 tokens in BF16: written
        # out, each block keeps its [8, 16, 2048, 2048] softmax for backward (2 GiB in FP32, as
        # autocast runs softmax) beside 1 GiB of BF16 scores; SDPA's Flash kernel keeps none.
        "cuda": Preset(batch_size=8, steps=20, warmup_steps=5,
                       sizes=dict(vocab=8192, d_model=1024, heads=16, blocks=4, seq_len=2048)),
        # 2 blocks of d_model 512 (8 heads of 64) over 4 x 1024 tokens, FP32, one core: the
        # written-out attention took 947 ms forward and backward per block against SDPA's 333 ms
        # (on the project's 2-core box); its scores are 128 MB a block.
        "cpu": Preset(batch_size=4, steps=3, warmup_steps=1,
                      sizes=dict(vocab=1024, d_model=512, heads=8, blocks=2, seq_len=1024)),
        # Tiny but long: 512 tokens, the verdict's cut, so the smoke trace can show it.
        "smoke": Preset(batch_size=1, steps=3, warmup_steps=1,
                        sizes=dict(vocab=64, d_model=32, heads=2, blocks=1, seq_len=512)),
    },
    "padding_waste": {
        # A 4-block transformer classifier (d_model 512) on texts of a median 128 tokens, up to
        # 1024, 64 a batch: a random batch is padded to ~900 tokens, about 85 % of it padding.
        "cuda": Preset(batch_size=64, steps=100, warmup_steps=10,
                       sizes=dict(vocab=8192, d_model=512, heads=8, blocks=4, max_len=1024,
                                  median_len=128, num_classes=10)),
        # 2 blocks of d_model 128 on texts of a median 64 tokens, up to 512, 32 a batch.
        "cpu": Preset(batch_size=32, steps=20, warmup_steps=2,
                      sizes=dict(vocab=1024, d_model=128, heads=4, blocks=2, max_len=512,
                                 median_len=64, num_classes=10)),
        "smoke": Preset(batch_size=8, steps=3, warmup_steps=1,
                        sizes=dict(vocab=64, d_model=32, heads=2, blocks=1, max_len=128,
                                   median_len=16, num_classes=10)),
    },
    "unfused_optimizer": {
        # 200 blocks 512 wide (802 parameter tensors), batch 128: each block's kernels take a few
        # us on an H100, so a for-each-tensor AdamW (~12 kernels per tensor, ~10,000 launches)
        # costs more than the forward and backward together; fused=True is one kernel per
        # group of tensors.
        "cuda": Preset(batch_size=128, steps=100, warmup_steps=10,
                       sizes=dict(width=512, blocks=200, num_classes=10)),
        # 100 blocks 128 wide (402 tensors), batch 64, one core: AdamW(foreach=False) ~22 ms a
        # step, fused ~4 ms (measured on the project's 2-core box), beside ~15 ms of model.
        "cpu": Preset(batch_size=64, steps=30, warmup_steps=3,
                      sizes=dict(width=128, blocks=100, num_classes=10)),
        # 50 blocks 16 wide (202 tensors): little math, so the per-tensor loop shows even here.
        "smoke": Preset(batch_size=8, steps=3, warmup_steps=1,
                        sizes=dict(width=16, blocks=50, num_classes=10)),
    },
    "ddp_no_sync": {
        # batch_size is one micro-batch on one rank; MICRO_BATCHES of them make a step. 8 blocks
        # 4096 wide (134 M weights, 537 MB of FP32 gradients to all-reduce): over NVLink NCCL
        # moves that in a few ms; ranks sharing one GPU over gloo go through host memory.
        "cuda": Preset(batch_size=32, steps=20, warmup_steps=3,
                       sizes=dict(width=4096, blocks=8, num_classes=10, micro_batches=4)),
        # 8 blocks 1024 wide (8.4 M weights, 34 MB of gradients) on 2 ranks over gloo: the issue's
        # trial measured 2.1 s -> 0.8 s a step with 4 micro-batches.
        "cpu": Preset(batch_size=16, steps=5, warmup_steps=1,
                      sizes=dict(width=1024, blocks=8, num_classes=10, micro_batches=4)),
        "smoke": Preset(batch_size=4, steps=2, warmup_steps=1,
                        sizes=dict(width=64, blocks=2, num_classes=10, micro_batches=4)),
    },
    "item_sync": {
        # 16 blocks 1024 wide, batch 1024: each block's matmul (2 GFLOP in FP32) and its dozen
        # small ops, ~34 syncs a step in bad. On the H100 reference machine (a 16-core VM whose
        # CPU spends ~24 us launching an op) the step is CPU bound, 14 ms of launching for 4.7 ms
        # of kernels, so removing the waits gains 1.26x: each wait exposes only the GPU's tail.
        # Width 2048 (measured there too) made the GPU the longer side, and each wait then costs
        # only the next launch's latency: 0.99x. Later, on the same kind of machine (60 timed
        # steps each): width 512 1.37x, width 1536 1.34x, width 1024 at batch 4096 1.08x. No size
        # reached the first target (1.5x); the waits cost most where CPU and GPU take about equal
        # time per block, a balance that moves with the machine's CPU.
        "cuda": Preset(batch_size=1024, steps=100, warmup_steps=5,
                       sizes=dict(width=1024, blocks=16, num_classes=10)),
        # The same loop, smaller: on a CPU nothing is asynchronous, so no effect is expected.
        "cpu": Preset(batch_size=256, steps=200, warmup_steps=3,
                      sizes=dict(width=256, blocks=8, num_classes=10)),
        # warm-up 2, 4 timed: with the 4 profiled steps, 10 in all, so fixed.py reads its sums
        # once.
        "smoke": Preset(batch_size=8, steps=4, warmup_steps=2,
                        sizes=dict(width=16, blocks=2, num_classes=10)),
    },
    "host_roundtrip": {
        # bad's round trips cost host time per sample (on the project's 2-core box ~80 ns a sample
        # for the loop over .tolist(), ~80 ns for making its list a tensor: ~5 ms at 32,768 with
        # the rest), and its 7 syncs a step leave the GPU idle while that Python runs. fixed's
        # step is under a hundred small kernels; at width 256 with two blocks (~0.8 MFLOP a
        # sample) the GPU's work stays around a millisecond or two, so the host work is most of
        # bad's step: a big batch of a small model, as tabular and ranking models train. Two
        # classes: binary focal loss, its usual setting.
        "cuda": Preset(batch_size=32768, steps=100, warmup_steps=5,
                       sizes=dict(width=256, blocks=2, num_classes=2)),
        # One block 32 wide: the model's own work (~0.27 us a sample on one core) is about what
        # bad's round trips add (~0.2 us), so fixed ran 1.7-1.9x the samples/s on the 2-core box.
        # Two classes, not ten: there log_softmax over 10 classes took 0.42 ms at this batch
        # (0.07 ms over 2), more than bad's whole loop (0.34 ms). 1,000 steps: ~2 s of bad.
        "cpu": Preset(batch_size=4096, steps=1000, warmup_steps=5,
                      sizes=dict(width=32, blocks=1, num_classes=2)),
        # 64 samples, so that a few are hard (a loss 1 standard deviation above the mean).
        "smoke": Preset(batch_size=64, steps=3, warmup_steps=1,
                        sizes=dict(width=16, blocks=1, num_classes=2)),
    },
    # Inference: a step is one request (batch_size 1: one generation at a time); steps count
    # timed requests, warmup_steps the requests before them.
    "llm_decode": {
        # 8 blocks of 2048 (16 heads) and a 32,000-token head in BF16 at batch 1: a token reads
        # ~0.94 GB of weights, ~0.35 ms of H100 memory bandwidth, behind ~180 eager operators a
        # token at ~20 us of host time each (~3.5 ms): eager decoding is host bound, the regime
        # gpt-fast measured (Llama-2-7B, A100: 25.5 -> 107 tokens/s with a static cache and
        # reduce-overhead). Wide enough that a replayed token (one graph launch, a few tens of us
        # of host time) keeps the GPU the long side, so fixed is not host bound in turn; at
        # GPT-2 small's 768 a token's weights take ~50 us, no more than that host time.
        # 3 warm-up requests: compiling, then recording the CUDA graph. 1 recorded request: its
        # 256 tokens are ~46,000 operators and as many kernels in bad; with 3 recorded, writing
        # bad's trace had not ended 100 s after its last request on the H100 machine.
        "cuda": Preset(batch_size=1, steps=20, warmup_steps=3, recorded_steps=1,
                       sizes=dict(vocab=32000, d_model=2048, heads=16, blocks=8,
                                  prompt_tokens=128, new_tokens=256)),
        # Small enough that the host's cost per operator dominates, as a GPU's launches do at
        # batch 1: 8 blocks of 64 on one core. Trials on the project's 2-core box gave 1.57x
        # (8 blocks of 64), 1.49x (8 of 96) and 1.24x (12 of 128) more tokens/s compiled with a
        # static cache than eager with torch.cat.
        "cpu": Preset(batch_size=1, steps=30, warmup_steps=2,
                      sizes=dict(vocab=1024, d_model=64, heads=4, blocks=8,
                                 prompt_tokens=32, new_tokens=128)),
        "smoke": Preset(batch_size=1, steps=3, warmup_steps=1,
                        sizes=dict(vocab=256, d_model=32, heads=2, blocks=2,
                                   prompt_tokens=8, new_tokens=8)),
    },
    # A step is one batch of requests; steps count timed batches. Texts of words/2 to `words`
    # words (long reviews, support tickets), cut to max_len tokens for the model after
    # tokenizing all of them, as truncating pipelines do.
    "tokenizer_bound": {
        # A BERT-large-wide encoder (12 blocks of 1024) in BF16 over 256 x 512 tokens: ~40 TFLOP
        # a batch, ~100 ms of H100 by its FLOPs (more: a padding mask keeps attention unfused),
        # long enough to hide the Rust tokenizer's threads (~10 ms for 256 texts on 16 cores)
        # and short beside one Python thread's ~0.8 s for the same texts.
        "cuda": Preset(batch_size=256, steps=20, warmup_steps=3,
                       sizes=dict(vocab=8000, d_model=1024, heads=16, blocks=12, max_len=512,
                                  num_classes=2, words=800)),
        # Two small blocks over the first 128 tokens. On a CPU the model runs on the cores the
        # tokenizer uses; on the project's 2-core box a batch of 32 texts (~850 tokens each)
        # took the Python tokenizer ~117 ms, the Rust one (encode_batch_fast, 2 threads) ~7 ms
        # and this model ~38 ms: the fixed run's tokenizing is then a small part of its step, as
        # it is beside a GPU's model.
        "cpu": Preset(batch_size=32, steps=15, warmup_steps=2,
                      sizes=dict(vocab=4000, d_model=64, heads=4, blocks=2, max_len=128,
                                 num_classes=2, words=800)),
        # Texts long enough, and a model heavy enough, that tokenizing is most of bad's step and
        # little of fixed's even at this size (Rust's threads cost ~0.2 ms a call however few
        # texts): tests read the verdicts off these traces.
        "smoke": Preset(batch_size=4, steps=3, warmup_steps=1,
                        sizes=dict(vocab=1000, d_model=64, heads=2, blocks=2, max_len=128,
                                   num_classes=2, words=200)),
    },
}


def preset_name(device_type: str, smoke: bool, demo: str = "",
                bf16_matrix_units: bool = True) -> str:
    """smoke, cuda or cpu; on a CPU without BF16 matrix units (AMX), the demo's
    CPU_WITHOUT_BF16_UNITS preset where it has one."""
    if smoke:
        return "smoke"
    if (device_type == "cpu" and not bf16_matrix_units
            and CPU_WITHOUT_BF16_UNITS in PRESETS.get(demo, {})):
        return CPU_WITHOUT_BF16_UNITS
    return device_type


# A container's CPU quota (docker run --cpus, a Kubernetes CPU limit) leaves the affinity mask and
# os.cpu_count() at the host's count: a 4-CPU container on a 100-thread host would start ~100
# workers that the quota then throttles. Where the quota is (module constants, so tests can point
# them at fake files):
# cgroup v2 (kernel docs, admin-guide/cgroup-v2 "cpu.max"): "$MAX $PERIOD" in microseconds, $MAX
# "max" for no limit.
CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
# cgroup v1 (kernel docs, scheduler/sched-bwc): cpu.cfs_quota_us and cpu.cfs_period_us in
# microseconds, a quota of -1 for no limit.
CGROUP_V1_CPU_DIR = Path("/sys/fs/cgroup/cpu")


def read_words(*files: Path) -> list[str]:
    """The whitespace-separated words of the files, in order ([] when one cannot be read)."""
    try:
        return [word for file in files for word in file.read_text().split()]
    except OSError:
        return []


def cpus_from_quota(quota: str, period: str) -> int | None:
    """ceil(quota / period), at least 1: a quota of 1.5 CPUs still runs two threads at once, each
    throttled. None for no limit ("max" in v2, -1 in v1) or anything but a positive number."""
    if not (quota.isdigit() and period.isdigit()) or int(quota) == 0 or int(period) == 0:
        return None
    return max(1, -(-int(quota) // int(period)))


def cgroup_cpu_quota() -> int | None:
    """Whole CPUs the container's CPU quota grants; None when no quota is set (or no cgroup files
    are readable, as outside Linux). Both versions are read, as a host may mount either; the
    smaller limit wins."""
    v2 = read_words(CGROUP_V2_CPU_MAX)
    v1 = read_words(CGROUP_V1_CPU_DIR / "cpu.cfs_quota_us", CGROUP_V1_CPU_DIR / "cpu.cfs_period_us")
    limits = [cpus_from_quota(*words) for words in (v2, v1) if len(words) == 2]
    return min((cpus for cpus in limits if cpus is not None), default=None)


def usable_cpu_count() -> int:
    """Cores this process may use: its affinity mask (taskset, a cpuset) capped by the container's
    CPU quota. os.cpu_count() reads neither."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, cores if quota is None else min(cores, quota))


# With a GPU the training process only enqueues kernels and copies: it keeps two cores, one for its
# Python thread (which launches the kernels) and one for the DataLoader's pin-memory thread, which
# copies every batch into page-locked memory; torch.set_num_threads(2) lets its few CPU ops use
# both (torchrun gives each process one OpenMP thread by default). The other cores prepare data.
# On a CPU the training process does the math itself and gets half the cores.
MAIN_PROCESS_THREADS_CUDA = 2
# At most this many DataLoader workers (torchvision's ImageNet reference recipe,
# references/classification/train.py, defaults to -j 16 workers per GPU process): each worker is a
# process with its own copy of the dataset (~150 MiB here, see demos/dataloader_workers/README.md)
# and its own prefetched batches in /dev/shm. A machine that needs more workers than this to feed
# its GPU is better served by decoding on the GPU (see that README, "Cores").
MAX_LOADER_WORKERS = 16


def main_process_threads(device_type: str = "cpu") -> int:
    """Intra-op threads of the training process, the same in bad and fixed so the comparison is
    fair; the cores left over are what DataLoader workers can use in the fixed variants."""
    if device_type == "cuda":
        return min(MAIN_PROCESS_THREADS_CUDA, usable_cpu_count())
    return max(1, usable_cpu_count() // 2)


def loader_workers(device_type: str = "cpu") -> int:
    """DataLoader worker processes for the fixed variants: the cores the main process leaves,
    at least 1 and at most MAX_LOADER_WORKERS."""
    return min(MAX_LOADER_WORKERS, max(1, usable_cpu_count() - main_process_threads(device_type)))
