"""The memory ladder, rung 0 (the baseline): a GPT-style language model (attention written out,
a GELU MLP) trained as a first script trains it: FP32 weights and AdamW state, every block's
activations kept for backward, the whole batch at once, and each attention's seq x seq softmax
kept too. It needs more memory than the budget (--memory-budget-gb, the preset's by default).
Each later rung makes one fix that shrinks it. See README.md in this folder."""
import torch

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="memory_ladder", variant="rung0_baseline")
    model, optimizer = models.attention_lm(
        run, attention=models.naive_attention,  # the seq x seq scores, written out and kept
        dtype=torch.float32,  # 4 bytes a number: weights, gradients, AdamW state, activations
        run_block=models.call_block)  # every block's activations kept until backward
    harness.train_on_device(run, model, optimizer, data.staged_tokens(run),
                            loss_fn=models.token_cross_entropy,
                            micro_batches=1)  # the whole batch at once


if __name__ == "__main__":
    main()
