"""Tokenization in Python on the request path (bad): each request's text goes through a pure-Python
BPE tokenizer, one request at a time, while the model waits; on a GPU it idles for most of every
batch. See README.md in this folder."""
from common import bpe, data, harness, models


def main() -> None:
    run = harness.setup(demo="tokenizer_bound", variant="bad")
    model = models.serving_classifier(run)
    vocabulary = data.bpe_vocabulary(run)

    def tokenize(texts: list[str]) -> list[list[int]]:
        return [bpe.python_encode(text, vocabulary) for text in texts]  # Python, one at a time

    harness.serve_texts(run, model, data.request_texts(run), tokenize)


if __name__ == "__main__":
    main()
