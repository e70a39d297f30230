"""Gradient accumulation under DDP with no_sync (fixed): the first 3 of each step's 4
micro-batches run forward and backward inside model.no_sync(), so their gradients only add up on
each rank, and DDP all-reduces once, in the last micro-batch's backward: a quarter of the traffic.
Launched by torchrun (this script starts it). See README.md in this folder."""
from contextlib import nullcontext

import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="ddp_no_sync", variant="fixed")
    model = DistributedDataParallel(models.normed_mlp(run))
    optimizer = models.adamw(run, model, **models.fused_or_foreach(run))
    batches = data.staged_features(run)
    micro_batches = run.sizes["micro_batches"]

    def step() -> None:
        for index in range(micro_batches):
            inputs, targets = batches[index % len(batches)]
            last = index == micro_batches - 1
            # forward and backward both inside: DDP decides in forward whether backward syncs
            with model.no_sync() if not last else nullcontext():
                with record_function("forward"):
                    loss = F.cross_entropy(model(inputs), targets) / micro_batches
                with record_function("backward"):
                    loss.backward()  # accumulates locally; all-reduces only when `last`
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    run.config["micro_batches"] = micro_batches
    harness.measure(run, step)


if __name__ == "__main__":
    main()
