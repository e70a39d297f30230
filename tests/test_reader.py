"""Reading a trace (common/trace.py, common/trace_columns.py): the file is read once, whatever keys
follow traceEvents; the typed reader (msgspec) and the plain one (dicts from orjson or json, where
msgspec is absent) give the same results; gzip streams; the benchmark builds real-shaped traces."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from common import analyze, trace
from tests.conftest import ROOT, load_script
from tests.kineto_builder import BF16_GEMM, ELEMENTWISE, KinetoTrace, simulate_training

SHARED_TRACES = sorted((ROOT.parent / "shared" / "traces").glob("*.json.gz"))
SMALL_SHARED = [p for p in SHARED_TRACES if p.stat().st_size < 100_000]  # json is slow on the rest
# Current Kineto's timestamps: µs since the epoch, with ns digits (19 significant digits, more than
# a float holds: both readers must round them alike).
KINETO_T0 = 1_669_783_687_352_244.123
# What current Kineto writes after traceEvents. The strings hold "]" and "},{", which a reader that
# looks for the end of traceEvents by searching for "]", or cuts at "},{", would trip on.
KEYS_AFTER = {"INFO": ["CuptiActivityProfiler.cpp:914] [Profiler = NcclProfiler] Evaluating",
                       'a "},{" and a "}, {" in a log line'],
              "traceName": "/tmp/libkineto_activities_1074.json", "displayTimeUnit": "ms",
              "baseTimeNanoseconds": 1719853884000000000}
SCRIPT_TIMEOUT_S = 120


def kineto_trace(steps: int = 4) -> KinetoTrace:
    """A GPU training trace with flows, [memory] events, a forward conv with shapes, spans
    without a duration and float timestamps with ns digits."""
    built = simulate_training(KinetoTrace(), steps=steps, start=KINETO_T0, kernels_per_step=12,
                              kernel_us=40.125, dataloader_us=300.5, syncs_per_step=2,
                              after_sync_us=20.25, h2d_us=30.0625, peak_memory_bytes=1 << 30)
    built.gpu()
    built.span("op", "aten::conv2d", KINETO_T0 + 10.001, 50.002,
               **{"Input Dims": [[32, 3, 224, 224], [64, 3, 7, 7], []], "External id": 7})
    for extra in ({}, {"dur": None}):  # no duration, a null one: zero-length spans
        built.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 4242,
                             "tid": 4242, "ts": KINETO_T0 + 3.5, **extra})
    return built


def write_kineto_shaped(built: KinetoTrace, path: Path, compress: bool = True) -> Path:
    """Written as current Kineto writes a trace: some keys before traceEvents, KEYS_AFTER after."""
    data = built.to_json()
    events = data.pop("traceEvents")
    data.pop("displayTimeUnit")
    text = json.dumps({**data, "traceEvents": events, **KEYS_AFTER}, indent=1).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return path


class Reads:
    """Counts how often the file is opened by the typed reader and read whole (read_bytes), and
    how often the plain reader runs."""

    def __init__(self, monkeypatch):
        self.streamed = self.whole = self.plain = 0
        for name, counter in (("text_chunks", "streamed"), ("read_bytes", "whole"),
                              ("plain_pieces", "plain")):
            monkeypatch.setattr(trace, name, self.counting(getattr(trace, name), counter))

    def counting(self, function, counter: str):
        def counted(*args, **kwargs):
            setattr(self, counter, getattr(self, counter) + 1)
            return function(*args, **kwargs)
        return counted


    def assert_read_once(self) -> None:
        """Streamed once by the typed reader; where msgspec is absent, read whole once."""
        typed = trace.msgspec is not None
        assert (self.streamed, self.whole, self.plain) == ((1, 0, 0) if typed else (0, 1, 1))


needs_msgspec = pytest.mark.skipif(trace.msgspec is None, reason="tests the typed reader (msgspec)")


def plain_result(path: Path, monkeypatch, parser: str = "orjson") -> dict:
    """analyze_trace as it is without msgspec and isal (and without orjson: parser "json")."""
    with monkeypatch.context() as patched:
        patched.setattr(trace, "msgspec", None)
        patched.setattr(trace, "INFLATE", zlib)
        if parser == "json":
            patched.setattr(trace, "orjson", None)
        return analyze.analyze_trace(path)


def test_a_trace_with_keys_after_trace_events_is_read_once(tmp_path, monkeypatch):
    """The first piecewise reader parsed every piece, then failed on the last one (the keys after
    traceEvents) and read the whole file again. Now: one pass over the file, pieces of any size."""
    path = write_kineto_shaped(kineto_trace(), tmp_path / "t.pt.trace.json.gz")
    expected = plain_result(path, monkeypatch)
    for chunk_bytes in (200, 3000, trace.CHUNK_BYTES):
        monkeypatch.setattr(trace, "CHUNK_BYTES", chunk_bytes)
        reads = Reads(monkeypatch)
        assert analyze.analyze_trace(path) == expected
        reads.assert_read_once()
    top, pieces = trace.event_pieces(path, chunk_bytes=500)
    assert sum(map(len, pieces)) == len(kineto_trace().to_json()["traceEvents"])
    assert {key: top[key] for key in KEYS_AFTER} == KEYS_AFTER  # read with the last piece
    assert expected["input_batch"] == 32 and expected["peak_memory_mb"] == (1 << 30) / 1e6


def test_trace_events_is_found_as_a_top_level_key_only(tmp_path, monkeypatch):
    """"traceEvents": [ written inside a string or a nested object before the real key."""
    data = kineto_trace().to_json()
    decoys = {"note": 'a log line: "traceEvents": [', "meta": {"traceEvents": [{"ph": "X"}]}}
    text = json.dumps({**decoys, **data}).encode()
    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(text)
    expected = plain_result(path, monkeypatch)
    reads = Reads(monkeypatch)
    assert analyze.analyze_trace(path) == expected
    reads.assert_read_once()
    monkeypatch.setattr(trace, "GZIP_READ_BYTES", 16)  # the first read: 16 bytes, then 64
    top, pieces = trace.event_pieces(path, chunk_bytes=64)  # the key found across chunks
    assert sum(map(len, pieces)) == len(data["traceEvents"]) and top["meta"] == decoys["meta"]


@pytest.mark.parametrize("path", SHARED_TRACES, ids=lambda p: p.name)
def test_shared_real_traces_are_read_once(path, monkeypatch):
    reads = Reads(monkeypatch)
    analyze.analyze_trace(path)
    reads.assert_read_once()


@pytest.mark.parametrize("path", SHARED_TRACES, ids=lambda p: p.name)
def test_without_msgspec_shared_traces_give_identical_results(path, monkeypatch):
    assert plain_result(path, monkeypatch) == analyze.analyze_trace(path)


@pytest.mark.parametrize("path", SMALL_SHARED, ids=lambda p: p.name)
def test_without_msgspec_and_orjson_small_traces_give_identical_results(path, monkeypatch):
    assert plain_result(path, monkeypatch, "json") == analyze.analyze_trace(path)


def test_float_timestamps_with_ns_digits_read_alike_by_every_parser(tmp_path, monkeypatch):
    """msgspec, orjson and json each parse "1669783687352244.123": the same float, every number
    of the analysis equal (not approximately: exactly)."""
    path = write_kineto_shaped(kineto_trace(), tmp_path / "t.pt.trace.json", compress=False)
    typed = analyze.analyze_trace(path)
    assert plain_result(path, monkeypatch) == typed
    assert plain_result(path, monkeypatch, "json") == typed


def test_a_python_without_msgspec_orjson_and_isal_reads_traces(tmp_path):
    """PYTHON=python3 on a GPU box without network: json and zlib alone, the same numbers."""
    path = write_kineto_shaped(kineto_trace(), tmp_path / "t.pt.trace.json.gz")
    script = ("import sys\n"
              "for name in ('msgspec', 'orjson', 'isal'): sys.modules[name] = None\n"
              "from common import analyze, trace\n"
              "assert trace.INFLATE is trace.zlib and not (trace.msgspec or trace.orjson)\n"
              "sys.exit(analyze.main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", script, str(path), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(json.dumps(analyze.analyze_trace(path)))


def test_a_cut_inside_a_string_is_cut_again_not_read_again(tmp_path, monkeypatch):
    """Kernels named with "},{" in them: a piece cut there ends inside a string and never parses,
    so the reader cuts at the next gap between events, in the text it already has."""
    built = kineto_trace()
    for event in built.events:
        if event.get("name") == ELEMENTWISE or event.get("name") == BF16_GEMM:
            event["name"] = 'odd<"},{"> kernel }, { with "} , {"'
    path = write_kineto_shaped(built, tmp_path / "t.pt.trace.json.gz")
    expected = plain_result(path, monkeypatch)
    monkeypatch.setattr(trace, "CHUNK_BYTES", 10)  # try a cut after every event
    reads = Reads(monkeypatch)
    assert analyze.analyze_trace(path) == expected
    reads.assert_read_once()
    assert expected["gpu"]["kernels_per_step"] == 12


@needs_msgspec
def test_an_event_msgspec_does_not_take_is_read_as_dicts(tmp_path, monkeypatch):
    """"args": null (or a field of another type than the Struct's): the plain reader reads the
    file once more and gives what it gives without msgspec."""
    built = kineto_trace()
    kernel = next(e for e in built.events if e["cat"] == "kernel")
    kernel["args"] = None  # no correlation: the kernel is not linked to its launch
    path = write_kineto_shaped(built, tmp_path / "t.pt.trace.json.gz")
    expected = plain_result(path, monkeypatch)
    reads = Reads(monkeypatch)
    assert analyze.analyze_trace(path) == expected
    assert (reads.streamed, reads.whole, reads.plain) == (1, 1, 1)


def test_gzip_of_several_members_and_truncated_gzip(tmp_path):
    built = kineto_trace()
    plain = write_kineto_shaped(built, tmp_path / "plain.pt.trace.json", compress=False)
    text = plain.read_bytes()
    members = tmp_path / "members.pt.trace.json.gz"  # as `cat a.gz b.gz` makes
    members.write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]))
    assert analyze.analyze_trace(members) | {"trace": ""} == analyze.analyze_trace(plain) | {
        "trace": ""}
    assert trace.read_bytes(members) == text
    truncated = tmp_path / "truncated.pt.trace.json.gz"
    truncated.write_bytes(gzip.compress(text)[:-100])
    with pytest.raises(trace.TraceError, match="truncated or corrupt gzip"):
        analyze.analyze_trace(truncated)


@needs_msgspec
def test_peak_memory_grows_by_less_than_the_trace_text(tmp_path):
    """The text streams in and events live one piece at a time: reading a 35 MB trace allocates
    less than 35 MB at its peak (the whole text alone would). Counted by tracemalloc, which sees
    every allocation of Python, numpy and msgspec by its requested size: the same count on every
    run, where the process's peak RSS also holds what the allocator keeps (README states the RSS
    bound, measured by scripts/bench_analyze.py on 135 MB)."""
    built = simulate_training(KinetoTrace(), steps=100, kernels_per_step=600, dataloader_us=300,
                              peak_memory_bytes=1 << 30)
    path = built.write(tmp_path / "big.pt.trace.json")
    text_mib = path.stat().st_size / 2**20
    assert text_mib > 30
    measure = ("import sys, tracemalloc\nfrom common import analyze\ntracemalloc.start()\n"
               "analyze.analyze_trace(sys.argv[1])\n"
               "print(tracemalloc.get_traced_memory()[1] / 2**20)")
    done = subprocess.run([sys.executable, "-c", measure, str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < text_mib


def test_the_benchmark_scales_a_real_shaped_trace(tmp_path, monkeypatch):
    """Copies shifted in time with fresh ids, the keys after traceEvents kept after it, integer
    timestamps kept integers, the size the target asks; the analyzer reads it once."""
    bench = load_script("bench_analyze")
    seed_trace = KinetoTrace()
    simulate_training(seed_trace, steps=3, kernels_per_step=10, peak_memory_bytes=1 << 30)
    seed = write_kineto_shaped(seed_trace, tmp_path / "seed.json.gz")
    out = tmp_path / "big.pt.trace.json.gz"
    target_mb = 0.25
    built = bench.build_large_trace(seed, target_mb, out)
    data = json.loads(gzip.decompress(out.read_bytes()))
    assert list(data)[-len(KEYS_AFTER):] == list(KEYS_AFTER) and list(data)[0] == "schemaVersion"
    assert built["copies"] >= 2 and built["json_bytes"] <= target_mb * 2**20
    assert built["json_bytes"] > target_mb * 2**20 - 1000  # within an event or so
    events = data["traceEvents"]
    assert len(events) == built["events"]
    assert all(isinstance(e["ts"], int) for e in events if e["ph"] != "M")
    correlations = [e["args"]["correlation"] for e in events if e.get("cat") == "kernel"]
    assert len(correlations) == len(set(correlations))
    steps = [e["name"] for e in events if e["name"].startswith("ProfilerStep#")
             and e.get("cat") != "gpu_user_annotation"]
    assert len(steps) == len(set(steps))  # numbered on: a step number seen twice is impossible
    reads = Reads(monkeypatch)
    result = analyze.analyze_trace(out)
    reads.assert_read_once()
    assert result["steps"] > 3 * built["copies"]
