"""The memory ladder, rung 3: gradient accumulation. The same batch of the same size trains in
micro-batches of a quarter, each forward and backward adding to the gradients, then one optimizer
step: the same update, with a quarter of the activations alive at a time. The price is four
smaller passes in place of one large one. See README.md in this folder."""
import torch
from torch.utils.checkpoint import checkpoint

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="memory_ladder", variant="rung3_accumulation")
    model, optimizer = models.attention_lm(
        run, attention=models.naive_attention,  # the seq x seq scores, written out and kept
        dtype=torch.bfloat16,  # 2 bytes a number: weights, gradients, AdamW state, activations
        # a block's input kept, its inside recomputed in backward when its activations are needed
        run_block=lambda block, x: checkpoint(block, x, use_reentrant=False))
    harness.train_on_device(run, model, optimizer, data.staged_tokens(run),
                            loss_fn=models.token_cross_entropy,
                            micro_batches=4)  # a quarter at a time: the same batch, 1/4 alive


if __name__ == "__main__":
    main()
