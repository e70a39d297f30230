"""Reading Kineto traces (Chrome-trace JSON, plain or gzip). Imports no torch."""
from __future__ import annotations

import argparse
import gzip
import json
import re
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Union

try:  # msgspec decodes each event into a small typed object and skips every field the analyzer
    import msgspec  # does not read: 3.6x faster than orjson's dicts, a third of the memory (README)
except ImportError:  # pragma: no cover - a dependency; without it, orjson (or json): same results
    msgspec = None
try:  # orjson parses a 100 MB trace several times faster than json, into the same objects
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; json keeps a bare install working
    orjson = None
try:  # ISA-L's inflate gunzips a trace about twice as fast as zlib, the same bytes (README)
    from isal import isal_zlib as INFLATE
except ImportError:  # pragma: no cover - a dependency; zlib where it is absent
    INFLATE = zlib

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
BYTES_PER_MB = 1e6  # MB are decimal in every output (torch.cuda.memory_summary prints MiB)
MB_PER_GB = 1000.0  # and GB (--memory-budget-gb), as MB are
CPU_DEVICE_TYPE = 0  # "Device Type" of a [memory] event: 0 is the CPU, 1 is CUDA (c10::DeviceType)
GZIP_MAGIC = b"\x1f\x8b"  # a gzip file's first two bytes, whatever the file is called
SUMMARY_FILE = "summary.json"  # what a demo run writes beside its trace (common/profiling.py)
# What a run over its --memory-budget-gb writes in place of a trace and summary: the budget, and
# what ran out of memory (common/profiling.py); the memory ladder's table reads it.
OUT_OF_MEMORY_FILE = "out_of_memory.json"
STEP_PREFIX = "ProfilerStep#"  # torch.profiler's step marker: record_function("ProfilerStep#N")
# The spans PyTorch's DataLoader and DataPipes open around fetching a batch, as the TensorBoard
# plugin recognises them: enumerate(DataLoader)#<iterator>.__next__, and enumerate(DataPipe)#...
DATALOADER_PREFIX = "enumerate(DataLoader)#"
DATALOADER_SUFFIX = ".__next__"
DATAPIPE_PREFIX = "enumerate(DataPipe)#"
# summary.json's profiler_overhead_ratio (profiled step p50 / timed step p50) above which the
# recorded steps no longer stand for the timed ones: record_shapes and profile_memory add CPU time
# to every operator (1.1-2.3x measured on CPU-bound demos here); 1.2 leaves room for run-to-run noise.
# Above it, recorded.py says how much the GPU's busy time a recorded step explains (gpu_busy_ratio).
PROFILER_OVERHEAD_WARN_RATIO = 1.2
# Points between the timed steps' data wait (the harness's clock around each fetch, a share of the
# wall time) and the recorded steps' DataLoader share (the trace's, a share of the window): half
# the dataloader rule's threshold (verdicts.DATALOADER_SHARE_MIN_PCT, 20 %; a test holds the two
# together), a gap that can carry a run across the rule. Above it recorded.py warns, and the
# harness records a round of a loader's workers where a few timed steps in a row stand more off
# the timed wait (profiling.loader_round_steps). The profiler's cost lengthens a recorded step and so thins its
# share of waiting a little: 7.2 points on the H100 reference's rung 0 of the ladder (70.1 %
# timed, 62.9 % recorded), the widest gap of its runs but one.
DATA_WAIT_GAP_POINTS = 10.0


# The DataLoader's iterator when its batches come from worker processes (num_workers > 0), as
# torch names it in the span: enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__;
# without workers it is _SingleProcessDataLoaderIter.
MULTIPROCESS_LOADER_ITERATOR = "_MultiProcessingDataLoaderIter"


def is_dataloader_span(name: str) -> bool:
    return dataloader_iterator(name) is not None or name.startswith(DATAPIPE_PREFIX)


