"""Host-device syncs in the loop (bad): every step, a NaN check after each block and on its
gradient, an accuracy metric copied with .cpu() and the loss logged with .item(). Each read makes
the CPU wait for the GPU to catch up: about two waits per block per step. See README.md here."""
import itertools

import torch
from torch.profiler import record_function

from common import data, harness, models

ON_CPU = ("on a CPU each op has finished when it returns (there is no asynchronous device), so a "
          "read waits for nothing: expect about 1.0x here; the GPU run is where syncs cost time")


def main() -> None:
    run = harness.setup(demo="item_sync", variant="bad")
    model, optimizer = models.residual_mlp(run)
    batches = itertools.cycle(data.staged_features(run))
    steps_done = itertools.count(1)

    def check_finite(values: torch.Tensor) -> None:
        if not torch.isfinite(values).all():  # a Python `if` on a device value: the CPU waits
            raise FloatingPointError("non-finite values in the model")

    def step() -> None:
        with record_function("data"):
            inputs, targets = next(batches)
        with record_function("forward"):
            h = inputs
            for block in model.blocks:
                h = block(h)
                check_finite(h)
                h.register_hook(check_finite)  # and again on its gradient, during backward
            logits = model.head(h)
            loss = torch.nn.functional.cross_entropy(logits, targets)
            accuracy = (logits.argmax(dim=1) == targets).float().mean().cpu()  # waits for forward
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        with record_function("log"):
            step_number = next(steps_done)
            run.extra["logged"] = dict(step=step_number, loss=loss.item(),  # waits for the step
                                       accuracy=accuracy.item())

    if not run.is_cuda:
        run.notes.append(ON_CPU)
    run.config["read_every_steps"] = 1
    harness.measure(run, step)


if __name__ == "__main__":
    main()
