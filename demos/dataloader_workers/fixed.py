"""Enough DataLoader workers (fixed): worker processes decode and augment the next batches while
the model trains on this one, and pinned memory lets the copy to the GPU run asynchronously.
See README.md in this folder."""
from torch.utils.data import DataLoader

from common import data, harness, models, presets


def main() -> None:
    run = harness.setup(demo="dataloader_workers", variant="fixed")
    loader = DataLoader(
        data.augmented_images(run), batch_size=run.batch_size, shuffle=True, drop_last=True,
        num_workers=presets.loader_workers(run.device.type),  # other cores prepare batches meanwhile
        pin_memory=run.is_cuda,  # page-locked batches: the host-to-GPU copy can run asynchronously
        persistent_workers=True,  # workers (and their copy of the dataset) outlive each epoch
        prefetch_factor=4,  # each worker keeps up to 4 batches ready, absorbing slow samples
    )
    model, optimizer = models.resnet(run)
    harness.train(run, model, optimizer, loader,
                  non_blocking=True)  # with pinned memory the copy overlaps the previous step


if __name__ == "__main__":
    main()
