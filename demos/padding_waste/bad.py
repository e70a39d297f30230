"""Padding waste (bad): texts of very different lengths (median 128 tokens, a long tail to 1024
on a GPU) go into batches at random, and each batch is padded to its longest text, so most of
what the model computes is padding: the sequence dimension of every step is the longest text's,
whatever the others need. See README.md in this folder."""
from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="padding_waste", variant="bad")
    texts = data.variable_length_texts(run)
    batches, token_counts = data.padded_batches(
        run, texts, data.random_order(run, texts))  # each batch padded to its longest text
    model, optimizer = models.text_classifier(run)
    harness.train_on_device(run, model, optimizer, batches, token_counts=token_counts)


if __name__ == "__main__":
    main()