def dataloader_iterator(name: str) -> str | None:
    """The iterator's class a DataLoader span names ("_MultiProcessingDataLoaderIter"); None for
    any other span, a DataPipe's too."""
    if name.startswith(DATALOADER_PREFIX) and name.endswith(DATALOADER_SUFFIX):
        return name[len(DATALOADER_PREFIX):-len(DATALOADER_SUFFIX)]
    return None


def trace_files(run_dir: Path) -> list[Path]:
    """The trace files in a run directory, oldest first."""
    found = [p for p in Path(run_dir).iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES)]
    return sorted(found, key=lambda p: p.stat().st_mtime)


class TraceError(ValueError):
    """A file that is not a readable Kineto trace; the message names the file and the problem."""


def missing_run_hint(path: Path) -> str:
    """For a path under traces/<pair>/ that does not exist (a demo not run yet): the command that
    makes it and the committed reference runs of the same pair (traces/reference/<gpu>/<pair>/
    ...), as "; ..." to follow an error; "" for any other path."""
    parts = Path(path).parts
    if "traces" not in parts:
        return ""
    at = parts.index("traces")
    root, rest = Path(*parts[:at]) if at else Path(), parts[at + 1:]
    if not rest or rest[0] == "reference":
        return ""
    pair, below = rest[0], rest[1:]
    hint = (f"; ./scripts/run_demos.sh {pair} makes it"
            if (root / "demos" / pair / "bad.py").is_file() else "")
    references = sorted(p.joinpath(*below) for p in (root / "traces" / "reference").glob(
        f"*/{pair}") if p.joinpath(*below).exists())
    if references:
        hint += ("; a committed run of the same pair: "
                 + ", ".join(str(p) for p in references))
    return hint


def newest_trace(path: Path) -> Path:
    """`path` itself if it is a file, else the newest trace in the run directory `path`."""
    path = Path(path)
    if path.is_dir():
        found = trace_files(path)
        if not found:
            deeper = sorted(p for suffix in TRACE_SUFFIXES for p in path.rglob(f"*{suffix}"))
            raise TraceError(
                f"{path}: no {' or '.join(TRACE_SUFFIXES)} file in this directory"
                + (f"; its subfolders hold {len(deeper)}: pass one of those folders or files, "
                   f"e.g. {deeper[0].parent}" if deeper else ""))
        return found[-1]
    if not path.exists():
        raise TraceError(f"{path}: no such file or directory{missing_run_hint(path)}")
    return path


ZIP_MAGIC = b"PK\x03\x04"  # a zip archive's first local file header
TAR_MAGIC_AT, TAR_MAGIC = 257, b"ustar"  # POSIX tar: the magic field of the first header


def refuse_archive(path: Path, data: bytes, packed: str = "") -> None:
    """A zip or tar of traces is not a trace: say what it is and what to pass instead."""
    kind = ("a zip archive" if data.startswith(ZIP_MAGIC) else
            "a tar archive" if data[TAR_MAGIC_AT:TAR_MAGIC_AT + len(TAR_MAGIC)] == TAR_MAGIC
            else None)
    if kind:
        raise TraceError(f"{path}: {kind}{packed}, not a trace: unpack it and pass one "
                         f"{' or '.join(TRACE_SUFFIXES)} file from it, or the folder it unpacks to")


def read_bytes(path: Path) -> bytes:
    """The file's JSON text, gunzipped if it is gzip. Raises TraceError, which says what the
    file is where it is no trace (an archive, a gzip inside a gzip, an empty gzip, a folder)."""
    if Path(path).is_dir():
        raise TraceError(f"{path}: a folder, not a trace file: pass one {TRACE_SUFFIXES[0]}(.gz) "
                         f"file in it")
    try:
        raw = Path(path).read_bytes()
    except OSError as error:
        raise TraceError(f"{path}: cannot read ({error.strerror or error})") from None
    if not raw.strip():
        raise TraceError(f"{path}: empty file")
    refuse_archive(path, raw)
    if not raw.startswith(GZIP_MAGIC):
        return raw
    text = gunzip(path, raw)
    if not text.strip():
        raise TraceError(f"{path}: an empty gzip (nothing inside it): the trace was never "
                         f"written into it; record it again")
    if text.startswith(GZIP_MAGIC):
        raise TraceError(f"{path}: a gzip inside a gzip (compressed twice): gunzip it once "
                         f"(gunzip -c FILE > trace{TRACE_SUFFIXES[1]}) and pass that")
    refuse_archive(path, text, packed=", gzipped")
    return text


