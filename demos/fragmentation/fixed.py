"""Expandable segments (fixed): the same batches of varying size, but the CUDA caching allocator
maps its memory into segments that grow and shrink in place instead of one fixed-size segment per
request, so a freed tail is reused by the next size and memory reserved stays near what the
tensors hold. Needs a CUDA GPU to show: a CPU has no caching allocator. See README.md here."""
import os

for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):  # torch 2.9 renamed it; both read
    os.environ[name] = "expandable_segments:True"  # segments grow in place: freed tails reused

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="fragmentation", variant="fixed")
    run.config["alloc_conf"] = os.environ.get("PYTORCH_ALLOC_CONF")
    texts = data.variable_length_texts(run)
    batches, token_counts = data.padded_batches(run, texts, data.random_order(run, texts))
    model, optimizer = models.text_classifier(run)
    if not run.is_cuda:
        run.notes.append(harness.NO_CACHING_ALLOCATOR)
    harness.train_on_device(run, model, optimizer, batches, token_counts=token_counts)


if __name__ == "__main__":
    main()
