"""Impossible events (common/sanity.py): each kind, put into an otherwise sound hand-built trace,
is named with its count in one warning line and left out of every number: the analysis equals the
sound trace's, warnings aside. Where nothing sensible is left, one line and exit code 2. Files
that are no trace (archives, a gzip inside a gzip, an empty gzip, folders) say what they are."""
from __future__ import annotations

import gzip
import io
import json
import tarfile
import zipfile

import pytest

from common import analyze, compare, sanity
from tests.kineto_builder import KinetoTrace, simulate_training, write_demo_run

# Epoch-like timestamps, as current Kineto writes them (µs since 1970): ts 0 is then 54 years
# away from the rest; a power of two, so the builder's µs offsets add exactly.
EPOCH_US = float(2**50)
ONE_DAY_US = sanity.US_PER_DAY


def sound(vocabulary: str = "current") -> KinetoTrace:
    built = KinetoTrace(vocabulary=vocabulary)
    built.gpu()
    simulate_training(built, steps=3, start=EPOCH_US, dataloader_us=100,
                      peak_memory_bytes=1 << 30)
    for step in step_spans(built):
        built.op("aten::addmm", step["ts"] + 110, 30)
    return built


def analysed(tmp_path, built: KinetoTrace, name: str = "t") -> dict:
    return analyze.analyze_trace(built.write(tmp_path / f"{name}.pt.trace.json"))


def numbers(result: dict) -> dict:
    """Everything the analysis says but where it came from and its warnings."""
    return {k: v for k, v in result.items()
            if k not in ("trace", "warnings", "impossible_events")}


def step_spans(built: KinetoTrace) -> list[dict]:
    return [e for e in built.events if e["name"].startswith("ProfilerStep#")
            and e["cat"] == built.category("step")]


def first_of(built: KinetoTrace, category: str) -> dict:
    return next(e for e in built.events if e.get("cat") == category)


def add_copy(built: KinetoTrace, event: dict, **changes) -> None:
    built.events.append({**event, "args": dict(event.get("args", {})), **changes})


# Each case: what to add to a sound trace, and the kind it must be counted as.
INJECTED = {
    "negative_duration": lambda t: add_copy(t, first_of(t, "cpu_op"), dur=-100),
    "outside_recording": lambda t: add_copy(t, first_of(t, "kernel"), ts=0),
    "overlong_duration": lambda t: add_copy(t, first_of(t, "cpu_op"), dur=1e300),
    "duplicate_step": lambda t: add_copy(t, step_spans(t)[0]),  # ProfilerStep#1 twice
    "overlapping_step": lambda t: add_copy(t, step_spans(t)[1], name="ProfilerStep#99",
                                           ts=step_spans(t)[1]["ts"] + 10),
}


@pytest.mark.parametrize("kind", sorted(INJECTED))
def test_an_impossible_event_is_named_and_left_out_of_every_number(tmp_path, kind):
    clean = analysed(tmp_path, sound(), "clean")
    built = sound()
    INJECTED[kind](built)
    result = analysed(tmp_path, built)
    assert numbers(result) == numbers(clean)
    assert result["impossible_events"] == {k: int(k == kind) for k in sanity.KIND_WORDS}
    assert clean["impossible_events"] == dict.fromkeys(sanity.KIND_WORDS, 0)
    assert clean["warnings"] == []
    assert result["warnings"] == [sanity.warning_line({kind: 1})]
    assert f"1 event {sanity.KIND_WORDS[kind]}" in result["warnings"][0]


def dataloader_span(built: KinetoTrace) -> dict:
    return next(e for e in built.events if e["name"].startswith("enumerate(DataLoader)"))


# Events the reader keeps in two column groups, one of them in sanity.UNCOUNTED_GROUPS: a Python
# frame is in "other" and "python"; a DataLoader span written as an operator (the TensorBoard
# rewrite's cpu_op) in "cpu_named" and the named spans. Counted in both, one event would read 2.
# Each case: the group of the two that is not counted, the vocabulary, what to add, and the one
# kind it must be counted as.
TWICE_HELD = {
    "python frame": ("python", "current",
                     lambda t: t.python("train.py(7): loop", EPOCH_US + 10, -100),
                     "negative_duration"),
    "DataLoader span at ts 0": ("cpu_named", "tensorboard",
                                lambda t: add_copy(t, dataloader_span(t), ts=0),
                                "outside_recording"),
    "DataLoader span of negative duration": ("cpu_named", "tensorboard",
                                             lambda t: add_copy(t, dataloader_span(t), dur=-100),
                                             "negative_duration"),
}
@pytest.mark.parametrize("case", list(TWICE_HELD))
def test_an_impossible_event_held_twice_is_counted_once(tmp_path, case):
    group, vocabulary, inject, kind = TWICE_HELD[case]
    assert group in sanity.UNCOUNTED_GROUPS
    clean = analysed(tmp_path, sound(vocabulary), "clean")
    built = sound(vocabulary)
    inject(built)
    result = analysed(tmp_path, built)
    assert numbers(result) == numbers(clean)
    assert result["impossible_events"] == {k: int(k == kind) for k in sanity.KIND_WORDS}
    assert result["warnings"] == [sanity.warning_line({kind: 1})]


