"""An optimizer that steps one tensor at a time (bad): AdamW with foreach=False walks the model's
parameter tensors in a Python loop (802 on a GPU: 200 blocks of LayerNorm + Linear) and runs about
a dozen small ops on each, so optimizer.step() is thousands of tiny kernels, each launched on its
own, and takes longer than the forward and backward passes. See README.md in this folder."""
from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="unfused_optimizer", variant="bad")
    model = models.normed_mlp(run)
    optimizer = models.adamw(run, model, foreach=False)  # a loop over tensors, ~12 ops each
    harness.train_on_device(run, model, optimizer, data.staged_features(run))


if __name__ == "__main__":
    main()
