"""Fused attention (fixed): torch.nn.functional.scaled_dot_product_attention computes the same
softmax(q kᵀ / √d) v in one kernel (Flash or memory-efficient attention on a GPU, a fused kernel
on a CPU) that works through the sequence in tiles and never holds the seq x seq matrix: memory
grows with the sequence, not its square, and far fewer bytes move. See README.md in this folder."""
import torch

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="naive_attention", variant="fixed")
    model, optimizer = models.attention_lm(
        run, attention=torch.nn.functional.scaled_dot_product_attention)  # tiles, no s x s matrix
    harness.train_on_device(run, model, optimizer, data.staged_tokens(run),
                            loss_fn=models.token_cross_entropy,  # BF16 on a GPU, FP32 on a CPU
                            autocast_dtype=torch.bfloat16 if run.is_cuda else None)


if __name__ == "__main__":
    main()
