"""Activation checkpointing (fixed): each block runs under torch.utils.checkpoint, which keeps only
the block's input and recomputes the inside of the block during backward. Peak memory falls to
about one block's activations plus one input per block; the price is one more forward pass
(about a third more compute). See README.md in this folder."""
from torch.utils.checkpoint import checkpoint

from common import data, harness, models


def checkpointed(block, x):
    # Keep only x; rerun the block in backward to get its activations back when they are needed.
    return checkpoint(block, x, use_reentrant=False)


def main() -> None:
    run = harness.setup(demo="activation_checkpointing", variant="fixed")
    model, optimizer = models.transformer(run, run_block=checkpointed)
    harness.train_on_device(run, model, optimizer, data.staged_tokens(run),
                            loss_fn=models.token_cross_entropy)


if __name__ == "__main__":
    main()
