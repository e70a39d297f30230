"""llm_decode: both variants generate the same tokens; bad grows its cache by torch.cat every
token and fixed does not; the inference summary's numbers agree with each other; a CUDA run whose
CUDA graphs were skipped stops."""
from __future__ import annotations

import json

import pytest
import torch

from common import data, devices, harness, models, profiling, runs, trace
from tests.conftest import ROOT, read_summary, run_demo

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


@pytest.mark.parametrize("argv, new_tokens", [(["--smoke"], None), ([], 48)],
                         ids=["smoke", "cpu-preset-48-tokens"])
def test_both_variants_generate_the_same_tokens(argv, new_tokens, tmp_path):
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
        # A request's host latency holds its tokens: its first, and new_tokens - 1 later ones.
        assert summary["time_to_first_token_ms"]["p50"] < latency["max"]
        assert summary["per_token_ms"]["p50"] * (new_tokens - 1) < latency["max"]
    # fixed compiles its one-token step once, in the warm-up: every later token reuses it (a
    # position passed as a Python int, or a shape that grows, would compile again and again)
    compiled = read_summary(demos_smoke_out, "llm_decode", "fixed")["extra"]
    assert compiled["dynamo_frames_compiled"] == {"warmup": 1, "timed_and_profiled": 0}


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
