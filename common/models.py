"""Models and optimizers for the demos, already on the run's device."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torchvision

SGD_LR = 0.1  # torchvision's ResNet reference recipe (batch 256)
SGD_MOMENTUM = 0.9
SGD_WEIGHT_DECAY = 1e-4


def resnet(run) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """ResNet-18, randomly initialised (weights=None: nothing is downloaded), and SGD."""
    model = torchvision.models.resnet18(weights=None, num_classes=run.sizes["num_classes"])
    model = model.to(run.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD_LR, momentum=SGD_MOMENTUM,
                                weight_decay=SGD_WEIGHT_DECAY)
    return model, optimizer


ADAMW_LR = 3e-4  # the usual AdamW rate for transformers of this size (nanoGPT, GPT-2 recipes)
MLP_SGD_LR = 0.01  # low enough that a deep residual MLP on random labels stays finite
RMS_NORM_EPS = 1e-6  # LLaMA's RMSNorm epsilon


def call_block(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block(x)


class TokenTransformer(torch.nn.Module):
    """Token ids -> embedding + learned positions -> pre-norm encoder blocks (self-attention through
    scaled_dot_product_attention, a 4x GELU MLP) -> a linear head over the vocabulary.
    `run_block(block, x)` runs each block: plain by default, a demo may wrap it."""

    def __init__(self, vocab: int, d_model: int, heads: int, blocks: int, seq_len: int,
                 run_block: Callable = call_block):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.position = torch.nn.Parameter(torch.zeros(seq_len, d_model))
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model,
                                             dropout=0.0, activation="gelu", batch_first=True,
                                             norm_first=True)
            for _ in range(blocks))
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab)
        self.run_block = run_block

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [batch, seq] -> [batch, seq, vocab]
        x = self.embed(tokens) + self.position
        for block in self.blocks:
            x = self.run_block(block, x)
        return self.head(self.norm(x))


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every position: logits [batch, seq, vocab], targets [batch, seq]."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def transformer(run, run_block: Callable = call_block
                ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """TokenTransformer sized by run.sizes (vocab, d_model, heads, blocks, seq_len), and AdamW."""
    sizes = run.sizes
    model = TokenTransformer(sizes["vocab"], sizes["d_model"], sizes["heads"], sizes["blocks"],
                             sizes["seq_len"], run_block=run_block).to(run.device)
    return model, torch.optim.AdamW(model.parameters(), lr=ADAMW_LR)


def rms_norm(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # Written out of primitive ops, as many research models write their norms: six small kernels
    # in eager mode (pow, mean, add, rsqrt, mul, mul), one fused kernel under torch.compile.
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + RMS_NORM_EPS) * scale


class ResidualBlock(torch.nn.Module):
    """x + gelu(linear(rms_norm(x))): a pre-norm residual block of small ops."""

    def __init__(self, width: int):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(width))
        self.linear = torch.nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.linear(rms_norm(x, self.scale)))


class ResidualMLP(torch.nn.Module):
    """`blocks` ResidualBlocks of one width, then a linear classifier head."""

    def __init__(self, width: int, blocks: int, num_classes: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList(ResidualBlock(width) for _ in range(blocks))
        self.head = torch.nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, width] -> [batch, num_classes]
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def residual_mlp(run) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """ResidualMLP sized by run.sizes (width, blocks, num_classes), and SGD with momentum."""
    sizes = run.sizes
    model = ResidualMLP(sizes["width"], sizes["blocks"], sizes["num_classes"]).to(run.device)
    # fused: the whole update is one kernel, so the launches a demo counts are the model's own
    optimizer = torch.optim.SGD(model.parameters(), lr=MLP_SGD_LR, momentum=SGD_MOMENTUM,
                                fused=True)
    return model, optimizer
