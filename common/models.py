"""Models and optimizers for the demos, already on the run's device."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from common import devices, harness, runs

SGD_LR = 0.1  # torchvision's ResNet reference recipe (batch 256)
SGD_MOMENTUM = 0.9
SGD_WEIGHT_DECAY = 1e-4


def resnet(run) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """resnet_model(run) and SGD."""
    model = resnet_model(run)
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD_LR, momentum=SGD_MOMENTUM,
                                weight_decay=SGD_WEIGHT_DECAY)
    return model, optimizer


def resnet_model(run) -> torch.nn.Module:
    """ResNet-18 (or the depth in run.sizes["resnet_depth"]: 50 for ResNet-50), randomly
    initialised (weights=None: nothing is downloaded), on the run's device."""
    import torchvision  # here, not at the top: ~1.5 s to import, which only ResNet demos need
    depth = run.sizes.get("resnet_depth", 18)
    build = getattr(torchvision.models, f"resnet{depth}")
    return build(weights=None, num_classes=run.sizes["num_classes"]).to(run.device)


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


def transformer_train_flop(sizes: dict[str, int], batch_size: int) -> float:
    """Model FLOPs of one training step of TokenTransformer (forward and backward, 3x the forward;
    recomputation not counted, as model-FLOPs utilisation defines it, PaLM appendix B): per token
    2 FLOPs per weight of every matmul (12 d^2 a block: attention's four projections, the 4x MLP;
    and the head) and 4 s d a block for attention's scores and weighted sum (no mask: all s
    keys)."""
    d, blocks, seq_len = sizes["d_model"], sizes["blocks"], sizes["seq_len"]
    per_token = 2 * (12 * d * d * blocks + d * sizes["vocab"]) + 4 * seq_len * d * blocks
    return 3.0 * per_token * batch_size * seq_len


