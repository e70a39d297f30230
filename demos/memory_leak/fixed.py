"""Memory that stays flat (fixed): the same loop logs the same numbers, but keeps only what it
logs. The loss is summed detached (a number, no graph), and the accuracy is counted as the steps
go (correct tokens, an integer) instead of from a list of every step's logits. Each step's
tensors are freed when the next step replaces them. See README.md in this folder."""
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
    run = harness.setup(demo="memory_leak", variant="fixed")
    model, optimizer = models.transformer(run)
    batches = itertools.cycle(data.staged_tokens(run))
    running_loss = torch.zeros((), device=run.device)
    correct = torch.zeros((), dtype=torch.int64, device=run.device)
    steps_done = itertools.count(1)

    def step() -> None:
        nonlocal running_loss, correct
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
            running_loss += loss.detach()  # a number without a graph: nothing else stays alive
            correct += (logits.argmax(-1) == targets).sum()  # a count: the logits can be freed
            steps = next(steps_done)
            if steps == run.total_steps:  # the epoch's end
                log_epoch(run, running_loss, correct, steps)

    run.notes.append(NOT_TIME)
    harness.measure(run, step)


if __name__ == "__main__":
    main()
