"""FP32 everywhere (bad): a transformer (12 blocks, d_model 1024, 512 tokens per sequence on a GPU)
trains in full FP32 with TF32 switched off, so no matmul can use the GPU's tensor cores: they run
on the FP32 units at a fraction of the chip's speed. One exception is PyTorch's: on sm80+ GPUs the
memory-efficient attention kernel computes FP32 inputs in TF32 whatever the setting says (about
7 % of this model's FLOPs). See README.md in this folder."""
from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="mixed_precision", variant="bad")
    harness.full_fp32_matmuls()  # TF32 (the middle rung) would put FP32 matmuls on tensor cores
    model, optimizer = models.transformer(run)
    harness.train_on_device(run, model, optimizer, data.staged_tokens(run),
                            loss_fn=models.token_cross_entropy)


if __name__ == "__main__":
    main()
