"""The recompiles pair: its smoke runs (the demos_smoke fixture) and what the harness and the
analyzer say of them; the two models compute the same function; --compile-log writes the
structured log and tlparse's report, and a rerun leaves nothing of the last one."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from common import analyze, devices, presets
from tests.conftest import ROOT, read_summary, run_demo

SIZES = presets.PRESETS["recompiles"]["smoke"].sizes
# The masked forward computes the same sums as the sliced one (x + 0 where a block is cut off is
# x itself); FP32 rounding of the same operations in the same order: equal, with room for BLAS.
SAME_OUTPUT_ATOL = 1e-6


def load(variant: str):
    spec = importlib.util.spec_from_file_location(
        f"recompiles_{variant}", ROOT / "demos" / "recompiles" / f"{variant}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pair(demos_smoke):
    found = {}
    for variant in ("bad", "fixed"):
        assert f"recompiles/{variant}" in demos_smoke.ran
        found[variant] = (read_summary(demos_smoke.out, "recompiles", variant),
                          analyze.analyze_trace(demos_smoke.out / "recompiles" / variant))
    return found


def fired(result: dict) -> set[str]:
    return {found["id"] for found in result["findings"]}


def test_bad_recompiles_and_breaks_its_graph_and_the_analyzer_names_both(pair):
    summary, result = pair["bad"]
    dynamo = summary["extra"]["dynamo"]
    assert dynamo["graph_breaks"] >= 1
    assert any(".item()" in reason for reason in dynamo["graph_break_reasons"])
    # A graph for the part before the break, then one per depth the resumed frame met.
    depths = SIZES["blocks"] - SIZES["min_depth"] + 1
    assert 1 + 2 <= dynamo["graphs"] <= 1 + depths + 1
    assert dynamo["recompiles"] >= 2  # the resumed frame's compile ids beyond its first
    assert fired(result) >= {"recompiles", "graph_breaks"}
    compiled = result["compiled"]
    assert compiled["graph_breaks_per_step"] == 1.0 and compiled["broken_frames"] == ["0"]
    assert "aten::item" in [op["name"] for op in compiled["eager_operators"]]


def test_fixed_compiles_once_with_no_break_and_no_compile_verdict(pair):
    summary, result = pair["fixed"]
    dynamo = summary["extra"]["dynamo"]
    assert dynamo["graphs"] == 1 and dynamo["graph_breaks"] == 0 and dynamo["recompiles"] == 0
    assert not dynamo["recompile_limit_hit"]
    assert summary["extra"]["dynamo_frames_compiled"]["timed_and_profiled"] == 0
    compiled = result["compiled"]
    assert compiled["regions_per_step"] == 1.0 and compiled["graph_breaks_per_step"] == 0
    assert compiled["frames"] == {"0": {"compile_ids": [0], "calls_per_step": 1.0,
                                        "breaks_per_step": 0.0}}
    assert not fired(result) & {"recompiles", "graph_breaks"}


def test_both_variants_train_on_the_same_depths(pair):
    assert pair["bad"][0]["config"]["depths"] == pair["fixed"][0]["config"]["depths"] == (
        f"{SIZES['min_depth']}..{SIZES['blocks']}")


@pytest.mark.parametrize("scale", [1.0, 100.0])  # 100: the stem's outputs pass the clip limit
def test_the_masked_model_computes_what_the_sliced_one_does_at_every_depth(scale):
    bad, fixed = load("bad"), load("fixed")
    width, blocks, classes = SIZES["width"], SIZES["blocks"], SIZES["num_classes"]
    torch.manual_seed(0)
    sliced = bad.EarlyExitMLP(width, blocks, classes)
    masked = fixed.EarlyExitMLP(width, blocks, classes)
    masked.load_state_dict(sliced.state_dict())
    x = scale * torch.randn(8, width)
    if scale > 1:
        assert sliced.stem(x).abs().amax() > bad.ACTIVATION_LIMIT  # the clip really runs
    for depth in range(blocks + 1):
        keep = torch.arange(blocks) < depth
        assert torch.allclose(sliced(x, depth), masked(x, keep), rtol=0, atol=SAME_OUTPUT_ATOL)
    # ...and a cut-off block gets no update under plain SGD: its gradient is zero, not missing.
    masked(x, torch.arange(blocks) < 1).sum().backward()
    assert masked.blocks[-1].linear.weight.grad.abs().max() == 0


def test_compile_log_writes_the_log_and_tlparse_report_and_a_rerun_leaves_nothing_stale(
        tmp_path, after_the_smoke_run):
    # The smoke run's bad.py had these sizes and seed: its graphs in Inductor's cache, this run
    # takes 19 CPU-s on the 2-core EPYC (56 compiling them). Dynamo still traces and logs.
    logs = tmp_path / "compile_log"
    stale = logs / "dedicated_log_torch_trace_old.log"
    logs.mkdir()
    stale.write_text("an earlier run's log\n")
    (logs / devices.TLPARSE_DIR).mkdir()
    (logs / devices.TLPARSE_DIR / "stale.html").write_text("old")
    done = run_demo("recompiles", "bad", "--smoke", "--device", "cpu", "--out",
                    str(tmp_path / "out"), "--compile-log", str(logs))
    assert done.returncode == 0, done.stderr[-3000:]
    assert not stale.exists() and not (logs / devices.TLPARSE_DIR / "stale.html").exists()
    written = list(logs.glob(devices.TORCH_TRACE_LOG_GLOB))
    assert len(written) == 1
    text = written[0].read_text()
    assert text.count('"dynamo_start"') >= 3  # a start line per frame compile (bad: several)
    summary = read_summary(tmp_path / "out", "recompiles", "bad")
    assert summary["extra"]["compile_log"]["log"] == str(written[0])
    assert "compile log: " in done.stdout
    if devices.tlparse_program() is None:  # the test extra installs it; PYTHON=... may lack it
        assert "pip install tlparse" in summary["extra"]["compile_log"]["note"]
        return
    index = logs / devices.TLPARSE_DIR / "index.html"
    assert summary["extra"]["compile_log"]["report"] == str(index)
    assert "recompile_reasons" in index.read_text()  # bad's recompiles, each with its guard


def test_compile_log_from_a_programmatic_call_is_a_one_line_error(tmp_path):
    from common import harness
    with pytest.raises(SystemExit) as stopped:
        harness.setup("recompiles", "bad", ["--device", "cpu", "--smoke", "--compile-log",
                                            str(tmp_path)])
    assert stopped.value.code == 2
