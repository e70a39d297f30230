"""host_roundtrip: fixed.py computes the same loss and gradients as bad.py (the scripts' own
weighted_loss, imported as modules; their main() is not run), and at smoke sizes on a CPU both
scripts run, write their summary, and bad's trace holds the operators of its round trip to the
host while fixed's holds none. How long each takes is the README's matter: at smoke sizes it is
noise."""
from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import torch

from common import runs, trace
from tests.conftest import ROOT, assert_timing_is_consistent, read_summary

DEMO = "host_roundtrip"
# float32 throughout, summed in a different order (Python floats and numpy in bad, tensor ops in
# fixed): the losses agree to a few float32 roundings of their size, far inside this.
LOSS_RTOL = 1e-5
GRAD_ATOL = 1e-6  # gradients of the logits, each ~1 / batch
# Operators only bad's step runs (on a CPU, where none of them waits): nonzero for the boolean
# mask (forward, and backward's index_put with the same mask), lift_fresh for a tensor made from
# host data (torch.tensor of the Python list, torch.from_numpy), resolve_neg at each read of a
# tensor's values into Python (.tolist(), .numpy()). Plus the reads a GPU would wait for.
ROUND_TRIP_OPS = ("aten::nonzero", "aten::lift_fresh", "aten::resolve_neg")
VALUE_READS = ("aten::_local_scalar_dense", "aten::item", "aten::masked_select")


def script(variant: str) -> ModuleType:
    path = ROOT / "demos" / DEMO / f"{variant}.py"
    spec = importlib.util.spec_from_file_location(f"{DEMO}_{variant}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines functions and constants; main() runs only as a script
    return module


@pytest.fixture(scope="module")
def scripts() -> dict[str, ModuleType]:
    return {variant: script(variant) for variant in ("bad", "fixed")}


def loss_and_grad(module: ModuleType, logits: torch.Tensor, targets: torch.Tensor,
                  class_weights: torch.Tensor) -> tuple[float, torch.Tensor]:
    logits = logits.clone().requires_grad_()
    loss = module.weighted_loss(logits, targets, class_weights)
    loss.backward()
    return loss.item(), logits.grad


@pytest.mark.parametrize("batch, classes, scale", [(4096, 2, 1.0), (512, 10, 3.0), (1, 2, 1.0)])
def test_fixed_computes_the_loss_and_gradients_bad_computes(scripts, batch, classes, scale):
    generator = torch.Generator().manual_seed(batch + classes)
    logits = scale * torch.randn(batch, classes, generator=generator)
    targets = torch.randint(0, classes, (batch,), generator=generator)
    class_weights = torch.linspace(0.5, 1.5, classes)
    bad_loss, bad_grad = loss_and_grad(scripts["bad"], logits, targets, class_weights)
    fixed_loss, fixed_grad = loss_and_grad(scripts["fixed"], logits, targets, class_weights)
    assert fixed_loss == pytest.approx(bad_loss, rel=LOSS_RTOL)
    # The focal weights are constants in both (bad's are Python floats, fixed detaches them), and
    # the hard samples' term reaches the same samples: the gradients agree too.
    torch.testing.assert_close(fixed_grad, bad_grad, rtol=LOSS_RTOL, atol=GRAD_ATOL)
    if batch > 1:  # the hard term is not empty, so the comparison covers it
        losses = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
        assert (losses > losses.mean() + scripts["bad"].HARD_Z * losses.std(correction=0)).any()


def op_counts(out: Path, variant: str) -> Counter:
    events = trace.load_trace(trace.trace_files(out / DEMO / variant)[0])["traceEvents"]
    return Counter(e["name"] for e in events if e.get("cat") == "cpu_op")


@pytest.fixture(scope="module")
def smoke_out(demos_smoke) -> Path:
    """Both scripts with --smoke --device cpu: the smoke run_demos.sh (conftest) ran them."""
    assert {f"{DEMO}/bad", f"{DEMO}/fixed"} <= demos_smoke.ran
    return demos_smoke.out


def test_smoke_runs_write_a_summary(smoke_out):
    for variant in ("bad", "fixed"):
        summary = read_summary(smoke_out, DEMO, variant)
        assert summary["preset"] == "smoke" and summary["device"] == "cpu"
        assert_timing_is_consistent(summary)
        assert any("Python loop" in note for note in summary["notes"])
    assert read_summary(smoke_out, DEMO, "fixed")["config"]["sync_free"] is True
    assert "sync_free" not in read_summary(smoke_out, DEMO, "bad")["config"]


def test_bad_trace_holds_the_round_trip_and_fixed_none(smoke_out):
    bad, fixed = op_counts(smoke_out, "bad"), op_counts(smoke_out, "fixed")
    steps = runs.PROFILE_ACTIVE_STEPS
    assert bad["aten::nonzero"] == 2 * steps  # the selection, and its backward
    assert bad["aten::lift_fresh"] == 2 * steps  # torch.tensor(list), torch.from_numpy
    assert bad["aten::resolve_neg"] == 3 * steps  # two .tolist(), one .numpy()
    for name in ROUND_TRIP_OPS + VALUE_READS:
        assert fixed[name] == 0, name
    assert fixed["aten::where"] >= steps  # the fixed-shape mask in its place