GZIP_WBITS = 31  # zlib's code for "a gzip header and trailer around the deflate stream"
DEFLATE_RATIO_MAX = 1032  # deflate's best compression: a trailer claiming more is not a size


def gunzip(path: Path, packed: bytes) -> bytes:
    """The text of a gzip file, into one buffer of the size its trailer states (ISIZE, the length
    mod 2**32): gzip.decompress grows its buffer and joins the parts, twice the text at its peak
    (350 MB against 187 MB for a 170 MB trace here). Raises TraceError."""
    size = int.from_bytes(packed[-4:], "little")
    try:
        if 0 < size <= len(packed) * DEFLATE_RATIO_MAX:
            text = INFLATE.decompress(packed, GZIP_WBITS, size)
            # zlib reads one gzip member; a file of several (cat a.gz b.gz) ends with the last
            # member's size, which the first one's length seldom matches: gzip reads them all.
            if len(text) % 2**32 == size:
                return text
        return gzip.decompress(packed)
    except (EOFError, OSError, zlib.error, INFLATE.error) as error:
        raise TraceError(f"{path}: truncated or corrupt gzip ({error})") from None


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
    """The trace's top-level object, checked to hold a non-empty traceEvents list, every event a
    dict with all its fields. Raises TraceError (one line: the file and the problem) for anything
    else. The analyzer reads less, faster: event_pieces."""
    return parse_trace(path, read_bytes(path))


# --- What the analyzer reads of each event. ------------------------------------------------------
# (attribute, JSON key, type, default). Every other field ("Call stack", "Input type", a kernel's
# grid, block and occupancy, ...) is skipped by msgspec's decoder: no Python object is made for it.
# A field that is absent, or null where null is allowed, reads as its default. Fields the
# analyzer turns into numbers are typed; the others are Any (ROCm traces write "stream" as a
# string, say), so an odd value there never sends a trace to the slower plain reader.
ARG_FIELDS = (  # of complete events ("X")
    ("correlation", "correlation", int, -1),  # CUPTI's id from a launch to its kernel or copy
    ("external_id", "External id", Any, None),  # runtime call or kernel -> its cpu_op
    # Operators' input shapes (record_shapes=True): left as its JSON text (msgspec.Raw) by the
    # typed reader, 20 % faster on a trace with shapes; decoded() makes it a list where needed.
    ("input_dims", "Input Dims", msgspec.Raw if msgspec else Any, None),
    ("device", "device", Any, None),  # GPU events: where they ran
    ("stream", "stream", Any, None),
    ("copy_bytes", "bytes", Any, None),  # GPU copies: their size
    ("call_from", "CallFrom", Any, None),  # python_function (with_stack): the caller's file:line
)
# Of instant events ("i"): the [memory] events of profile_memory=True, one per allocation (Bytes
# > 0) or free (Bytes < 0) of the allocator, with its totals after it (Total Reserved: the CUDA
# caching allocator's reserved bytes, 0 on a CPU). A struct of their own: the spans' args decode
# none of these fields, and these decode none of the spans'.
MEMORY_ARG_FIELDS = (
    ("total_allocated", "Total Allocated", int | float | None, None),
    ("total_reserved", "Total Reserved", int | float | None, None),
    ("device_type", "Device Type", int, -1),  # c10::DeviceType: 0 CPU, 1 CUDA, 6 HIP
    ("device_id", "Device Id", int, -1),  # which GPU (-1 on a CPU)
    ("bytes", "Bytes", int | float | None, None),
    ("addr", "Addr", int | None, None),  # the block's address: an allocation and its free share it
)
EVENT_FIELDS = (  # and "ph", the phase: a class attribute of each typed event (PHASE_FIELDS)
    ("cat", "cat", str | None, None),
    ("name", "name", str, ""),
    ("ts", "ts", float | None, None),  # µs; integers are taken as floats, as numpy takes them
    ("dur", "dur", float | None, None),
    ("pid", "pid", Any, None),
    ("tid", "tid", Any, None),
    ("id", "id", Any, None),  # flow events ("s", "f") pair up by it
    ("args", "args", None, None),  # ARG_FIELDS ("X") or MEMORY_ARG_FIELDS ("i"); an absent or
)  # null args reads as all defaults
# Which fields each phase of event gets (Chrome's Trace Event Format). Every decoded field costs
# time, in the decoder and again when the event is freed: decoding and freeing a 135 MB trace took
# 0.52 s with every field on every phase, 0.41 s with these. Add a field where code reads it.
PHASE_FIELDS = {
    "X": tuple(attr for attr, *_ in EVENT_FIELDS),  # complete events: spans, every field above
    "i": ("name", "ts", "tid", "args"),  # instant events: [memory] (MEMORY_ARG_FIELDS)
}
PHASE_ARGS = {"i": MEMORY_ARG_FIELDS}  # the args of a phase not named here: ARG_FIELDS
# The other phases (flows "s"/"f": a third of a Kineto trace's events, metadata "M", ...) are
# decoded with no field (their "id", say, cost 0.07 s more in 135 MB): only their "ph" is known.
OTHER_PHASES = ("B", "E", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V",
                "v", "R", "c", "(", ")")


