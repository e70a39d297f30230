"""Enough DataLoader workers (fixed): worker processes decode and augment the next batches while
the model trains on this one; on a GPU the next batch, uint8 and pinned, is copied on a side
stream while this step computes. See README.md in this folder."""
from torch.utils.data import DataLoader

from common import data, harness, models, presets


def main() -> None:
    run = harness.setup(demo="dataloader_workers", variant="fixed")
    images = data.augmented_images(run, uint8=True)  # 1 byte per value: 4x fewer to share and copy
    workers = presets.loader_workers(run.device.type)  # the cores the training process leaves free
    loader = DataLoader(
        images, batch_size=run.batch_size, shuffle=True, drop_last=True,
        num_workers=workers,  # those cores prepare the next batches meanwhile
        pin_memory=run.is_cuda,  # page-locked batches: the host-to-GPU copy can run asynchronously
        persistent_workers=True,  # workers (and their copy of the dataset) outlive each epoch
        # each worker keeps up to 4 batches ready, absorbing slow ones (fewer if /dev/shm is small)
        prefetch_factor=data.shm_prefetch_factor(run, images, workers, wanted=4),
    )
    model, optimizer = models.resnet(run)
    harness.train(run, model, optimizer,
                  data.prefetch_to_device(loader, run))  # next batch copied during this step


if __name__ == "__main__":
    main()
