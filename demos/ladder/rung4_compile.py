"""The ladder, rung 4: torch.compile. Inductor fuses each block's small operations
(batch norm, ReLU, the residual add) into a few kernels, so a step launches fewer of them and reads
memory fewer times. Compiling happens in the warm-up, outside the timing. See README.md in this
folder."""
import torch
from torch.utils.data import DataLoader

from common import data, harness, models, presets


def main() -> None:
    # the preset's batch: kernels big enough to fill the GPU, the step's fixed costs shared
    run = harness.setup(demo="ladder", variant="rung4_compile")
    images = data.augmented_images(run)
    loader = DataLoader(images, batch_size=run.batch_size, shuffle=True, drop_last=True,
                        # the cores the training process leaves free prepare the next batches
                        num_workers=presets.loader_workers(run.device.type),
                        pin_memory=run.is_cuda, persistent_workers=True)
    model = models.resnet_model(run)
    harness.require_compile_toolchain(run)  # compiling builds generated code: needs a compiler
    model = torch.compile(model)  # one graph: small operations fused, fewer launches
    run.config["torch_compile"] = "default"
    optimizer = models.adamw(run, model, foreach=False)
    # convolutions and matmuls in BF16 on units made for it (tensor cores, AMX): half the bytes
    harness.train(run, model, optimizer, loader, autocast_dtype=harness.bf16_where_fast(run))


if __name__ == "__main__":
    main()
