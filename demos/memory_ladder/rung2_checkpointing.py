"""The memory ladder, rung 2: activation checkpointing. Each block runs under
torch.utils.checkpoint, which keeps only the block's input and recomputes the inside of the block
in backward: the activations kept fall from every block's to one input a block plus one block's
while it is recomputed. The price is a second forward pass. See README.md in this folder."""
import torch
from torch.utils.checkpoint import checkpoint

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="memory_ladder", variant="rung2_checkpointing")
    model, optimizer = models.attention_lm(
        run, attention=models.naive_attention,  # the seq x seq scores, written out and kept
        dtype=torch.bfloat16,  # 2 bytes a number: weights, gradients, AdamW state, activations
        # a block's input kept, its inside recomputed in backward when its activations are needed
        run_block=lambda block, x: checkpoint(block, x, use_reentrant=False))
    harness.train_on_device(run, model, optimizer, data.staged_tokens(run),
                            loss_fn=models.token_cross_entropy,
                            micro_batches=1)  # the whole batch at once


if __name__ == "__main__":
    main()
