"""A static KV cache and a compiled decode step (fixed): the cache is allocated once and written
in place, so every token has the same shapes; torch.compile fuses each token's small operators,
and on a GPU mode="reduce-overhead" records them as a CUDA graph replayed with one launch a token.
Compiling happens in the warm-up requests, outside the timing. See README.md in this folder."""
import torch

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="llm_decode", variant="fixed")
    model = models.decoder(run, models.StaticKVCache)  # written in place: same shapes every token
    harness.require_compile_toolchain(run)  # compiling builds generated code: needs a compiler
    # Fuse each token's small ops; on CUDA, replay the whole token as one CUDA graph launch.
    mode = "reduce-overhead" if run.is_cuda else "default"  # CUDA graphs exist only on CUDA
    next_token = torch.compile(model.next_token, mode=mode)
    run.config["torch_compile"] = mode
    harness.generate(run, model, next_token, data.prompts(run))


if __name__ == "__main__":
    main()