def typed_decoders():
    """msgspec decoders: of a list of events (one Struct per phase, tagged by "ph", so msgspec
    picks the Struct from the event; a phase outside the format is a ValidationError), and of
    the top-level object (every value kept as its raw text: checks the JSON, makes no objects)."""
    def event_fields(phase: str) -> list:
        arg_fields = PHASE_ARGS.get(phase, ARG_FIELDS)
        args_type = msgspec.defstruct(f"Args{ord(phase)}", [
            (attr, kind, msgspec.field(name=key, default=default))
            for attr, key, kind, default in arg_fields], gc=False, frozen=True)
        no_args = args_type()
        fields = {attr: (attr, args_type if attr == "args" else kind,
                         msgspec.field(name=key, default=no_args if attr == "args" else default))
                  for attr, key, kind, default in EVENT_FIELDS}
        return [fields[attr] for attr in PHASE_FIELDS.get(phase, ())]

    # gc=False: the collector need not track millions of events that hold no cycles.
    kinds = tuple(msgspec.defstruct(f"Event{ord(phase)}", event_fields(phase),
                                    namespace={"ph": phase}, tag_field="ph", tag=phase, gc=False)
                  for phase in (*PHASE_FIELDS, *OTHER_PHASES))
    return (msgspec.json.Decoder(list[Union[kinds]]),
            msgspec.json.Decoder(dict[str, msgspec.Raw]))


EVENTS_DECODER, TOP_DECODER = typed_decoders() if msgspec else (None, None)


def decoded(value):
    """A field left as JSON text by the typed reader (msgspec.Raw), as Python objects."""
    return msgspec.json.decode(value) if msgspec and isinstance(value, msgspec.Raw) else value


PLAIN_ARG_FIELDS = ARG_FIELDS + MEMORY_ARG_FIELDS  # the plain reader gives every event both
NO_PLAIN_ARGS = SimpleNamespace(**{attr: default for attr, _, _, default in PLAIN_ARG_FIELDS})


def plain_event(event: dict) -> SimpleNamespace:
    """An event parsed as a dict, with the typed event's attributes (absent ones: the default)."""
    fields = {attr: event.get(key, default) for attr, key, _, default in EVENT_FIELDS}
    args = fields["args"]
    fields["args"] = (SimpleNamespace(**{attr: args.get(key, default)
                                         for attr, key, _, default in PLAIN_ARG_FIELDS})
                      if isinstance(args, dict) else NO_PLAIN_ARGS)
    return SimpleNamespace(ph=event.get("ph"), **fields)


