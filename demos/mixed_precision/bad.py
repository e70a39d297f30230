"""FP32 everywhere (bad): a transformer (12 blocks, d_model 1024, 512 tokens per sequence on a GPU)
trains in full FP32 with TF32 switched off, so no matmul can use the GPU's tensor cores: they run
on the FP32 units at a fraction of the chip's speed. See README.md in this folder."""
import torch

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="mixed_precision", variant="bad")
    # Full-precision FP32 matmuls and convolutions: TF32 (the middle rung) would use tensor cores.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, optimizer = models.transformer(run)
    harness.train_on_device(run, model, optimizer, data.staged_tokens(run),
                            loss_fn=models.token_cross_entropy)


if __name__ == "__main__":
    main()
