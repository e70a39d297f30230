"""Recompiles and a graph break (bad): early-exit training, compiled whole. Each step trains the
network cut at a random depth, so that every prefix of the blocks learns to classify, and forward
loops over `self.blocks[:depth]` with `depth` a Python int. Dynamo unrolls that loop into the
graph, so every new depth is a new graph: it recompiles for each value until its recompile limit
(8 per function), then runs the other depths eagerly, with one warning. An `.item()` in an `if`
splits forward into two graphs with Python between them. See README.md in this folder."""
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

    def forward(self, x: torch.Tensor, depth: int) -> torch.Tensor:
        x = self.stem(x)
        if x.abs().amax().item() > ACTIVATION_LIMIT:  # a tensor read into Python: graph break
            x = x.clamp(-ACTIVATION_LIMIT, ACTIVATION_LIMIT)
        for block in self.blocks[:depth]:  # a Python int steers the loop: one graph per depth
            x = block(x)
        return self.head(x)


def main() -> None:
    run = harness.setup(demo="recompiles", variant="bad")
    width, blocks = run.sizes["width"], run.sizes["blocks"]
    model = EarlyExitMLP(width, blocks, run.sizes["num_classes"]).to(run.device)
    # plain SGD: a block cut off gets no update, whether its gradient is missing or zero
    optimizer = torch.optim.SGD(model.parameters(), lr=models.MLP_SGD_LR)
    model = torch.compile(model)
    run.config["torch_compile"] = "default"
    depths = np.random.default_rng(run.seed)  # the same depths in both variants
    run.config["depths"] = f"{run.sizes['min_depth']}..{blocks}"

    def next_depth() -> tuple[int]:
        return (int(depths.integers(run.sizes["min_depth"], blocks + 1)),)

    harness.train_on_device(run, model, optimizer, data.staged_features(run),
                            step_args=next_depth)


if __name__ == "__main__":
    main()
