"""Every activation kept (bad): a deep transformer over long sequences (16 blocks over 8 x 2048
tokens on a GPU) keeps every intermediate tensor of every block alive from the forward pass until
backward uses it. Activations, not weights, set the peak memory, and they cap the batch and the
sequence length you can train. See README.md in this folder."""
from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="activation_checkpointing", variant="bad")
    model, optimizer = models.transformer(run)  # each block's activations live until its backward
    harness.train_on_device(run, model, optimizer, data.staged_tokens(run),
                            loss_fn=models.token_cross_entropy)


if __name__ == "__main__":
    main()
