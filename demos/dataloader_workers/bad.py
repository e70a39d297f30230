"""Too few DataLoader workers (bad): the training process decodes and augments every image
itself, between steps, so the GPU (or the training core) waits for each batch.
See README.md in this folder."""
from torch.utils.data import DataLoader

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="dataloader_workers", variant="bad")
    loader = DataLoader(
        data.augmented_images(run), batch_size=run.batch_size, shuffle=True, drop_last=True,
        num_workers=0,  # the training process prepares every batch itself, one after another
    )
    model, optimizer = models.resnet(run)
    harness.train(run, model, optimizer, loader)


if __name__ == "__main__":
    main()