# --- Reading traceEvents a piece at a time, as the file streams in. -------------------------------
# The typed reader reads the file once, in chunks (gzip inflated as it comes), and decodes
# traceEvents in pieces of about CHUNK_BYTES cut between two events: neither the whole text nor
# every event exists at once; the analyzer keeps numpy columns of each piece. Keys may come before
# traceEvents (read first) or after it (read with the last piece), as real Kineto traces have them
# ("traceName", "displayTimeUnit", "baseTimeNanoseconds", ...). Inflating in a second thread did
# not overlap the decoding (zlib takes the GIL back for every block of output): no gain, so no
# thread.
CHUNK_BYTES = 2 * 1024 * 1024
GZIP_READ_BYTES = 1024 * 1024  # compressed bytes read at a time
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
EVENT_GAP = re.compile(rb"\}\s*,\s*\{")  # between two events: "}," then "{"
KEY_SEARCH_OVERLAP = 1024  # bytes searched again for EVENTS_KEY when a chunk is added
FAILED_CUTS_MAX = 8  # cuts that fell inside strings before the reader stops cutting a piece
EVENT_BYTES = 200  # a Kineto event's JSON text, about: the plain reader's pieces are events


class ReadAsDicts(Exception):
    """The typed reader cannot take this file: an event of a shape msgspec's Structs do not take
    (a field of another type, say a string "dur", or a phase outside the Trace Event Format), or
    a file that is not a trace. plain_pieces reads it as dicts, or says what is wrong with it."""


def event_pieces(path: Path, chunk_bytes: int | None = None):
    """(the top-level object without traceEvents, an iterator over lists of events). Each event
    has ph and the attributes of EVENT_FIELDS, its args those of ARG_FIELDS (an instant event's:
    MEMORY_ARG_FIELDS; the plain reader's: both). With msgspec the
    file streams in (typed_pieces); keys after traceEvents join the top-level object when the
    iterator ends, and it raises ReadAsDicts where msgspec cannot take the file: read it with
    plain_pieces(path, read_bytes(path)) then. Without msgspec: plain_pieces, which raises
    TraceError (load_trace's messages) for what is not a trace."""
    if msgspec is None:
        return plain_pieces(path, read_bytes(path), chunk_bytes)
    return typed_pieces(path, chunk_bytes or CHUNK_BYTES)


def text_chunks(path: Path, chunk_bytes: int):
    """The file's text in chunks of up to chunk_bytes, inflated as it is read if it is gzip."""
    try:
        handle = open(path, "rb")
    except OSError:
        raise ReadAsDicts("cannot open") from None
    with handle:
        data = handle.read(GZIP_READ_BYTES)
        if not data.startswith(GZIP_MAGIC):
            while data:
                yield data
                data = handle.read(chunk_bytes)
            return
        try:
            inflater = INFLATE.decompressobj(GZIP_WBITS)
            while True:
                if not data:
                    data = handle.read(GZIP_READ_BYTES)
                    if not data:
                        break
                if inflater.eof:  # what follows a gzip member: another member, or zero padding
                    data = data.lstrip(b"\0")
                    if not data:
                        continue
                    inflater = INFLATE.decompressobj(GZIP_WBITS)
                text = inflater.decompress(data, chunk_bytes)
                data = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
                if text:
                    yield text
        except (zlib.error, INFLATE.error) as error:
            raise ReadAsDicts(f"gzip: {error}") from None
        if not inflater.eof:
            raise ReadAsDicts("gzip: the file ends inside the compressed stream")


