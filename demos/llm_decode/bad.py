"""Eager decoding with a growing KV cache (bad): each generated token runs every block's small
operators one by one, and torch.cat copies every block's keys and values into new, larger
tensors. At batch 1 a token's math is tiny: on a GPU it waits for the host to enqueue each of
hundreds of kernels. See README.md in this folder."""
from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="llm_decode", variant="bad")
    model = models.decoder(run, models.GrowingKVCache)  # torch.cat: new shapes every token
    next_token = model.next_token  # eager: each token's operators one by one
    run.config["torch_compile"] = None
    harness.generate(run, model, next_token, data.prompts(run))


if __name__ == "__main__":
    main()
