"""Reading Kineto traces (Chrome-trace JSON, plain or gzip). Imports no torch."""
from __future__ import annotations

import argparse
import gzip
import json
import re
import zlib
from pathlib import Path

try:  # orjson parses a 100 MB trace several times faster than json, into the same objects
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; json keeps a bare install working
    orjson = None

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
BYTES_PER_MB = 1024 * 1024  # MiB, the unit torch.cuda.memory_summary uses
CPU_DEVICE_TYPE = 0  # "Device Type" of a [memory] event: 0 is the CPU, 1 is CUDA (c10::DeviceType)
GZIP_MAGIC = b"\x1f\x8b"  # a gzip file's first two bytes, whatever the file is called
SUMMARY_FILE = "summary.json"  # what a demo run writes beside its trace (common/harness.py)
STEP_PREFIX = "ProfilerStep#"  # torch.profiler's step marker: record_function("ProfilerStep#N")
# The spans PyTorch's DataLoader and DataPipes open around fetching a batch, as the TensorBoard
# plugin recognises them: enumerate(DataLoader)#<iterator>.__next__, and enumerate(DataPipe)#...
DATALOADER_PREFIX = "enumerate(DataLoader)#"
DATALOADER_SUFFIX = ".__next__"
DATAPIPE_PREFIX = "enumerate(DataPipe)#"
# summary.json's profiler_overhead_ratio (profiled step p50 / timed step p50) above which the
# recorded steps no longer stand for the timed ones: record_shapes and profile_memory add CPU time
# to every operator (1.1-2.3x measured on CPU-bound demos here); 1.2 leaves room for run-to-run noise.
PROFILER_OVERHEAD_WARN_RATIO = 1.2


def is_dataloader_span(name: str) -> bool:
    return ((name.startswith(DATALOADER_PREFIX) and name.endswith(DATALOADER_SUFFIX))
            or name.startswith(DATAPIPE_PREFIX))


def has_gpu_kernels(events: list[dict]) -> bool:
    """Whether a trace's events hold a GPU kernel (category "kernel"; "Kernel" in 2021 traces)."""
    return any(str(event.get("cat", "")).lower() == "kernel" for event in events)


def trace_files(run_dir: Path) -> list[Path]:
    """The trace files in a run directory, oldest first."""
    found = [p for p in Path(run_dir).iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES)]
    return sorted(found, key=lambda p: p.stat().st_mtime)


class TraceError(ValueError):
    """A file that is not a readable Kineto trace; the message names the file and the problem."""


def newest_trace(path: Path) -> Path:
    """`path` itself if it is a file, else the newest trace in the run directory `path`."""
    path = Path(path)
    if path.is_dir():
        found = trace_files(path)
        if not found:
            raise TraceError(f"{path}: no {' or '.join(TRACE_SUFFIXES)} file in this directory")
        return found[-1]
    if not path.exists():
        raise TraceError(f"{path}: no such file or directory")
    return path


def read_bytes(path: Path) -> bytes:
    """The file's JSON text, gunzipped if it is gzip. Raises TraceError."""
    try:
        raw = Path(path).read_bytes()
    except OSError as error:
        raise TraceError(f"{path}: cannot read ({error.strerror or error})") from None
    if not raw.strip():
        raise TraceError(f"{path}: empty file")
    if raw.startswith(GZIP_MAGIC):
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as error:
            raise TraceError(f"{path}: truncated or corrupt gzip ({error})") from None
    return raw


def parse_json(text: bytes):
    return orjson.loads(text) if orjson else json.loads(text)


def parse_trace(path: Path, raw: bytes) -> dict:
    """The top-level object, checked to hold a non-empty traceEvents list. Raises TraceError."""
    try:
        data = parse_json(raw)
    except ValueError as error:  # orjson.JSONDecodeError and json's are both ValueErrors
        raise TraceError(f"{path}: not JSON ({str(error).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise TraceError(f"{path}: top level is a JSON {type(data).__name__}, not an object with "
                         f"traceEvents (a Kineto trace)")
    events = data.get("traceEvents")
    if events is None:
        raise TraceError(f"{path}: no traceEvents (not a Kineto/Chrome trace)")
    if not isinstance(events, list):
        raise TraceError(f"{path}: traceEvents is a JSON {type(events).__name__}, not a list")
    if not events:
        raise TraceError(f"{path}: traceEvents is empty")
    return data


