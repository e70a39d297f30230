"""Values sent to the host and back in the loss (bad): a focal-loss weight computed in a Python
loop over .tolist(), a tensor built from that list, the losses taken to numpy to find the hard
samples and the answer brought back, and a boolean-mask selection of them. On a GPU that is
seven host-device syncs a step (the mask's nonzero runs again in backward); on any device the
loop and the list cost host time for every sample. See README.md in this folder."""
import itertools
import math

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


def per_sample_weights(losses: torch.Tensor, class_weights: torch.Tensor) -> list[float]:
    """Its class's weight times (1 - p) ** FOCAL_GAMMA, p = exp(-loss) the true class's
    probability."""
    weights = []
    for loss, class_weight in zip(losses.tolist(), class_weights.tolist()):  # 2 syncs
        weights.append(class_weight * (1.0 - math.exp(-loss)) ** FOCAL_GAMMA)  # per sample
    return weights


def weighted_loss(logits: torch.Tensor, targets: torch.Tensor,
                  class_weights: torch.Tensor) -> torch.Tensor:
    """Focal-weighted cross-entropy, plus HARD_EXTRA times the mean loss of the hard samples."""
    losses = F.cross_entropy(logits, targets, reduction="none")
    weights = per_sample_weights(losses.detach(), class_weights[targets])
    weights = torch.tensor(weights, device=logits.device)  # a list copied to the device: a sync
    scores = losses.detach().cpu().numpy()  # to the host for numpy: a sync
    hard = scores > scores.mean() + HARD_Z * scores.std()
    hard = torch.from_numpy(hard).to(logits.device)  # and back to the device: a sync
    hard_losses = losses[hard]  # a boolean mask calls nonzero: the host waits for the count
    hard_count = max(len(hard_losses), 1)
    return (weights * losses).mean() + HARD_EXTRA * hard_losses.sum() / hard_count


def main() -> None:
    run = harness.setup(demo="host_roundtrip", variant="bad")
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
    harness.measure(run, step)


if __name__ == "__main__":
    main()