def transformer(run, run_block: Callable = call_block
                ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """TokenTransformer sized by run.sizes (vocab, d_model, heads, blocks, seq_len), and AdamW.
    Records the step's model FLOPs (run.config["model_tflop_per_step"]), from which the summary
    gives achieved TFLOPS and, on a GPU of known peak, the share of it."""
    sizes = run.sizes
    run.config["model_tflop_per_step"] = transformer_train_flop(sizes, run.batch_size) / 1e12
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


class NormedBlock(torch.nn.Module):
    """x + gelu(linear(layer_norm(x))): four parameter tensors (two of the norm, two of the
    linear layer), little math each."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.linear(self.norm(x)))


def normed_mlp(run) -> torch.nn.Module:
    """`blocks` NormedBlocks of run.sizes["width"] and a classifier head: 4 x blocks + 2
    parameter tensors, as many as a mid-sized transformer has."""
    sizes = run.sizes
    blocks = [NormedBlock(sizes["width"]) for _ in range(sizes["blocks"])]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(sizes["width"], sizes["num_classes"])
                               ).to(run.device)


def adamw(run, model: torch.nn.Module, **implementation: bool) -> torch.optim.AdamW:
    """AdamW at ADAMW_LR over the model's parameters; `implementation`: torch's foreach or fused
    flag, written to run.config and said in the output."""
    params = list(model.parameters())
    chosen = ", ".join(f"{flag}={value}" for flag, value in implementation.items()) or "default"
    run.config.update(optimizer=f"AdamW({chosen})", parameter_tensors=len(params))
    runs.log(run, f"optimizer: AdamW({chosen}) over {len(params)} parameter tensors")
    return torch.optim.AdamW(params, lr=ADAMW_LR, **implementation)


def fused_or_foreach(run) -> dict[str, bool]:
    """{"fused": True} where this torch has a fused AdamW for the device (CUDA; CPU since torch
    2.4), else {"foreach": True}: the fastest AdamW there is."""
    probe = torch.zeros(1, device=run.device, requires_grad=True)
    try:
        torch.optim.AdamW([probe], fused=True)
    except (RuntimeError, ValueError):  # "fused=True requires ... supported devices"
        return {"foreach": True}
    return {"fused": True}


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √d) v, as papers write it: q, k, v [batch, heads, seq, head_dim]; the
    scores are a [batch, heads, seq, seq] tensor, and so is the softmax kept for backward."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return torch.softmax(scores, dim=-1) @ v


class AttentionBlock(torch.nn.Module):
    """x + out(attention(q, k, v)) with q, k, v from one projection of layer_norm(x), then, with
    `mlp_ratio`, x + a GELU MLP of mlp_ratio x d_model (pre-norm, as GPT-2); without it (0)
    self-attention alone, so the attention is most of the block's work. `attention(q, k, v)`
    takes and returns [batch, heads, seq, head_dim]."""

    def __init__(self, d_model: int, heads: int, attention: Callable, mlp_ratio: int = 0):
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.out = torch.nn.Linear(d_model, d_model)
        self.attention = attention
        self.mlp = None if not mlp_ratio else torch.nn.Sequential(
            torch.nn.LayerNorm(d_model), torch.nn.Linear(d_model, mlp_ratio * d_model),
            torch.nn.GELU(), torch.nn.Linear(mlp_ratio * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, seq, d_model]
        batch, seq, d_model = x.shape
        qkv = self.qkv(self.norm(x)).view(batch, seq, 3, self.heads, d_model // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [batch, heads, seq, head_dim]
        y = self.attention(q, k, v).transpose(1, 2).reshape(batch, seq, d_model)
        x = x + self.out(y)
        return x if self.mlp is None else x + self.mlp(x)


class AttentionLM(torch.nn.Module):
    """Token ids -> embedding + learned positions -> AttentionBlocks -> a linear head over the
    vocabulary at every position. `run_block(block, x)` runs each block: plain by default, a
    demo may wrap it (activation checkpointing)."""

    def __init__(self, vocab: int, d_model: int, heads: int, blocks: int, seq_len: int,
                 attention: Callable, mlp_ratio: int = 0, run_block: Callable = call_block):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.position = torch.nn.Parameter(torch.zeros(seq_len, d_model))
        self.blocks = torch.nn.ModuleList(AttentionBlock(d_model, heads, attention, mlp_ratio)
                                          for _ in range(blocks))
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab)
        self.run_block = run_block

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [batch, seq] -> [batch, seq, vocab]
        x = self.embed(tokens) + self.position
        for block in self.blocks:
            x = self.run_block(block, x)
        return self.head(self.norm(x))


def attention_lm(run, attention: Callable, *, dtype: torch.dtype = torch.float32,
                 run_block: Callable = call_block
                 ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """AttentionLM sized by run.sizes (vocab, d_model, heads, blocks, seq_len; mlp_ratio, 0 if
    absent) with this attention function, its weights in `dtype`, and AdamW (whose state then
    takes the same dtype). A dtype other than FP32 is recorded (run.config["dtype"])."""
    sizes = run.sizes
    model = AttentionLM(sizes["vocab"], sizes["d_model"], sizes["heads"], sizes["blocks"],
                        sizes["seq_len"], attention, sizes.get("mlp_ratio", 0),
                        run_block).to(run.device, dtype)
    if dtype != torch.float32:
        run.config["dtype"] = str(dtype).removeprefix("torch.")
    if dtype == torch.bfloat16 and not run.is_cuda and not devices.cpu_bf16_matrix_units():
        # said before the first step, which takes minutes here and prints nothing while it runs
        note = f"{devices.cpu_bf16_slow_why()}; the memory it measures is the same"
        runs.log(run, f"note: {note}")
        run.notes.append(note)
    return model, torch.optim.AdamW(model.parameters(), lr=ADAMW_LR)


class TextClassifier(torch.nn.Module):
    """Padded token ids -> embedding + learned positions -> pre-norm encoder blocks that ignore
    the padding (src_key_padding_mask) -> the mean of the real positions -> a linear head."""

    def __init__(self, vocab: int, d_model: int, heads: int, blocks: int, max_len: int,
                 num_classes: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model, padding_idx=harness.PAD_TOKEN_ID)
        self.position = torch.nn.Parameter(torch.zeros(max_len, d_model))
        self.encoder = torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model,
                                             dropout=0.0, activation="gelu", batch_first=True,
                                             norm_first=True),
            blocks, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d_model, num_classes)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        tokens, padding = batch  # [batch, longest], True where padding
        x = self.embed(tokens) + self.position[:tokens.size(1)]
        x = self.encoder(x, src_key_padding_mask=padding)
        real = (~padding).unsqueeze(-1).to(x.dtype)
        # mean over real tokens, summed in FP32: BF16 counts no integer above 256 exactly
        mean = (x * real).sum(dim=1, dtype=torch.float32) / real.sum(dim=1, dtype=torch.float32)
        return self.head(mean.to(x.dtype))


def text_classifier(run) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """TextClassifier sized by run.sizes (vocab, d_model, heads, blocks, max_len, num_classes),
    and AdamW."""
    sizes = run.sizes
    model = TextClassifier(sizes["vocab"], sizes["d_model"], sizes["heads"], sizes["blocks"],
                           sizes["max_len"], sizes["num_classes"]).to(run.device)
    return model, torch.optim.AdamW(model.parameters(), lr=ADAMW_LR)


# --- A GPT-style decoder for token-by-token generation at batch 1 (llm_decode). ----------------

class GrowingKVCache(torch.nn.Module):
    """The keys and values of the tokens so far, grown by torch.cat every token: each token's
    tensors have a new shape, so every step allocates and copies the whole cache again."""

    def __init__(self, heads: int, head_dim: int, max_len: int):
        super().__init__()
        self.keys = self.values = None

    def reset(self) -> None:
        self.keys = self.values = None

    def update(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Append this step's [1, heads, t, head_dim] keys and values; returns the cache's and no
        mask (every cached position is visible)."""
        if self.keys is not None:
            keys = torch.cat([self.keys, keys], dim=2)
            values = torch.cat([self.values, values], dim=2)
        self.keys, self.values = keys, values
        return keys, values, None


class StaticKVCache(torch.nn.Module):
    """Keys and values of max_len positions, allocated once: a token writes its slot in place
    (index_copy_ with a position tensor, no host value read) and attends through a mask, so every
    step has the same shapes and the same addresses, which a CUDA graph needs."""

    def __init__(self, heads: int, head_dim: int, max_len: int):
        super().__init__()
        self.register_buffer("keys", torch.zeros(1, heads, max_len, head_dim), persistent=False)
        self.register_buffer("values", torch.zeros(1, heads, max_len, head_dim), persistent=False)
        # Row p: the positions a token at position p may see (0..p).
        self.register_buffer("visible", torch.ones(max_len, max_len, dtype=torch.bool).tril(),
                             persistent=False)

    def reset(self) -> None:
        pass  # a new request overwrites its slots; the mask hides the rest

    def update(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # index_copy_ along the sequence: cache[:, :, pos] = k with a 0-d position tensor would
        # read the position on the host (aten._local_scalar_dense), a sync that breaks the graph.
        self.keys.index_copy_(2, positions, keys)
        self.values.index_copy_(2, positions, values)
        return self.keys, self.values, self.visible[positions]


class DecoderBlock(torch.nn.Module):
    """Pre-norm causal self-attention over the KV cache, then a 4x GELU MLP."""

    def __init__(self, d_model: int, heads: int, max_len: int, cache: type[torch.nn.Module]):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(d_model), torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.out = torch.nn.Linear(d_model, d_model)
        self.up, self.down = torch.nn.Linear(d_model, 4 * d_model), torch.nn.Linear(4 * d_model,
                                                                                    d_model)
        self.cache = cache(heads, d_model // heads, max_len)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        batch, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, t, 3, self.heads, d // self.heads
                                               ).permute(2, 0, 3, 1, 4)
        k, v, mask = self.cache.update(k, v, positions)
        # Without a mask (the growing cache) a prompt of t > 1 tokens needs the causal one.
        attended = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and t > 1)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class Decoder(torch.nn.Module):
    """Token ids -> embedding + learned positions -> DecoderBlocks, each with its KV cache of the
    given kind -> a linear head over the vocabulary."""

    def __init__(self, vocab: int, d_model: int, heads: int, blocks: int, max_len: int,
                 cache: type[torch.nn.Module]):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.position = torch.nn.Embedding(max_len, d_model)
        self.blocks = torch.nn.ModuleList(DecoderBlock(d_model, heads, max_len, cache)
                                          for _ in range(blocks))
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab, bias=False)

    def reset_cache(self) -> None:
        for block in self.blocks:
            block.cache.reset()

    def next_token(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens [1, t] at positions [t] (cached as they pass) -> the greedy next token [1, 1]:
        the argmax stays on the device, so nothing here waits for the GPU."""
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x, positions)
        return self.head(self.norm(x[:, -1:])).argmax(dim=-1)


def decoder(run, cache: type[torch.nn.Module]) -> Decoder:
    """Decoder sized by run.sizes (vocab, d_model, heads, blocks, prompt_tokens + new_tokens
    positions) with this KV cache, in eval mode; BF16 on a GPU (as LLMs are served), FP32 on a
    CPU (most CPUs have no BF16 units)."""
    sizes = run.sizes
    model = Decoder(sizes["vocab"], sizes["d_model"], sizes["heads"], sizes["blocks"],
                    sizes["prompt_tokens"] + sizes["new_tokens"], cache)
    dtype = torch.bfloat16 if run.is_cuda else torch.float32
    run.config["dtype"] = str(dtype).removeprefix("torch.")
    return model.to(run.device, dtype).eval()


def serving_classifier(run) -> TextClassifier:
    """TextClassifier sized by run.sizes (vocab, d_model, heads, blocks, max_len, num_classes) for
    inference: eval mode, BF16 on a GPU (as models are served), FP32 on a CPU."""
    sizes = run.sizes
    model = TextClassifier(sizes["vocab"], sizes["d_model"], sizes["heads"], sizes["blocks"],
                           sizes["max_len"], sizes["num_classes"])
    dtype = torch.bfloat16 if run.is_cuda else torch.float32
    run.config["dtype"] = str(dtype).removeprefix("torch.")
    return model.to(run.device, dtype).eval()
