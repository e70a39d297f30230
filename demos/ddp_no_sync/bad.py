"""Gradient accumulation under DDP without no_sync (bad): each step accumulates 4 micro-batches,
but DistributedDataParallel all-reduces the gradients after every micro-batch's backward, so each
step moves the whole gradient between ranks 4 times where once would do. Launched by torchrun
(this script starts it: 2 ranks on a CPU over gloo, one per GPU over NCCL). See README.md here."""
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="ddp_no_sync", variant="bad")
    model = DistributedDataParallel(models.normed_mlp(run))
    optimizer = models.adamw(run, model, **models.fused_or_foreach(run))
    batches = data.staged_features(run)
    micro_batches = run.sizes["micro_batches"]

    def step() -> None:
        for index in range(micro_batches):
            inputs, targets = batches[index % len(batches)]
            with record_function("forward"):
                loss = F.cross_entropy(model(inputs), targets) / micro_batches
            with record_function("backward"):
                loss.backward()  # DDP all-reduces every gradient bucket here, every time
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    run.config["micro_batches"] = micro_batches
    harness.measure(run, step)


if __name__ == "__main__":
    main()
