"""The ladder, rung 5: the colour jitter moves to the GPU. Compiled, the step outruns the
DataLoader's workers (on the H100 machine, 14 of them prepare about 2,200 images a second), and
ColorJitter is most of a worker's time on an image. The workers now decode, crop and flip, and hand
over uint8; the training process copies each batch and jitters it as a whole on the GPU, one batch
ahead. A CPU has no device to move the jitter to (the training process is the busier one): there
the workers keep it, and only the batches turn uint8. See README.md in this folder."""
import torch
from torch.utils.data import DataLoader

from common import data, harness, models, presets


def main() -> None:
    # the preset's batch: kernels big enough to fill the GPU, the step's fixed costs shared
    run = harness.setup(demo="ladder", variant="rung5_jitter_on_device")
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
    optimizer = models.adamw(run, model, foreach=False)
    batches = data.prefetch_to_device(loader, run, jitter=run.is_cuda)  # jittered one step early
    # convolutions and matmuls in BF16 on units made for it (tensor cores, AMX): half the bytes
    harness.train(run, model, optimizer, batches, autocast_dtype=harness.bf16_where_fast(run))


if __name__ == "__main__":
    main()
