"""Memory that grows every step (bad): the loop keeps what it only meant to log. The loss is
summed as a tensor (`running_loss += loss`), which chains each step's autograd graph to the next,
and each step's logits go into a list for an accuracy at the epoch's end, so every step's
[batch, seq, vocab] output stays allocated. Allocated memory climbs a step at a time until the
device is full. See README.md in this folder."""
import itertools

import torch
from torch.profiler import record_function

from common import data, harness, models

NOT_TIME = ("timing is not this pair's point: both variants do the same work a step; read the "
            "memory allocated at each step's end (python -m common.analyze on the run)")

def log_epoch(run, running_loss: torch.Tensor, correct: torch.Tensor, steps: int) -> None:
    """What a real loop prints at an epoch's end: the mean loss and the token accuracy."""
    tokens = steps * run.batch_size * run.sizes["seq_len"]
    run.extra["logged"] = dict(steps=steps, mean_loss=(running_loss / steps).item(),
                               accuracy=correct.item() / tokens)


def main() -> None:
    run = harness.setup(demo="memory_leak", variant="bad")
    model, optimizer = models.transformer(run)
    batches = itertools.cycle(data.staged_tokens(run))
    running_loss = torch.zeros((), device=run.device)
    outputs = []
    steps_done = itertools.count(1)

    def step() -> None:
        nonlocal running_loss
        with record_function("data"):
            inputs, targets = next(batches)
        with record_function("forward"):
            logits = model(inputs)
            loss = models.token_cross_entropy(logits, targets)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        with record_function("log"):
            running_loss += loss  # a tensor with a graph: every step's graph stays chained
            outputs.append((logits, targets))  # every step's logits stay allocated
            steps = next(steps_done)
            if steps == run.total_steps:  # the epoch's end
                correct = sum((logits.argmax(-1) == targets).sum() for logits, targets in outputs)
                log_epoch(run, running_loss, correct, steps)

    run.notes.append(NOT_TIME)
    harness.measure(run, step)


if __name__ == "__main__":
    main()
