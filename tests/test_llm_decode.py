"""llm_decode: both variants generate the same tokens; bad grows its cache by torch.cat every
token and fixed does not; the inference summary's numbers agree with each other; a CUDA run whose
CUDA graphs were skipped stops."""
from __future__ import annotations

import itertools
import json
import types

import pytest
import torch

from common import data, devices, harness, models, profiling, runs, trace
from tests.conftest import read_summary

# Two greedy decoders that differ in float rounding (a masked attention over the static cache's
# every slot, a compiled kernel's summation order) pick different tokens only where the top two
# logits are this close: FP32 rounding of logits of order 1 is ~1e-6, so a gap under 1e-4 is a
# tie that either may break; a real difference in the model shows as a wider gap.
TIE_GAP = 1e-4


def generated(variant: str, argv: list[str], new_tokens: int | None = None) -> list[list[int]]:
    run = harness.setup("llm_decode", variant, ["--device", "cpu", *argv])
    cache = models.GrowingKVCache if variant == "bad" else models.StaticKVCache
    model = models.decoder(run, cache)
    next_token = model.next_token if variant == "bad" else torch.compile(model.next_token)
    count = new_tokens or run.sizes["new_tokens"]
    with torch.inference_mode():
        return [torch.cat(harness.decode_tokens(model, next_token, prompt, count), dim=1)
                .tolist()[0] for prompt in data.prompts(run)]


def top_two_gap(argv: list[str], prompt_index: int, tokens: list[int]) -> float:
    """The gap between the two largest logits of bad's model after the prompt and `tokens`, in
    one eager pass over the whole sequence."""
    run = harness.setup("llm_decode", "bad", ["--device", "cpu", *argv])
    model = models.decoder(run, models.GrowingKVCache)
    sequence = torch.cat([data.prompts(run)[prompt_index], torch.tensor([tokens])], dim=1)
    model.reset_cache()
    with torch.inference_mode():
        x = model.embed(sequence) + model.position(torch.arange(sequence.size(1)))
        for block in model.blocks:
            x = block(x, torch.arange(sequence.size(1)))
        logits = model.head(model.norm(x[:, -1]))[0]
    top = logits.topk(2).values
    return float(top[0] - top[1])


def test_both_variants_generate_the_same_tokens_at_smoke_sizes(tmp_path, after_the_smoke_run):
    # The smoke run's fixed.py compiled this decode step at these sizes: with it in Inductor's
    # cache, this test takes 11 CPU-s on the 2-core EPYC (32 compiling it).
    assert_same_tokens(["--smoke"], None, tmp_path)


def test_both_variants_generate_the_same_48_tokens_at_cpu_preset_sizes(tmp_path):
    assert_same_tokens([], 48, tmp_path)


def assert_same_tokens(argv: list[str], new_tokens: int | None, tmp_path) -> None:
    argv = [*argv, "--out", str(tmp_path)]
    bad, fixed = generated("bad", argv, new_tokens), generated("fixed", argv, new_tokens)
    assert len(bad) == data.PROMPT_COUNT
    for index, (a, b) in enumerate(zip(bad, fixed)):
        assert len(a) == len(b) == (new_tokens or 8)
        differ = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if differ is not None:  # allowed only at a tie; after it the sequences part ways
            gap = top_two_gap(argv, index, a[:differ])
            assert gap < TIE_GAP, f"prompt {index}: token {differ} differs at a gap of {gap}"


def test_the_tie_check_sees_a_real_gap(tmp_path):
    # Greedy tokens of this model are picked by clear margins: were the check's gap always tiny,
    # the test above could never fail.
    argv = ["--smoke", "--out", str(tmp_path)]
    first = generated("bad", argv)[0]
    assert top_two_gap(argv, 0, first[:3]) > 100 * TIE_GAP


