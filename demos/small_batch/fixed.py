"""A batch that fills the device (fixed): ResNet-18 trains on the preset's batch (256 on a GPU),
data already on the device. The fixed costs of a step are shared by 32 times more samples, and
each kernel has enough work to keep the GPU busy. See README.md in this folder."""
from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="small_batch", variant="fixed")  # the preset's batch: 256 on a GPU
    model, optimizer = models.resnet(run)
    harness.train_on_device(run, model, optimizer, data.staged_images(run))


if __name__ == "__main__":
    main()
