"""The ladder, rung 3: BF16 autocast. The forward pass and the loss run in bfloat16
where it is safe (matmuls, convolutions), on a GPU's tensor cores; the weights and the optimizer
stay FP32. At batch 256 the H100's step is mostly batch norm and element-wise kernels on FP32
data, which move half the bytes in BF16. It comes after the batch: at 16 images a step the H100
waited on the host's launches, and autocast's casts added to them, so BF16 ran slower there. On a
CPU only AMX tile units make BF16 faster; without them BF16 would be emulated (34x slower a step on
an AMD EPYC), so the math stays FP32 and the run says so. See README.md."""
from torch.utils.data import DataLoader

from common import data, harness, models, presets


def main() -> None:
    # the preset's batch: kernels big enough to fill the GPU, the step's fixed costs shared
    run = harness.setup(demo="ladder", variant="rung3_bf16")
    images = data.augmented_images(run)
    loader = DataLoader(images, batch_size=run.batch_size, shuffle=True, drop_last=True,
                        # the cores the training process leaves free prepare the next batches
                        num_workers=presets.loader_workers(run.device.type),
                        pin_memory=run.is_cuda, persistent_workers=True)
    model = models.resnet_model(run)
    optimizer = models.adamw(run, model, foreach=False)
    # convolutions and matmuls in BF16 on units made for it (tensor cores, AMX): half the bytes
    harness.train(run, model, optimizer, loader, autocast_dtype=harness.bf16_where_fast(run))


if __name__ == "__main__":
    main()