def typed_pieces(path: Path, chunk_bytes: int):
    """event_pieces with msgspec. The top-level object's keys before traceEvents are read before
    this returns; raises ReadAsDicts where there is no top-level traceEvents array."""
    chunks = text_chunks(path, chunk_bytes)
    text, search_from = b"", 0
    while True:  # the text up to the "[" of traceEvents, where that is a top-level key
        found = EVENTS_KEY.search(text, search_from)
        if found is None:
            chunk = next(chunks, None)
            if chunk is None:
                raise ReadAsDicts("no top-level traceEvents")
            search_from = max(search_from, len(text) - KEY_SEARCH_OVERLAP)
            text += chunk
            continue
        try:  # the keys before it, and "traceEvents": [] : valid only if it is a top-level key
            head = TOP_DECODER.decode(text[:found.end()] + b"]}")
        except msgspec.DecodeError:  # inside a string, or a nested object: look further
            search_from = found.start() + 1
            continue
        break
    del head["traceEvents"]
    top = {key: msgspec.json.decode(value) for key, value in head.items()}
    return top, typed_piece_iter(chunks, text[found.end():], top, chunk_bytes)


def typed_piece_iter(chunks, text: bytes, top: dict, chunk_bytes: int):
    """Yields the events a piece at a time; `text` starts after traceEvents' "[". The last
    piece is decoded with what follows the array, whose keys go into `top`. The current piece
    starts at `pos` in `text`: the text is copied only to add a chunk (with what is left of it)
    and once per piece to decode, each copy made by one join of views (slicing bytes copies)."""
    try:
        ended, count, pos = False, 0, 0

        def add_chunk() -> None:
            nonlocal text, pos, ended
            chunk = next(chunks, None)
            ended = chunk is None
            if chunk:
                text, pos = b"".join((memoryview(text)[pos:], chunk)), 0

        while True:
            while not ended and len(text) - pos < 2 * chunk_bytes:
                add_chunk()
            events, cut_from, failed = None, chunk_bytes, 0  # cut_from: from the piece's start
            while failed < FAILED_CUTS_MAX:
                gap = EVENT_GAP.search(text, pos + min(cut_from, len(text) - pos))
                if gap is None:
                    if ended:
                        break
                    add_chunk()
                    continue
                try:
                    events = EVENTS_DECODER.decode(
                        b"".join((b"[", memoryview(text)[pos:gap.start() + 1], b"]")))
                except msgspec.ValidationError as error:  # a subclass of DecodeError: first
                    raise ReadAsDicts(str(error)) from None
                except msgspec.DecodeError:
                    # The cut fell inside a string ("},{" in a name) or after the array: such
                    # a piece never parses (an unclosed string or bracket, or text after "]").
                    cut_from, failed = gap.end() - pos, failed + 1
                    continue
                break
            if events is None:  # the rest of the file is the last piece (and what follows it)
                yield last_piece(b"".join([memoryview(text)[pos:], *chunks]), top, count)
                return
            count += len(events)
            pos = gap.end() - 1  # the next event's "{"
            yield events
    finally:  # the file is closed now, also when the reader stops early
        chunks.close()


def last_piece(text: bytes, top: dict, count: int) -> list:
    """The events in `text` (the end of traceEvents and what follows it), its keys put in top."""
    try:
        rest = TOP_DECODER.decode(b'{"traceEvents":[' + text)
        events = EVENTS_DECODER.decode(rest.pop("traceEvents"))
    except msgspec.DecodeError as error:  # ValidationError too
        raise ReadAsDicts(str(error)) from None
    if not count + len(events) or top.keys() & rest.keys():  # none, or a key written twice
        raise ReadAsDicts("no events, or a repeated key")
    top.update((key, msgspec.json.decode(value)) for key, value in rest.items())
    return events


def plain_pieces(path: Path, raw: bytes, chunk_bytes: int | None = None):
    """event_pieces where msgspec is absent or refused an event: the whole text parsed into dicts
    (orjson or json), made into plain events a piece (about chunk_bytes of text) at a time."""
    data = parse_trace(path, raw)
    size = max(1, (chunk_bytes or CHUNK_BYTES) // EVENT_BYTES)
    return data, plain_piece_iter(data.pop("traceEvents"), size)


def plain_piece_iter(events: list, size: int):
    while events:
        piece = events[:size]
        del events[:size]  # the dicts go as their plain copies come
        yield [plain_event(event) for event in piece]


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
