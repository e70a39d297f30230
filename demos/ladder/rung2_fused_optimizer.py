"""The ladder, rung 2: a fused optimizer. AdamW updates every parameter in one fused operation
(fused=True; foreach=True where this torch has no fused AdamW for the device) instead of 31 small
operations per parameter tensor. With the data waits gone, the analyzer names AdamW's loop
first on rung 1, on a CPU and on a GPU alike. See README.md in this folder."""
from torch.utils.data import DataLoader

from common import data, harness, models, presets


def main() -> None:
    run = harness.setup(demo="ladder", variant="rung2_fused_optimizer",
                        batch_size=presets.LADDER_FIRST_BATCH)
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
