"""The loss computed where its values are (fixed): the focal weights as tensor ops on the whole
batch, the hard samples' statistic on the device, and a fixed-shape mask (torch.where) in place of
a boolean selection. The same numbers as bad.py, with no Python per sample, nothing copied to the
host or back, and no host-device sync. See README.md in this folder."""
import itertools

import torch
from torch.nn import functional as F
from torch.profiler import record_function

from common import data, harness, models

ON_CPU = ("on a CPU the syncs cost nothing (each op has finished when it returns) and .cpu(), "
          ".numpy() and from_numpy copy nothing, so the numpy step costs only its math: what "
          "costs here is the Python loop over every sample and the list made into a tensor, as "
          "on any device; on a GPU each of bad's 7 syncs a step also makes the host wait")
FOCAL_GAMMA = 2.0  # focal loss's gamma: a sample the model already gets right counts less
HARD_Z = 1.0  # a sample is hard when its loss is this many standard deviations above the mean
HARD_EXTRA = 0.5  # weight of the hard samples' mean loss, added to the focal loss


def weighted_loss(logits: torch.Tensor, targets: torch.Tensor,
                  class_weights: torch.Tensor) -> torch.Tensor:
    """Focal-weighted cross-entropy, plus HARD_EXTRA times the mean loss of the hard samples."""
    losses = F.cross_entropy(logits, targets, reduction="none")
    scores = losses.detach()  # what follows stays on the device: no list, no numpy, no copy
    focus = (1.0 - torch.exp(-scores)) ** FOCAL_GAMMA  # the loop's formula, on the whole batch
    weights = class_weights[targets] * focus  # one op for the batch, not Python per sample
    spread, mean = torch.std_mean(scores, correction=0)  # numpy's std (ddof 0) and mean, here
    hard = scores > mean + HARD_Z * spread  # a boolean tensor on the device, not a numpy array
    hard_losses = torch.where(hard, losses, 0.0)  # a fixed-shape mask: no nonzero, nothing waits
    hard_count = hard.sum().clamp(min=1)  # counted on the device: the host never reads it
    return (weights * losses).mean() + HARD_EXTRA * hard_losses.sum() / hard_count


def main() -> None:
    run = harness.setup(demo="host_roundtrip", variant="fixed")
    model, optimizer = models.residual_mlp(run)
    batches = itertools.cycle(data.staged_features(run))
    class_weights = torch.linspace(0.5, 1.5, run.sizes["num_classes"], device=run.device)

    def step() -> None:
        with record_function("data"):
            inputs, targets = next(batches)
        with record_function("forward"):
            loss = weighted_loss(model(inputs), targets, class_weights)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    if not run.is_cuda:
        run.notes.append(ON_CPU)
    run.config["sync_free"] = True  # the harness checks it: a CUDA step that never syncs
    harness.measure(run, step)


if __name__ == "__main__":
    main()
