"""A small batch (bad): ResNet-18 trains on 8 samples per step, data already on the device. Every
step pays the same fixed costs (launching ~300 kernels, updating 11 M weights) for only 8 samples,
and each kernel has too little work to fill a GPU, so the GPU idles between launches.
See README.md in this folder."""
from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="small_batch", variant="bad",
                        batch_size=8)  # 8 samples per step: most of each step is fixed cost
    model, optimizer = models.resnet(run)
    harness.train_on_device(run, model, optimizer, data.staged_images(run))


if __name__ == "__main__":
    main()
