"""tokenizer_bound: both tokenizers give the demo's requests the same ids; each step tokenizes its
batch in one `tokenize` region and reads its answers back; the summaries rate the pair by
requests/s and latency; the analyzer names the region on bad's trace."""
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
        # A request's latency lies inside its step, and the steps inside the timed wall clock.
        assert latency["max"] <= summary["timed_wall_s"] * 1000.0
        assert "per_token_ms" not in summary and summary["tokens_per_s"] is None


def region_spans_per_step(out, variant: str) -> float:
    events = trace.load_trace(trace.newest_trace(out / "tokenizer_bound" / variant))["traceEvents"]
    steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    return sum(1 for e in events if e.get("name") == "tokenize" and e.get("ph") == "X") / steps


def test_each_step_tokenizes_its_batch_in_one_region(demos_smoke_out):
    assert region_spans_per_step(demos_smoke_out, "bad") == 1
    assert region_spans_per_step(demos_smoke_out, "fixed") == 1


def test_the_analyzer_names_the_tokenize_region_of_bad(demos_smoke_out):
    bad, fixed = (analyze.analyze_trace(demos_smoke_out / "tokenizer_bound" / v)
                  for v in ("bad", "fixed"))
    found = {f["id"]: f for f in bad["findings"]}
    assert "host_region" in found and "'tokenize'" in found["host_region"]["evidence"]
    assert found["host_region"]["demo"] == "tokenizer_bound"
    # fixed tokenizes the same texts in a fraction of the time. Whether its smaller share stays
    # under the rule's 20 % at smoke sizes depends on how fast Rust's threads wake for 4 texts
    # (0.5-0.7 ms measured), so the walkthrough quotes the CPU preset's verdicts instead.
    assert fixed["host_regions"]["tokenize"]["ms_per_step"] < (
        bad["host_regions"]["tokenize"]["ms_per_step"] / 3)


def test_compare_rates_the_pair_by_requests_and_latency(demos_smoke_out):
    comparison = compare.compare(demos_smoke_out / "tokenizer_bound")
    bad, fixed = (read_summary(demos_smoke_out, "tokenizer_bound", v) for v in ("bad", "fixed"))
    assert comparison["speedup_of"] == "requests/s"
    assert comparison["speedup"] == pytest.approx(fixed["requests_per_s"] / bad["requests_per_s"])
    assert comparison["latency_ratio"] == pytest.approx(
        fixed["latency_ms"]["p50"] / bad["latency_ms"]["p50"])
    words = compare.headline(comparison)
    assert words.startswith(f"{comparison['speedup']:.2f}x more requests/s, ")
    assert f"{1 / comparison['latency_ratio']:.2f}x lower p50 latency" in words
