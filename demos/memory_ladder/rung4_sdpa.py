"""The memory ladder, rung 4: scaled_dot_product_attention. PyTorch's fused attention computes
softmax(q kᵀ / √d) v a tile at a time and keeps no seq x seq matrix, for forward or backward: the
largest tensor left in a block (the block being recomputed) is gone. See README.md in this
folder."""
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="memory_ladder", variant="rung4_sdpa")
    model, optimizer = models.attention_lm(
        run, attention=F.scaled_dot_product_attention,  # tiles: no seq x seq matrix is kept
        dtype=torch.bfloat16,  # 2 bytes a number: weights, gradients, AdamW state, activations
        # a block's input kept, its inside recomputed in backward when its activations are needed
        run_block=lambda block, x: checkpoint(block, x, use_reentrant=False))
    harness.train_on_device(run, model, optimizer, data.staged_tokens(run),
                            loss_fn=models.token_cross_entropy,
                            micro_batches=4)  # a quarter at a time: the same batch, 1/4 alive


if __name__ == "__main__":
    main()