# Kernels at ts 0 put into a trace whose median start is sampled: one; and three quarters of
# ANCHOR_SAMPLE, all at the end of the kernel column (the first group the pass reads): still
# under half of the trace's starts (it holds 2 * ANCHOR_SAMPLE others, below), so the median of
# an evenly strided sample is the bulk's, but most of a sample of the trace's first
# ANCHOR_SAMPLE starts.
@pytest.mark.parametrize("impossible", [1, sanity.ANCHOR_SAMPLE * 3 // 4], ids=["one", "many"])
def test_impossible_events_in_a_trace_whose_median_start_is_sampled(tmp_path, impossible):
    """Over sanity.ANCHOR_SAMPLE starts the median is taken of an evenly strided sample: ts 0
    among epoch timestamps is still found there, and only it. ANCHOR_SAMPLE Python frames (each
    held in two column groups, "other" and "python") give at least 2 * ANCHOR_SAMPLE starts: a
    stride of 2 at least, so the sample is not the whole trace."""
    built = sound()
    before = step_spans(built)[0]["ts"] - sanity.ANCHOR_SAMPLE - 1
    for index in range(sanity.ANCHOR_SAMPLE):  # 1 µs apart, before the steps: only read
        built.python("train.py(7): loop", before + index, 0.5)
    kernel = first_of(built, "kernel")
    for _ in range(impossible):
        add_copy(built, kernel, ts=0)
    result = analysed(tmp_path, built)
    assert result["impossible_events"] == {k: impossible * (k == "outside_recording")
                                           for k in sanity.KIND_WORDS}


def test_a_gpu_event_days_away_and_a_memory_event_at_ts_0_are_left_out(tmp_path):
    clean = analysed(tmp_path, sound(), "clean")
    built = sound()
    add_copy(built, first_of(built, "kernel"), ts=EPOCH_US + 2 * ONE_DAY_US)
    memory = next(e for e in built.events if e.get("name") == "[memory]")
    add_copy(built, memory, ts=0, args={**memory["args"], "Total Allocated": 10**15})
    result = analysed(tmp_path, built)
    assert numbers(result) == numbers(clean)  # the peak too: not the petabyte at ts 0
    assert result["impossible_events"]["outside_recording"] == 2


def test_ts_0_is_no_problem_where_timestamps_start_at_0(tmp_path):
    """Traces written relative to the capture start near 0: there ts 0 is inside the recording."""
    built = KinetoTrace()
    built.gpu()
    simulate_training(built, steps=3, start=0.0)
    add_copy(built, first_of(built, "kernel"), ts=0)
    result = analysed(tmp_path, built)
    assert result["warnings"] == [] and not any(result["impossible_events"].values())


def test_the_steps_numbers_from_the_issue_never_print(tmp_path, capsys):
    """A ProfilerStep with a negative duration or a dur of 1e300 is not a step: no negative or
    300-digit step time reaches the human output."""
    built = sound()
    steps = step_spans(built)
    steps[0]["dur"], steps[1]["dur"] = -100, 1e300
    path = built.write(tmp_path / "t.pt.trace.json")
    result = analyze.analyze_trace(path)
    assert result["steps"] == 1 and 0 < result["step_ms"]["mean"] < ONE_DAY_US / 1000
    assert analyze.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("warning ") == 1 and "-0." not in out and "e+" not in out
    assert ("1 event with a negative duration; 1 event lasting more than a day" in out)


@pytest.mark.parametrize("broken, why", [
    ("every_event", "nothing left to analyse"),
    ("every_step", "no ProfilerStep#N left"),
])
def test_nothing_sensible_left_is_one_line_and_exit_2(tmp_path, capsys, broken, why):
    built = sound()
    for event in (step_spans(built) if broken == "every_step"
                  else [e for e in built.events if e.get("ph") == "X"]):
        event["dur"] = -1
    path = built.write(tmp_path / "t.pt.trace.json")
    assert analyze.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and why in err
    assert "with a negative duration" in err and "Traceback" not in err


def test_compare_carries_each_variants_warning(tmp_path):
    bad = sound()
    INJECTED["duplicate_step"](bad)
    write_demo_run(tmp_path, "small_batch", "bad", bad, samples_per_s=100.0, peak_memory_mb=1024.0)
    write_demo_run(tmp_path, "small_batch", "fixed", sound(), samples_per_s=200.0,
                   peak_memory_mb=1024.0)
    comparison = compare.compare(tmp_path / "small_batch")
    assert comparison["warnings"] == [f"bad: {sanity.warning_line({'duplicate_step': 1})}"]


# --- Files that are no trace: one line that says what the file is. ------------------------------

def trace_text() -> bytes:
    return json.dumps(sound().to_json()).encode()


def tar_of(text: bytes, mode: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        info = tarfile.TarInfo("run/t.pt.trace.json")
        info.size = len(text)
        archive.addfile(info, io.BytesIO(text))
    return buffer.getvalue()


def zip_of(text: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("run/t.pt.trace.json", text)
    return buffer.getvalue()


FILES = {  # name -> (its bytes, what the one line must say)
    "twice.pt.trace.json.gz": (lambda: gzip.compress(gzip.compress(trace_text())),
                               "a gzip inside a gzip"),
    "empty.pt.trace.json.gz": (lambda: gzip.compress(b""), "an empty gzip"),
    "traces.zip": (lambda: zip_of(trace_text()), "a zip archive, not a trace"),
    "traces.tar": (lambda: tar_of(trace_text(), "w"), "a tar archive, not a trace"),
    "traces.tar.gz": (lambda: tar_of(trace_text(), "w:gz"), "a tar archive, gzipped, not a trace"),
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_file_that_is_no_trace_says_what_it_is(tmp_path, capsys, name):
    make, says = FILES[name]
    path = tmp_path / name
    path.write_bytes(make())
    assert analyze.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and says in err


def test_a_folder_of_folders_of_traces_names_one(tmp_path, capsys):
    (tmp_path / "runs" / "a").mkdir(parents=True)
    sound().write(tmp_path / "runs" / "a" / "t.pt.trace.json")
    assert analyze.main([str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its subfolders hold 1" in err
    assert str(tmp_path / "runs" / "a") in err


@pytest.mark.parametrize("vocabulary", ["current", "2021", "tensorboard"])
@pytest.mark.parametrize("dataloader_us", [0, 100])
def test_a_trace_without_steps_keeps_its_window(tmp_path, vocabulary, dataloader_us):
    """Without ProfilerStep the window is the CPU side's extent (operators and DataLoader spans;
    with neither, every span, a Python frame's here): left out, an impossible kernel must not
    change it, in any vocabulary."""
    def stepless() -> KinetoTrace:
        built = KinetoTrace(vocabulary=vocabulary)
        built.gpu()
        simulate_training(built, steps=3, start=EPOCH_US, dataloader_us=dataloader_us)
        built.events = [e for e in built.events if not e["name"].startswith("ProfilerStep#")]
        built.python("train.py(42): step", EPOCH_US - 500, 20_000)  # the outermost host span
        return built

    clean = analysed(tmp_path, stepless(), "clean")
    built = stepless()
    add_copy(built, first_of(built, built.category("kernel")), dur=-5)
    result = analysed(tmp_path, built)
    assert numbers(result) == numbers(clean)
    assert result["impossible_events"]["negative_duration"] == 1


def test_an_impossible_operators_shapes_are_left_out_too(tmp_path):
    """A softmax over a [.., 1024, 1024] input with a negative duration is not an operator: no
    naive_attention from its shapes (nor a batch from a linear layer's)."""
    clean = analysed(tmp_path, sound(), "clean")
    built = sound()
    built.span("op", "aten::softmax", EPOCH_US + 10, -100,
               **{"Input Dims": [[8, 16, 1024, 1024], [], []]})
    built.span("op", "aten::linear", EPOCH_US + 20, 2e300, **{"Input Dims": [[4, 8], [8, 8], [8]]})
    result = analysed(tmp_path, built)
    assert numbers(result) == numbers(clean)
    assert result["attention"]["square_softmax_max"] is None and result["input_batch"] is None
