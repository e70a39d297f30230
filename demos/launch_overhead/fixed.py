"""torch.compile (fixed): the same MLP, compiled. Inductor fuses each block's small ops into a few
kernels; on a GPU, mode="reduce-overhead" also records the forward and the backward pass as CUDA
graphs and replays each with one launch. Compiling happens in the warm-up, outside the timing, and
summary.json reports it (first_step_s). See README.md in this folder."""
import torch

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="launch_overhead", variant="fixed")
    model, optimizer = models.residual_mlp(run)
    harness.require_compile_toolchain(run)  # compiling builds generated code: needs a compiler
    # Fuse the small ops into a few kernels; on CUDA, replay each pass as one CUDA graph launch.
    mode = "reduce-overhead" if run.is_cuda else "default"  # CUDA graphs exist only on CUDA
    model = torch.compile(model, mode=mode)
    run.config["torch_compile"] = mode
    harness.train_on_device(run, model, optimizer, data.staged_features(run))


if __name__ == "__main__":
    main()
