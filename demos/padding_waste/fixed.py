"""Length-bucketed batches (fixed): the same texts, each seen once an epoch as in bad.py, but
sorted by length before they are cut into batches (the batches are then shuffled), so a batch
holds texts of about one length and its padding is a few tokens: the model computes on real
tokens. See README.md in this folder."""
from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="padding_waste", variant="fixed")
    texts = data.variable_length_texts(run)
    batches, token_counts = data.padded_batches(
        run, texts, data.length_sorted_order(run, texts))  # like lengths together: little padding
    model, optimizer = models.text_classifier(run)
    harness.train_on_device(run, model, optimizer, batches, token_counts=token_counts)


if __name__ == "__main__":
    main()
