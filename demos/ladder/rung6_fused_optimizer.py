"""The ladder, rung 6 (the last): a fused optimizer. AdamW updates every parameter in one fused
operation (fused=True; foreach=True where this torch has no fused AdamW for the device) instead of
15 (H100) to 31 (CPU) small operations per parameter tensor. With the step compiled and the jitter
on the GPU, AdamW's loop held 26 % of the H100's window (rung 5's trace). See README.md in this
folder."""
import torch
from torch.utils.data import DataLoader

from common import data, harness, models, presets


def main() -> None:
    # the preset's batch: kernels big enough to fill the GPU, the step's fixed costs shared
    run = harness.setup(demo="ladder", variant="rung6_fused_optimizer")
    # a GPU takes the colour jitter (most of the workers' time); the workers decode, crop, flip
    images = data.augmented_images(run, uint8=True, jitter=not run.is_cuda)
    loader = DataLoader(images, batch_size=run.batch_size, shuffle=True, drop_last=True,
                        # the cores the training process leaves free prepare the next batches
                        num_workers=presets.loader_workers(run.device.type),
                        pin_memory=run.is_cuda, persistent_workers=True)
    model = models.resnet_model(run)
    harness.require_compile_toolchain(run)  # compiling builds generated code: needs a compiler
    model = torch.compile(model)  # one graph: small operations fused, fewer launches
    run.config["torch_compile"] = "default"
    optimizer = models.adamw(run, model, **models.fused_or_foreach(run))  # one update for all
    batches = data.prefetch_to_device(loader, run, jitter=run.is_cuda)  # jittered one step early
    # convolutions and matmuls in BF16 on units made for it (tensor cores, AMX): half the bytes
    harness.train(run, model, optimizer, batches, autocast_dtype=harness.bf16_where_fast(run))


if __name__ == "__main__":
    main()
