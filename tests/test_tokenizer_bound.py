"""tokenizer_bound: both tokenizers give the demo's requests the same ids; bad tokenizes each
batch in its step, fixed on a thread one batch ahead; the summaries rate the pair by requests/s
and latency; the analyzer names the tokenize region on bad's trace, not on fixed's."""
from __future__ import annotations

import re

import pytest

from common import analyze, bpe, compare, data, harness, trace, verdicts
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


# Kineto writes times in µs with ns digits, read back as floats (an ulp of ~0.001 µs at these
# magnitudes): spans that follow one another in time may compare out of order by that much.
# 1 µs is far above that rounding and far below any span here (a tokenize span: 100s of µs).
TRACE_ROUNDING_US = 1.0
# The same rounding relative to the ms-long spans and windows that shares are taken of.
TRACE_REL = 1e-6


def spans_of(out, variant: str) -> tuple[list[dict], list[dict]]:
    """The trace's tokenize spans and its ProfilerStep spans (the recorded steps), by start."""
    events = trace.load_trace(trace.newest_trace(out / "tokenizer_bound" / variant))["traceEvents"]
    complete = sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"])
    return ([e for e in complete if e.get("name") == "tokenize"],
            [e for e in complete if str(e.get("name", "")).startswith("ProfilerStep#")])


def inside(span: dict, low: float, high: float) -> bool:
    return (span["ts"] >= low - TRACE_ROUNDING_US
            and span["ts"] + span["dur"] <= high + TRACE_ROUNDING_US)


def test_bad_tokenizes_in_the_step_and_fixed_on_a_thread_ahead(demos_smoke_out):
    regions, steps = spans_of(demos_smoke_out, "bad")
    assert len(steps) == 3  # the profiler's schedule records three steps
    # bad: each step tokenizes its own batch first, on the step's thread: one span in each.
    assert len(regions) == len(steps)
    for region, step in zip(regions, steps):
        assert region["tid"] == step["tid"]
        assert inside(region, step["ts"], step["ts"] + step["dur"])
    assert not read_summary(demos_smoke_out, "tokenizer_bound", "bad")["config"]["tokenize_ahead"]

    # fixed (harness.serve_texts, tokenize_ahead): one worker thread tokenizes every batch, so
    # none of it runs on the step thread. Recorded step k submits the next batch to it, and
    # step k + 1 waits for that batch's ids (future.result()) before its model runs: that batch
    # is tokenized whole after step k began and before step k + 1 ended, whatever the timing.
    # (How many more of its spans fall in the recording, the batch of the step before the
    # first, or of the last step, does depend on the timing.)
    regions, steps = spans_of(demos_smoke_out, "fixed")
    assert read_summary(demos_smoke_out, "tokenizer_bound", "fixed")["config"]["tokenize_ahead"]
    assert len(steps) == 3 and len({step["tid"] for step in steps}) == 1
    step_thread = steps[0]["tid"]
    assert len({region["tid"] for region in regions}) == 1  # ThreadPoolExecutor(max_workers=1)
    assert all(region["tid"] != step_thread for region in regions)
    for step, following in zip(steps, steps[1:]):
        assert any(inside(region, step["ts"], following["ts"] + following["dur"])
                   for region in regions), (step["name"], regions)


def test_the_analyzer_names_the_tokenize_region_of_bad_only(demos_smoke_out):
    """bad's tokenize is on the step thread and calls no PyTorch operator (a Python loop over
    the texts), so all of it is host work, and the analyzer counts every span of it. Whether a
    region holds a fifth of the window is a matter of speeds (the Python tokenizer's against
    the model's; on fixed, the Rust tokenizer's, 4 % of the window at smoke sizes, measured):
    for fixed the test checks what follows from the trace, not the speeds: its share counts at
    most the time its tokenize spans are open in the window, and the verdict follows the share
    by the rule (HOST_REGION_MIN_PCT)."""
    bad, fixed = (analyze.analyze(demos_smoke_out / "tokenizer_bound" / v)
                  for v in ("bad", "fixed"))
    regions, _ = spans_of(demos_smoke_out, "bad")
    held = bad.result["host_regions"]["tokenize"]
    assert held["outside_ops_pct"] == pytest.approx(100.0)  # no operator inside it
    # Every span lies in its step (the test above), so the share is their time over the window.
    window_us = bad.window[1] - bad.window[0]
    assert held["pct"] == pytest.approx(
        100.0 * sum(region["dur"] for region in regions) / window_us, rel=TRACE_REL)
    found = {f["id"]: f for f in bad.result["findings"]}
    assert "host_region" in found and "'tokenize'" in found["host_region"]["evidence"]
    assert found["host_region"]["demo"] == "tokenizer_bound"

    regions, _ = spans_of(demos_smoke_out, "fixed")
    low, high = fixed.window
    open_us = sum(max(0.0, min(r["ts"] + r["dur"], high) - max(r["ts"], low)) for r in regions)
    share = (fixed.result["host_regions"] or {}).get("tokenize", {}).get("pct", 0.0)
    assert share <= 100.0 * open_us / (high - low) * (1 + TRACE_REL)
    fired = "host_region" in [f["id"] for f in fixed.result["findings"]]
    assert fired == (share >= verdicts.HOST_REGION_MIN_PCT)