def test_the_smoke_runs_write_inference_summaries(demos_smoke_out):
    for variant in ("bad", "fixed"):
        summary = read_summary(demos_smoke_out, "llm_decode", variant)
        new_tokens = summary["config"]["new_tokens"]
        assert summary["unit"] == "request" and summary["batch_size"] == 1
        assert summary["config"]["inference_mode"] is True
        assert summary["rated_by"] == {"throughput": "tokens_per_s", "latency": "per_token_ms"}
        # One request a step: requests/s is samples/s, and every request makes new_tokens tokens.
        assert summary["requests_per_s"] == pytest.approx(summary["samples_per_s"], rel=1e-9)
        assert summary["tokens_per_s"] == pytest.approx(
            summary["requests_per_s"] * new_tokens, rel=1e-9)
        latency = summary["latency_ms"]
        assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
        assert_token_times_fit_in_the_latency(summary)
    # fixed compiles its one-token step once, in the warm-up: every later token reuses it (a
    # position passed as a Python int, or a shape that grows, would compile again and again)
    compiled = read_summary(demos_smoke_out, "llm_decode", "fixed")["extra"]
    assert compiled["dynamo_frames_compiled"] == {"warmup": 1, "timed_and_profiled": 0}


# Percentiles are interpolated, and ms are differences of float clock reads times 1000: a bound
# that holds exactly may miss by rounding in the last digits (a few ulps, ~1e-16 relative each).
# 1e-9 relative is far above that rounding and far below any real excess.
ROUNDING = 1e-9


def assert_token_times_fit_in_the_latency(summary: dict) -> None:
    """What the harness's clocks guarantee (harness.generate, token_clock) on a CPU, where the
    token marks and the latency are read from the same clock, perf_counter: a request's latency
    starts before its first mark and ends after its last, so its first token's time plus its
    new_tokens - 1 later tokens' times (differences of those marks) fit in it; and the timed
    requests run one after another inside the timed wall clock."""
    assert summary["device"] == "cpu"  # one clock for both (on a GPU the marks are CUDA events)
    latency, first, later = (summary[key] for key in
                             ("latency_ms", "time_to_first_token_ms", "per_token_ms"))
    # Request by request, first token <= latency: so every percentile of the first tokens'
    # times is at most the same percentile of the latencies.
    for q in ("p50", "p99", "max"):
        assert first[q] <= latency[q] * (1 + ROUNDING), q
    # Each later token's time <= its request's latency <= the slowest request's.
    assert later["max"] <= latency["max"] * (1 + ROUNDING)
    # At least half the later tokens' times are >= their median, and all of them together fit
    # in the timed requests' latencies, which fit in the timed wall clock.
    later_tokens = summary["steps"] * (summary["config"]["new_tokens"] - 1)
    assert later["p50"] * later_tokens / 2 <= summary["timed_wall_s"] * 1000.0 * (1 + ROUNDING)


def test_a_request_s_latency_holds_its_token_times_on_a_fake_clock(monkeypatch, tmp_path):
    """harness.generate's bookkeeping with a clock the test controls: harness's perf_counter
    advances by one tick at each read, and measure() is three steps. Each request then has
    one first token and new_tokens - 1 later ones, every time a whole number of ticks in ms
    (> 0: the clock advanced), and the first token's and later tokens' times add up to no more
    than the request's latency (its clock reads enclose the marks)."""
    tick_s = 2.0 ** -10  # a power of two: ticks and their ms (x 1000) are exact in floats
    tick_ms = tick_s * 1000.0
    reads = itertools.count()
    monkeypatch.setattr(harness, "time",
                        types.SimpleNamespace(perf_counter=lambda: next(reads) * tick_s))
    requests = 3

    def measure(run, step):  # the steps alone: no warm-up, timing or profiler
        for _ in range(requests):
            step()
        return run.requests

    monkeypatch.setattr(harness, "measure", measure)
    run = harness.setup("llm_decode", "bad", ["--smoke", "--device", "cpu",
                                              "--out", str(tmp_path)])
    model = models.decoder(run, models.GrowingKVCache)
    recorded = harness.generate(run, model, model.next_token, data.prompts(run))
    new_tokens = run.sizes["new_tokens"]
    assert len(recorded.latency_ms) == len(recorded.first_token_ms) == requests
    assert len(recorded.per_token_ms) == requests * (new_tokens - 1)
    assert recorded.tokens == requests * new_tokens
    for value in (*recorded.latency_ms, *recorded.first_token_ms, *recorded.per_token_ms):
        assert value > 0 and (value / tick_ms).is_integer(), value
    for index in range(requests):
        later = recorded.per_token_ms[index * (new_tokens - 1):(index + 1) * (new_tokens - 1)]
        assert recorded.first_token_ms[index] + sum(later) <= recorded.latency_ms[index]


