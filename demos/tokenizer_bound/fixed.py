"""A fast tokenizer, a batch at a time (fixed): the same vocabulary and merges loaded into Hugging
Face `tokenizers`, whose encode_batch runs the batch's texts in Rust on every core. The same token
ids as bad.py. See README.md in this folder."""
from common import bpe, data, harness, models


def main() -> None:
    run = harness.setup(demo="tokenizer_bound", variant="fixed")
    model = models.serving_classifier(run)
    vocabulary = data.bpe_vocabulary(run)
    tokenizer = bpe.rust_tokenizer(vocabulary)  # the same tables, in Rust

    def tokenize(texts: list[str]) -> list[list[int]]:
        return bpe.rust_encode_batch(tokenizer, texts)  # compiled, the batch across all cores

    # Rust releases the GIL: a thread tokenizes the next batch while the model runs this one.
    harness.serve_texts(run, model, data.request_texts(run), tokenize, tokenize_ahead=True)


if __name__ == "__main__":
    main()