def load_trace(path: Path) -> dict:
    """The trace's top-level object, checked to hold a non-empty traceEvents list.
    Raises TraceError (one line: the file and the problem) for anything else."""
    return parse_trace(path, read_bytes(path))


# --- Reading a large trace a piece at a time. ----------------------------------------------------
# orjson first parses a whole document into its own tree, then builds the Python objects: on a
# 135 MB trace that peaks near 1.4 GB. Parsing the traceEvents array in pieces of about
# CHUNK_BYTES bounds that to one piece's worth, and the analyzer keeps only numpy columns of each.
CHUNK_BYTES = 4 * 1024 * 1024
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
EVENT_GAP = re.compile(rb"\}\s*,\s*\{")  # between two events: "}," then "{"
NOT_SPACE = re.compile(rb"\S")
ARRAY_END_TRIES = 64  # "]" characters tried, from the file's end, as the end of traceEvents


class SplitFailed(Exception):
    """A piece of traceEvents did not parse alone: the split point was not between two events
    (say "},{" inside a string). Read the trace whole instead (load_trace)."""


def event_pieces(path: Path, chunk_bytes: int | None = None):
    """(the top-level object without its events, an iterator over lists of events).

    The events come a piece at a time where the file splits cleanly between events (every
    trace torch.profiler or json.dumps writes); otherwise, and for bad input, it is the whole
    list in one piece, from load_trace (same errors). The iterator raises SplitFailed if a
    piece turns out not to parse: the caller then starts over with load_trace."""
    raw = read_bytes(path)
    plan = split_plan(raw, chunk_bytes or CHUNK_BYTES)
    if plan is None:
        data = parse_trace(path, raw)
        events = data.pop("traceEvents")
        return data, iter([events])
    top, ranges = plan
    return top, parse_pieces(raw, ranges)


def parse_pieces(raw: bytes, ranges: list[tuple[int, int]]):
    for start, end in ranges:
        try:
            events = parse_json(b"[" + raw[start:end] + b"]")
        except ValueError:
            raise SplitFailed from None
        yield events


def split_plan(raw: bytes, chunk_bytes: int) -> tuple[dict, list[tuple[int, int]]] | None:
    """Byte ranges of traceEvents pieces, each a run of whole events, and the rest of the
    document parsed; None when the file is not a plain {"traceEvents": [...]} object."""
    found = EVENTS_KEY.search(raw)
    if not found:
        return None
    start = found.end()
    head = raw[:start]
    end, top = None, None
    for _ in range(ARRAY_END_TRIES):  # the array's "]": the last one that leaves valid JSON
        end = raw.rfind(b"]", start, end)
        if end < 0:
            return None
        try:
            top = parse_json(head + raw[end:])
        except ValueError:
            continue
        break
    if (not isinstance(top, dict) or top.get("traceEvents") != []
            or not NOT_SPACE.search(raw, start, end)):
        return None  # not a trace, or an empty one: load_trace says what is wrong
    del top["traceEvents"]
    ranges, position = [], start
    while position < end:
        gap = EVENT_GAP.search(raw, min(position + chunk_bytes, end), end)
        if gap is None:
            ranges.append((position, end))
            break
        ranges.append((position, gap.start() + 1))
        position = gap.end() - 1
    return top, ranges


def peak_allocated_mb(events: list[dict], device_type: int) -> float | None:
    """Highest "Total Allocated" of the [memory] events for one device type, or None if the
    trace has none (recorded only with profile_memory=True)."""
    peak = None
    for event in events:
        if event.get("name") != "[memory]":
            continue
        args = event.get("args", {})
        if args.get("Device Type") == device_type and "Total Allocated" in args:
            allocated = args["Total Allocated"]
            peak = allocated if peak is None else max(peak, allocated)
    return None if peak is None else peak / BYTES_PER_MB


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse with the project's error style: bad flags give one line and exit code 2 (plain
    argparse prints the whole usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")
