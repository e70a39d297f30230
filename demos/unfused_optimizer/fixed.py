"""A fused optimizer (fixed): AdamW(fused=True) updates all the model's parameter tensors (802 on
a GPU: 200 blocks of LayerNorm + Linear) in a few kernels that each walk many tensors, instead of
a dozen small ops per tensor; where this torch has no fused AdamW for the device it takes
foreach=True (one op per step of the update, over all tensors), and says so. See README.md here."""
from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="unfused_optimizer", variant="fixed")
    model = models.normed_mlp(run)
    optimizer = models.adamw(run, model, **models.fused_or_foreach(run))  # a few kernels in all
    harness.train_on_device(run, model, optimizer, data.staged_features(run))


if __name__ == "__main__":
    main()
