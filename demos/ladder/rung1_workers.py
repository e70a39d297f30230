"""The ladder, rung 1: DataLoader workers. Worker processes decode and augment the
next batches while the model trains on this one, so the training process no longer waits for
data; on a GPU the batches are pinned, so their copy can run asynchronously. See README.md in this
folder."""
from torch.utils.data import DataLoader

from common import data, harness, models, presets


def main() -> None:
    run = harness.setup(demo="ladder", variant="rung1_workers",
                        batch_size=presets.LADDER_FIRST_BATCH)
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
