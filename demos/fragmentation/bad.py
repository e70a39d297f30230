"""Fragmented GPU memory (bad): batches of texts of very different lengths, each padded to its
longest, so every step's activations have another size. The CUDA caching allocator keeps the
blocks it freed for reuse, but a block cut for one size fits the next size badly: memory reserved
from the GPU climbs far above what the tensors hold, in a saw-tooth of high peaks, until an
allocation fails with memory to spare. Needs a CUDA GPU to show: a CPU has no caching allocator.
See README.md in this folder."""
import os

for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):  # torch 2.9 renamed it; both read
    os.environ.pop(name, None)  # the allocator's default: a fixed-size segment per large request

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="fragmentation", variant="bad")
    run.config["alloc_conf"] = os.environ.get("PYTORCH_ALLOC_CONF")
    texts = data.variable_length_texts(run)
    batches, token_counts = data.padded_batches(run, texts, data.random_order(run, texts))
    model, optimizer = models.text_classifier(run)
    if not run.is_cuda:
        run.notes.append(harness.NO_CACHING_ALLOCATOR)
    harness.train_on_device(run, model, optimizer, batches, token_counts=token_counts)


if __name__ == "__main__":
    main()
