"""BF16 autocast (fixed): the same transformer, with its forward pass under
torch.autocast(dtype=torch.bfloat16). Matmuls and attention run in BF16 on the GPU's tensor cores;
weights, gradients and the optimizer stay FP32. BF16 has FP32's range, so no GradScaler is needed.
See README.md in this folder."""
import torch

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="mixed_precision", variant="fixed")
    harness.full_fp32_matmuls()  # TF32 (the middle rung) would put FP32 matmuls on tensor cores
    model, optimizer = models.transformer(run)
    harness.train_on_device(run, model, optimizer, data.staged_tokens(run),
                            loss_fn=models.token_cross_entropy,
                            autocast_dtype=torch.bfloat16)  # BF16 matmuls: on tensor cores


if __name__ == "__main__":
    main()
