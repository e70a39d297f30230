"""The memory ladder, rung 1: BF16 weights. The model is cast to BF16, so its weights, gradients,
AdamW state and every activation take 2 bytes a number in place of 4: about half the memory.
(Autocast, the speed fix, keeps FP32 weights and state and adds BF16 copies.) See README.md in
this folder."""
import torch

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="memory_ladder", variant="rung1_bf16")
    model, optimizer = models.attention_lm(
        run, attention=models.naive_attention,  # the seq x seq scores, written out and kept
        dtype=torch.bfloat16,  # 2 bytes a number: weights, gradients, AdamW state, activations
        run_block=models.call_block)  # every block's activations kept until backward
    harness.train_on_device(run, model, optimizer, data.staged_tokens(run),
                            loss_fn=models.token_cross_entropy,
                            micro_batches=1)  # the whole batch at once


if __name__ == "__main__":
    main()
