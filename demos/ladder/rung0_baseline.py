"""The ladder, rung 0 (the baseline): ResNet trained on JPEG photos that the DataLoader decodes,
crops and flips, written as a first script is: the training process prepares every batch itself,
AdamW's loop over the parameters one at a time, a batch of 16, FP32 math, eager PyTorch.
Each later rung makes one fix, the one the analyzer names first on the rung before. See README.md
in this folder."""
from torch.utils.data import DataLoader

from common import data, harness, models, presets


def main() -> None:
    run = harness.setup(demo="ladder", variant="rung0_baseline",
                        batch_size=presets.LADDER_FIRST_BATCH)
    images = data.augmented_images(run)
    loader = DataLoader(images, batch_size=run.batch_size, shuffle=True, drop_last=True,
                        num_workers=0)
    model = models.resnet_model(run)
    optimizer = models.adamw(run, model, foreach=False)
    harness.train(run, model, optimizer, loader, autocast_dtype=None)  # FP32 math


if __name__ == "__main__":
    main()
