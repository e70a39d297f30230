"""Recompiles and a graph break (fixed): the same early-exit training, compiled once. The depth
arrives as a tensor mask over the blocks, so it is data to the graph rather than code: every block
runs and the mask keeps the input of those past the exit. The clip runs unconditionally, which
changes nothing under the limit and needs no Python bool. One graph serves every depth. See
README.md in this folder."""
import numpy as np
import torch

from common import data, harness, models

ACTIVATION_LIMIT = 10.0  # the stem's outputs are clipped to +-10 before the blocks


class EarlyExitMLP(torch.nn.Module):
    """A stem, residual blocks, and one classifier head after whichever block runs last."""

    def __init__(self, width: int, blocks: int, num_classes: int):
        super().__init__()
        self.stem = torch.nn.Linear(width, width)
        self.blocks = torch.nn.ModuleList(models.ResidualBlock(width) for _ in range(blocks))
        self.head = torch.nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        # clamp is a no-op under the limit: the same values, no tensor read into Python, no break
        x = x.clamp(-ACTIVATION_LIMIT, ACTIVATION_LIMIT)
        for i, block in enumerate(self.blocks):  # a fixed loop: the mask, a tensor, picks the depth
            x = torch.where(keep[i], block(x), x)
        return self.head(x)


def main() -> None:
    run = harness.setup(demo="recompiles", variant="fixed")
    width, blocks = run.sizes["width"], run.sizes["blocks"]
    model = EarlyExitMLP(width, blocks, run.sizes["num_classes"]).to(run.device)
    # plain SGD: a block cut off gets no update, whether its gradient is missing or zero
    optimizer = torch.optim.SGD(model.parameters(), lr=models.MLP_SGD_LR)
    model = torch.compile(model)
    run.config["torch_compile"] = "default"
    depths = np.random.default_rng(run.seed)  # the same depths in both variants
    run.config["depths"] = f"{run.sizes['min_depth']}..{blocks}"
    # one mask per depth, made on the device before the steps: True for the blocks that run
    masks = [torch.arange(blocks, device=run.device) < depth for depth in range(blocks + 1)]

    def next_depth() -> tuple[torch.Tensor]:
        return (masks[int(depths.integers(run.sizes["min_depth"], blocks + 1))],)

    harness.train_on_device(run, model, optimizer, data.staged_features(run),
                            step_args=next_depth)


if __name__ == "__main__":
    main()
