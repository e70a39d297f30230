"""Too few DataLoader workers (bad): the training process decodes and augments every image
itself, between steps, so the GPU (or the training core) waits for each batch; on a GPU the
float32 batch is then copied in the compute stream, between steps, and the GPU waits again.
See README.md in this folder."""
from torch.utils.data import DataLoader

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="dataloader_workers", variant="bad")
    images = data.augmented_images(run)  # float32 pixels, normalised per image by the loader
    loader = DataLoader(
        images, batch_size=run.batch_size, shuffle=True, drop_last=True,
        num_workers=0,  # the training process prepares every batch itself, one after another
    )
    model, optimizer = models.resnet(run)
    harness.train(run, model, optimizer,
                  loader)  # .to(device) copies each batch in the compute stream, between steps


if __name__ == "__main__":
    main()
