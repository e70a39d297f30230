"""The ladder, rung 2: a batch that fills the device. The preset's batch (256 on a GPU,
64 on a CPU) in place of 16: each kernel has enough work to fill the GPU, and each step's fixed
costs (launches, the optimizer's update of every weight) are paid for 4 to 16 times the samples.
On a GPU the analyzer names it first on rung 1: the GPU idles between short kernels. See README.md
in this folder."""
from torch.utils.data import DataLoader

from common import data, harness, models, presets


def main() -> None:
    # the preset's batch: kernels big enough to fill the GPU, the step's fixed costs shared
    run = harness.setup(demo="ladder", variant="rung2_batch")
    images = data.augmented_images(run)
    loader = DataLoader(images, batch_size=run.batch_size, shuffle=True, drop_last=True,
                        # the cores the training process leaves free prepare the next batches
                        num_workers=presets.loader_workers(run.device.type),
                        pin_memory=run.is_cuda, persistent_workers=True)
    model = models.resnet_model(run)
    optimizer = models.adamw(run, model, foreach=False)
    harness.train(run, model, optimizer, loader, autocast_dtype=None)  # FP32 math


if __name__ == "__main__":
    main()
