"""The model FLOPs a transformer run records, and the share of a GPU's BF16 peak the summary
reports from them (mixed_precision's target: >= 40 % of the dense BF16 peak)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from common import devices, models

SIZES = dict(vocab=128, d_model=64, heads=2, blocks=2, seq_len=32)
BATCH = 2


def test_transformer_flops_match_pytorchs_flop_counter():
    """FlopCounterMode counts every matmul of a real forward and backward. Attention runs on
    SDPA's math backend here, written-out batched matmuls the counter sees (it has no formula
    for the CPU's fused kernel), so the two counts must agree exactly, attention included."""
    run = SimpleNamespace(sizes=SIZES, device=torch.device("cpu"), batch_size=BATCH, config={})
    model, _ = models.transformer(run)
    tokens = torch.randint(0, SIZES["vocab"], (BATCH, SIZES["seq_len"]))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        models.token_cross_entropy(model(tokens), tokens).backward()
    assert models.transformer_train_flop(SIZES, BATCH) == counter.get_total_flops()
    # What the run records (and the summary's achieved TFLOPS divides) is that same count.
    assert run.config["model_tflop_per_step"] == pytest.approx(counter.get_total_flops() / 1e12,
                                                               rel=1e-12)


@pytest.mark.parametrize("device_name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.4),
    ("NVIDIA H200 NVL", 835.0), ("NVIDIA GH200 480GB", 989.4), ("NVIDIA GB200", 2500.0),
    ("NVIDIA L40", 181.0), ("NVIDIA L4", 121.0), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("Tesla V100-SXM2-16GB", None)])
def test_share_of_the_bf16_peak(device_name, peak):
    run = SimpleNamespace(config={"model_tflop_per_step": 86.0}, device_name=device_name,
                          is_cuda=True)
    result = devices.flops_achieved(run, step_ms_p50=200.0)  # 86 TFLOP in 0.2 s
    assert result["achieved_tflops"] == pytest.approx(430.0)
    assert result["bf16_peak_tflops"] == peak
    assert result["bf16_peak_pct"] == (None if peak is None else pytest.approx(43000.0 / peak))


def test_no_flops_recorded_no_figures():
    run = SimpleNamespace(config={}, device_name="NVIDIA H100 80GB HBM3", is_cuda=True)
    assert devices.flops_achieved(run, step_ms_p50=10.0) == {}
