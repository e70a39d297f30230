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
        # one process needs seconds to decode and augment it.
        "cuda": Preset(batch_size=256, steps=30, warmup_steps=5,
                       sizes=dict(source_px=256, crop_px=224, num_classes=1000, distinct_images=64)),
        # Low-resolution training (64 px crops of 800 px photos) so that one CPU core trains a
        # batch in about twice the time another core takes to prepare it (measured on a 2-core
        # Xeon: 10.4 ms vs 5.7 ms per image); at 224 px training would hide the data cost.
        "cpu": Preset(batch_size=32, steps=40, warmup_steps=3,
                      sizes=dict(source_px=800, crop_px=64, num_classes=100, distinct_images=64)),
        "smoke": Preset(batch_size=4, steps=3, warmup_steps=1,
                        sizes=dict(source_px=64, crop_px=32, num_classes=10, distinct_images=4)),
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