@pytest.mark.parametrize("speedup, speedup_words", [
    (2.0, "2.00x more requests/s"), (1.0, "the same requests/s"),
    (1.004, "the same requests/s"), (0.996, "the same requests/s"),  # both print as 1.00x
    (0.5, "0.50x the requests/s (slower)")])
@pytest.mark.parametrize("latency_ratio, latency_words", [
    (0.25, "4.00x lower p50 latency"),  # lower is better: the factor is old over new
    (1.0, "the same p50 latency"),  # no change is neither better nor worse
    (4.0, "4.00x higher p50 latency (worse)")])
def test_the_headline_says_which_way_each_number_went(speedup, speedup_words, latency_ratio,
                                                      latency_words):
    """compare.headline on hand-made comparisons, each direction known: more requests/s is
    better, lower latency is better. (Powers of two: the ratios print exactly.)"""
    comparison = {"speedup": speedup, "speedup_of": "requests/s", "latency_ratio": latency_ratio,
                  "latency_of": "p50 latency", "peak_memory_ratio": None}
    assert compare.headline(comparison) == f"{speedup_words}, {latency_words}"


# compare.headline's two parts for a serving pair: "<n>x more requests/s" or "<n>x the
# requests/s (slower)", then "<n>x lower p50 latency" or "<n>x higher p50 latency (worse)".
SERVING_HEADLINE = re.compile(
    r"(?:(?P<speedup>\d+\.\d\d)x (?P<throughput>more requests/s|the requests/s \(slower\))"
    r"|the same requests/s), "
    r"(?:(?P<latency>\d+\.\d\d)x (?P<way>lower|higher) p50 latency(?P<worse> \(worse\))?"
    r"|the same p50 latency)")
PRINTED_ROUNDING = 0.005 + 1e-9  # a ratio printed with two decimals is off by at most 0.005


def test_compare_rates_the_pair_by_requests_and_latency(demos_smoke_out):
    """The smoke pair's ratios come from its summaries, and its headline prints them. Which way
    each went at smoke sizes is the timing of the moment; the words for each way are checked on
    known directions in the test above, and here only where the printed number says the way."""
    comparison = compare.compare(demos_smoke_out / "tokenizer_bound")
    bad, fixed = (read_summary(demos_smoke_out, "tokenizer_bound", v) for v in ("bad", "fixed"))
    assert comparison["speedup_of"] == "requests/s" and comparison["latency_of"] == "p50 latency"
    speedup = fixed["requests_per_s"] / bad["requests_per_s"]
    latency = fixed["latency_ms"]["p50"] / bad["latency_ms"]["p50"]
    assert comparison["speedup"] == pytest.approx(speedup)
    assert comparison["latency_ratio"] == pytest.approx(latency)
    # fixed records every thread (profile_all_threads), which writes no memory events: no peak
    # memory, so the headline has no memory part.
    assert fixed["peak_memory_mb"] is None and comparison["peak_memory_ratio"] is None
    words = SERVING_HEADLINE.fullmatch(compare.headline(comparison))
    assert words, compare.headline(comparison)
    # requests/s: the ratio itself, either way; a number printed above (below) 1.00 is one
    # above (below) 1, so the words are "more" ("the ... (slower)"); one that would print as
    # 1.00 reads "the same".
    if words["speedup"] is None:
        assert f"{speedup:.2f}" == "1.00"
    else:
        printed = float(words["speedup"])
        assert printed == pytest.approx(speedup, abs=PRINTED_ROUNDING) and printed != 1.0
        assert words["throughput"].startswith("more") == (printed > 1.0)
    # Latency: a factor of at least 1 either way, new over old when higher, old over new when
    # lower; "(worse)" goes with higher.
    factor = max(latency, 1 / latency)
    if words["latency"] is None:
        assert f"{factor:.2f}" == "1.00"
    else:
        printed = float(words["latency"])
        assert printed > 1.0
        assert printed == pytest.approx(factor, abs=PRINTED_ROUNDING)
        assert words["way"] == ("higher" if latency > 1 else "lower")
        assert bool(words["worse"]) == (words["way"] == "higher")


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
