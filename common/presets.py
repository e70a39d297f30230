"""Size presets: one per demo and device kind. The GPU preset is sized so the effect is large on a
real GPU; the CPU preset so a full run finishes in minutes on 2 cores and still shows the effect
where a CPU can; the smoke preset so a run takes seconds (tests, --smoke)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    batch_size: int
    steps: int  # timed steps, without the profiler
    warmup_steps: int  # run before timing: allocator, cuDNN autotune, DataLoader workers start
    sizes: dict[str, int] = field(default_factory=dict)  # demo-specific model and data sizes


PRESETS: dict[str, dict[str, Preset]] = {
    "dataloader_workers": {
        # ResNet-18 on 224 px crops of ~ImageNet-sized JPEGs: the GPU trains a batch in tens of ms,
        # one process needs seconds to decode and augment it. The warm-up outlasts the first round
        # of batches, which all workers finish at once (up to 14 on a 16-core machine): timing
        # that burst would flatter the fixed variant.
        "cuda": Preset(batch_size=256, steps=100, warmup_steps=30,
                       sizes=dict(source_px=256, crop_px=224, num_classes=1000, distinct_images=64)),
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
        # 12 blocks of d_model 1024 (~150 M weights + 17 M in embedding and head), 16 x 512 tokens:
        # ~9 TFLOP per step. FP32 without TF32 runs at most ~60 TFLOPS on an H100 (~150 ms), BF16 on
        # tensor cores at up to ~990 TFLOPS, so the matmuls stop dominating. Memory: ~2.7 GB of
        # weights, gradients and AdamW state, ~7 GB of FP32 activations (scaled dot-product
        # attention keeps no seq x seq matrix).
        "cuda": Preset(batch_size=16, steps=20, warmup_steps=5,
                       sizes=dict(vocab=8192, d_model=1024, heads=16, blocks=12, seq_len=512)),
        # A quarter-width model: ~0.5 s per FP32 step on one core, so the pair takes about a minute.
        "cpu": Preset(batch_size=8, steps=16, warmup_steps=2,
                      sizes=dict(vocab=1024, d_model=256, heads=4, blocks=4, seq_len=256)),
        "smoke": Preset(batch_size=2, steps=3, warmup_steps=1,
                        sizes=dict(vocab=128, d_model=64, heads=2, blocks=2, seq_len=32)),
    },
    "activation_checkpointing": {
        # 16 blocks of d_model 1024 over 8 x 2048 tokens, FP32: each block keeps ~1.1 GB of
        # activations for backward (~68 bytes x d_model per token), ~18 GB in all, beside ~3.5 GB of
        # weights, gradients and AdamW state. Checkpointed, a block keeps only its input (67 MB)
        # and one block is recomputed at a time: ~7 GB expected at the peak, about 0.3x.
        "cuda": Preset(batch_size=8, steps=15, warmup_steps=3,
                       sizes=dict(vocab=8192, d_model=1024, heads=16, blocks=16, seq_len=2048)),
        # Narrow and deep (12 blocks of 128 over 4 x 512 tokens) so activations dominate memory:
        # ~220 MB of them against ~10 MB of gradients; ~0.6 s per step on one core.
        "cpu": Preset(batch_size=4, steps=12, warmup_steps=2,
                      sizes=dict(vocab=1024, d_model=128, heads=4, blocks=12, seq_len=512)),
        "smoke": Preset(batch_size=2, steps=3, warmup_steps=1,
                        sizes=dict(vocab=128, d_model=32, heads=2, blocks=4, seq_len=64)),
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
    "item_sync": {
        # 16 blocks 1024 wide, batch 1024: each block's matmul (2 GFLOP in FP32, ~40 us on an H100)
        # takes about as long as the CPU needs to launch the block's dozen small ops, so the
        # CPU and the GPU overlap fully when nothing makes one wait for the other.
        "cuda": Preset(batch_size=1024, steps=100, warmup_steps=5,
                       sizes=dict(width=1024, blocks=16, num_classes=10)),
        # The same loop, smaller: on a CPU nothing is asynchronous, so no effect is expected.
        "cpu": Preset(batch_size=256, steps=200, warmup_steps=3,
                      sizes=dict(width=256, blocks=8, num_classes=10)),
        # warm-up 2: with the 5 profiled steps, 10 in all, so fixed.py reads its sums once.
        "smoke": Preset(batch_size=8, steps=3, warmup_steps=2,
                        sizes=dict(width=16, blocks=2, num_classes=10)),
    },
}


def preset_name(device_type: str, smoke: bool) -> str:
    return "smoke" if smoke else device_type


def usable_cpu_count() -> int:
    """Cores this process may run on (respects taskset/cgroup affinity, unlike os.cpu_count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


# With a GPU the training process only enqueues kernels and copies: two threads are plenty
# (torchrun gives each process one OpenMP thread by default), and the rest of the cores can
# prepare data. On a CPU the training process does the math itself and gets half the cores.
MAIN_PROCESS_THREADS_CUDA = 2


def main_process_threads(device_type: str = "cpu") -> int:
    """Intra-op threads of the training process, the same in bad and fixed so the comparison is
    fair; the cores left over are what DataLoader workers can use in the fixed variants."""
    if device_type == "cuda":
        return min(MAIN_PROCESS_THREADS_CUDA, usable_cpu_count())
    return max(1, usable_cpu_count() // 2)


def loader_workers(device_type: str = "cpu") -> int:
    """DataLoader worker processes for the fixed variants: the cores the main process leaves."""
    return max(1, usable_cpu_count() - main_process_threads(device_type))