def cat_calls_per_step(out, variant: str) -> float:
    run_dir = out / "llm_decode" / variant
    events = trace.load_trace(trace.newest_trace(run_dir))["traceEvents"]
    steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    return sum(1 for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::cat") / steps


def test_bad_grows_its_cache_by_cat_and_fixed_writes_in_place(demos_smoke_out):
    summary = read_summary(demos_smoke_out, "llm_decode", "bad")
    sizes = summary["sizes"]
    # keys and values of every block at every token after the first; one more joins the tokens
    assert cat_calls_per_step(demos_smoke_out, "bad") == 2 * sizes["blocks"] * (
        sizes["new_tokens"] - 1) + 1
    assert cat_calls_per_step(demos_smoke_out, "fixed") == 1


def test_inference_numbers_read_only_the_timed_requests():
    requests = runs.Requests(latency_ms=[100.0, 100.0], first_token_ms=[50.0, 50.0],
                                per_token_ms=[9.0] * 4, tokens=6)
    before = requests.mark()
    requests.latency_ms += [10.0, 20.0, 30.0, 40.0]
    requests.first_token_ms += [1.0, 2.0, 3.0, 4.0]
    requests.per_token_ms += [1.0, 3.0] * 4
    requests.tokens += 12
    numbers = profiling.inference_numbers(requests, before, wall_s=2.0)
    assert numbers["requests_per_s"] == 2.0 and numbers["tokens_per_s"] == 6.0
    assert numbers["latency_ms"]["p50"] == 25.0 and numbers["latency_ms"]["max"] == 40.0
    assert numbers["time_to_first_token_ms"]["max"] == 4.0
    assert numbers["per_token_ms"]["p50"] == 2.0 and numbers["per_token_ms"]["max"] == 3.0


def test_skipped_cuda_graphs_stop_the_run(monkeypatch, tmp_path, capsys):
    from torch._dynamo.utils import counters
    run = harness.setup("llm_decode", "fixed", ["--smoke", "--device", "cpu",
                                                "--out", str(tmp_path)])
    (run.out_dir / "summary.json").parent.mkdir(parents=True, exist_ok=True)
    (run.out_dir / "summary.json").write_text(json.dumps({}))
    devices.require_cuda_graphs(run)  # no skip so far: passes
    monkeypatch.setitem(counters["inductor"], "cudagraph_skips", 2)
    with pytest.raises(SystemExit) as stopped:
        devices.require_cuda_graphs(run)
    assert stopped.value.code == 2
    message = capsys.readouterr().err.strip()
    assert message.count("\n") == 0 and "skipped CUDA graphs 2 time(s)" in message
    assert not (run.out_dir / "summary.json").exists()  # nothing stale left behind


def test_compare_rates_the_pair_by_generated_tokens_and_per_token_latency(demos_smoke_out):
    from common import compare
    comparison = compare.compare(demos_smoke_out / "llm_decode")
    bad, fixed = (read_summary(demos_smoke_out, "llm_decode", v) for v in ("bad", "fixed"))
    assert comparison["speedup_of"] == "generated tokens/s"
    assert comparison["speedup"] == pytest.approx(fixed["tokens_per_s"] / bad["tokens_per_s"])
    assert comparison["latency_of"] == "p50 per-token latency"
    assert comparison["latency_ratio"] == pytest.approx(
        fixed["per_token_ms"]["p50"] / bad["per_token_ms"]["p50"])
    rows = {row[0]: row for row in compare.table_rows(comparison)}
    assert "samples/s" not in rows and "real tokens/s" not in rows  # a request is the unit
    assert rows["generated tokens/s"][1] == f"{bad['tokens_per_s']:.0f}"
