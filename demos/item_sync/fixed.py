"""Values kept on the device (fixed): the NaN checks fold into one flag on the device, loss and
accuracy are summed there, and the loop reads sums and flag once every LOG_EVERY_STEPS steps, so
the CPU keeps queuing work while the GPU computes; a NaN is still caught. See README.md here."""
import itertools

import torch
from torch.profiler import record_function

from common import data, harness, models

ON_CPU = ("on a CPU each op has finished when it returns (there is no asynchronous device), so a "
          "read waits for nothing: expect about 1.0x here; the GPU run is where syncs cost time")
LOG_EVERY_STEPS = 10  # one wait per 10 steps instead of ~2 per block per step


def main() -> None:
    run = harness.setup(demo="item_sync", variant="fixed")
    model, optimizer = models.residual_mlp(run)
    batches = itertools.cycle(data.staged_features(run))
    steps_done = itertools.count(1)
    all_finite = torch.ones((), dtype=torch.bool, device=run.device)  # the checks' verdict
    sums = torch.zeros(2, device=run.device)  # running loss and accuracy sums, on the device

    def check_finite(values: torch.Tensor) -> None:
        all_finite.logical_and_(torch.isfinite(values).all())  # a tensor op: nothing waits

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
            accuracy = (logits.argmax(dim=1) == targets).float().mean()  # stays on the device
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        with record_function("log"):
            step_number = next(steps_done)
            sums.add_(torch.stack([loss.detach(), accuracy]))
            if step_number % LOG_EVERY_STEPS == 0:  # the one wait: sums and flag in one copy
                loss_sum, accuracy_sum, finite = torch.cat([sums, all_finite[None]]).tolist()
                if not finite:
                    raise FloatingPointError("non-finite values in the model")
                run.extra["logged"] = dict(step=step_number, loss=loss_sum / LOG_EVERY_STEPS,
                                           accuracy=accuracy_sum / LOG_EVERY_STEPS)
                sums.zero_()

    if not run.is_cuda:
        run.notes.append(ON_CPU)
    run.config["read_every_steps"] = LOG_EVERY_STEPS
    harness.measure(run, step)


if __name__ == "__main__":
    main()
