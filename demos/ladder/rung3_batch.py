"""The ladder, rung 3: a batch that fills the device. The preset's batch (256 on a GPU,
64 on a CPU) in place of 16: each step's fixed costs (launches, the optimizer's update of every
weight) are paid for 4 to 16 times the samples, and each kernel has enough work to fill the GPU.
See README.md in this folder."""
from torch.utils.data import DataLoader

from common import data, harness, models, presets


def main() -> None:
    # the preset's batch: the step's fixed costs spread over more samples
    run = harness.setup(demo="ladder", variant="rung3_batch")
    images = data.augmented_images(run)
    loader = DataLoader(images, batch_size=run.batch_size, shuffle=True, drop_last=True,
                        # the cores the training process leaves free prepare the next batches
                        num_workers=presets.loader_workers(run.device.type),
                        pin_memory=run.is_cuda, persistent_workers=True)
    model = models.resnet_model(run)
    optimizer = models.adamw(run, model, **models.fused_or_foreach(run))  # one update for all
    harness.train(run, model, optimizer, loader, autocast_dtype=None)  # FP32 math


if __name__ == "__main__":
    main()
