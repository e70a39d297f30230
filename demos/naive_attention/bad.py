"""Attention written out (bad): softmax(q kᵀ / √d) v as papers write it. Each layer materialises a
batch x heads x seq x seq score matrix (8 x 16 x 2048 x 2048 on a GPU), runs a matmul, a scale, a
softmax and a second matmul over it, each reading and writing the whole matrix, and keeps the
softmax for backward: memory grows with the square of the sequence. See README.md in this folder."""
import torch

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="naive_attention", variant="bad")
    model, optimizer = models.attention_lm(
        run, attention=models.naive_attention)  # the s x s scores, written out and kept
    harness.train_on_device(run, model, optimizer, data.staged_tokens(run),
                            loss_fn=models.token_cross_entropy,  # BF16 on a GPU, FP32 on a CPU
                            autocast_dtype=torch.bfloat16 if run.is_cuda else None)


if __name__ == "__main__":
    main()
