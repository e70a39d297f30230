"""tokenizer_bound: both tokenizers give the demo's requests the same ids; bad tokenizes each
batch in its step, fixed on a thread one batch ahead; the summaries rate the pair by requests/s
and latency; the analyzer names the tokenize region on bad's trace, not on fixed's."""
from __future__ import annotations

import pytest

from common import analyze, bpe, compare, data, harness, trace
from tests.conftest import read_summary

# Requests of the CPU preset checked against both tokenizers: the Python one takes ~3 ms a text.
CPU_PRESET_TEXTS_CHECKED = 200


@pytest.mark.parametrize("argv", [["--smoke"], []], ids=["smoke", "cpu-preset"])
def test_the_demo_requests_get_the_same_ids_from_both_tokenizers(argv, tmp_path):
    run = harness.setup("tokenizer_bound", "bad", ["--device", "cpu", "--out", str(tmp_path),
                                                   *argv])
    vocabulary = data.bpe_vocabulary(run)
    texts = data.request_texts(run)
    assert len(texts) == run.batch_size * run.total_steps  # one text per request served
    texts = texts[:CPU_PRESET_TEXTS_CHECKED]
    python = [bpe.python_encode(text, vocabulary) for text in texts]
    assert python == bpe.rust_encode_batch(bpe.rust_tokenizer(vocabulary), texts)
    # Long texts: every request fills the model's max_len, so truncation is exercised
    assert min(len(ids) for ids in python) > run.sizes["max_len"]
    assert len(vocabulary.vocab) == run.sizes["vocab"]


def test_the_smoke_runs_write_serving_summaries(demos_smoke_out):
    for variant in ("bad", "fixed"):
        summary = read_summary(demos_smoke_out, "tokenizer_bound", variant)
        assert summary["unit"] == "request" and summary["config"]["inference_mode"] is True
        assert summary["rated_by"] == {"throughput": "requests_per_s", "latency": "latency_ms"}
        assert summary["requests_per_s"] == pytest.approx(summary["samples_per_s"], rel=1e-9)
        latency = summary["latency_ms"]
        assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
        # A request's latency spans its step (two with tokenize_ahead: its batch is tokenized
        # during the step before), and the steps lie inside the timed wall clock.
        assert latency["max"] <= summary["timed_wall_s"] * 1000.0 * (
            2 if summary["config"]["tokenize_ahead"] else 1)
        assert "per_token_ms" not in summary and summary["tokens_per_s"] is None


def tokenize_regions(out, variant: str) -> tuple[list[dict], set]:
    """The trace's tokenize spans, and the threads its ProfilerStep spans are on."""
    events = trace.load_trace(trace.newest_trace(out / "tokenizer_bound" / variant))["traceEvents"]
    steps = {e["tid"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    return [e for e in events if e.get("name") == "tokenize" and e.get("ph") == "X"], steps


def test_bad_tokenizes_in_the_step_and_fixed_on_a_thread_ahead(demos_smoke_out):
    regions, step_threads = tokenize_regions(demos_smoke_out, "bad")
    assert len(regions) == 3 and {e["tid"] for e in regions} == step_threads  # one a step
    # fixed's tokenizing runs on a thread of its own, recorded (profile_all_threads) while the
    # model runs: how many of its spans fall in the 3 recorded steps depends on their timing.
    regions, step_threads = tokenize_regions(demos_smoke_out, "fixed")
    assert regions and not {e["tid"] for e in regions} & step_threads
    assert read_summary(demos_smoke_out, "tokenizer_bound", "fixed")["config"]["tokenize_ahead"]


def test_the_analyzer_names_the_tokenize_region_of_bad_only(demos_smoke_out):
    bad, fixed = (analyze.analyze_trace(demos_smoke_out / "tokenizer_bound" / v)
                  for v in ("bad", "fixed"))
    found = {f["id"]: f for f in bad["findings"]}
    assert "host_region" in found and "'tokenize'" in found["host_region"]["evidence"]
    assert found["host_region"]["demo"] == "tokenizer_bound"
    # fixed's tokenizing runs on its thread while the main thread runs the model's operators:
    # what little of it the model does not cover (7.5 % of the window at smoke sizes, measured)
    # is far from the rule's 20 %.
    assert "host_region" not in [f["id"] for f in fixed["findings"]]
    left = (fixed["host_regions"] or {}).get("tokenize", {}).get("pct", 0.0)
    assert left < bad["host_regions"]["tokenize"]["pct"] / 3


def test_compare_rates_the_pair_by_requests_and_latency(demos_smoke_out):
    comparison = compare.compare(demos_smoke_out / "tokenizer_bound")
    bad, fixed = (read_summary(demos_smoke_out, "tokenizer_bound", v) for v in ("bad", "fixed"))
    assert comparison["speedup_of"] == "requests/s"
    assert comparison["speedup"] == pytest.approx(fixed["requests_per_s"] / bad["requests_per_s"])
    assert comparison["latency_ratio"] == pytest.approx(
        fixed["latency_ms"]["p50"] / bad["latency_ms"]["p50"])
    words = compare.headline(comparison)
    assert words.startswith(f"{comparison['speedup']:.2f}x more requests/s, ")
    latency = comparison["latency_ratio"]  # at smoke sizes tokenizing ahead may cost latency
    assert (f"{1 / latency:.2f}x lower p50 latency" if latency <= 1
            else f"{latency:.2f}x higher p50 latency (worse)") in words


def test_without_tokenizers_the_pair_stops_in_one_line():
    import subprocess
    import sys

    from tests.conftest import ROOT
    hide = ("import runpy, sys; sys.modules['tokenizers'] = None; "  # as if not installed
            "runpy.run_path('demos/tokenizer_bound/fixed.py', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", hide], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr == ("error: tokenizer_bound needs Hugging Face tokenizers: "
                             "pip install tokenizers\n")
