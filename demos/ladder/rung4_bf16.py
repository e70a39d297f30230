"""The ladder, rung 4: BF16 autocast. The forward pass and the loss run in bfloat16
where it is safe (matmuls, convolutions), on a GPU's tensor cores; the weights and the optimizer
stay FP32. It comes after the batch: at 16 images a step the H100 waited on the host's launches
most of the step, and autocast's casts added to them, so BF16 ran slower there. On a CPU only AMX
tile units make BF16 faster, and the run says what this CPU has. See README.md in this folder."""
import torch
from torch.utils.data import DataLoader

from common import data, harness, models, presets


def main() -> None:
    # the preset's batch: the step's fixed costs spread over more samples
    run = harness.setup(demo="ladder", variant="rung4_bf16")
    images = data.augmented_images(run)
    loader = DataLoader(images, batch_size=run.batch_size, shuffle=True, drop_last=True,
                        # the cores the training process leaves free prepare the next batches
                        num_workers=presets.loader_workers(run.device.type),
                        pin_memory=run.is_cuda, persistent_workers=True)
    model = models.resnet_model(run)
    optimizer = models.adamw(run, model, **models.fused_or_foreach(run))  # one update for all
    # convolutions and matmuls in BF16: tensor cores on a GPU, half the bytes to move
    harness.train(run, model, optimizer, loader, autocast_dtype=torch.bfloat16)


if __name__ == "__main__":
    main()
