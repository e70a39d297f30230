"""Rewrite a Kineto trace so that TensorBoard's PyTorch Profiler plugin reads it correctly.

The plugin (torch-tb-profiler 0.4.3, its only release, deprecated in 2023) decides what an event
is from its category ("cat"), in the vocabulary Kineto used before 2022. Current PyTorch writes
other names, and the plugin silently misreads them. This module renames the category of the few
events concerned, and changes nothing else:

- user_annotation -> cpu_op, for the DataLoader's spans only (enumerate(DataLoader)#...__next__,
  enumerate(DataPipe)#...). The plugin drops every user_annotation except ProfilerStep#N, and
  counts DataLoader time only from operator spans with these names: it read DataLoader 0 % and
  never gave its data-loading advice.
- cuda_runtime, cuda_driver -> Runtime (the 2021 name; the plugin knows no other). Without it
  Runtime reads 0 %, no kernel is tied to the operator that launched it, and so the "Kernel Time
  using Tensor Cores" row and the mixed-precision advice never appear.
- fwdbwd -> forward_backward: the only flow category the plugin links forward operators to
  their backward by.
- gpu_user_annotation -> gpu_profiler_step, for the GPU-stream copies of ProfilerStep#N only. The
  plugin takes every ProfilerStep#N it reads as a step: it counted each step twice, the GPU copy
  overlapping the next CPU step, and once it reads the runtime calls it fails on the run
  (ZeroDivisionError). gpu_profiler_step is a name the plugin does not know, so it skips them.

Every event is kept, in order, with its name, times, ids and args; only "cat" changes. Our other
regions (data, forward, backward, optimizer, Optimizer.step#...) stay user_annotation: the plugin
ignores them, as its authors chose, so its CPU Exec / Other split is what it computes for any
current trace. The file stays Chrome-trace JSON that Perfetto UI and chrome://tracing open (they
show "cat" as a label), and our analyzer (common/trace_columns.py) finds spans by name in either
vocabulary. The top-level key REWRITE_MARK_KEY says the file was rewritten and how many events
each rename touched. Running the rewrite again changes nothing and leaves the file untouched.

Usage: python -m common.tensorboard_compat IN [OUT]   (see --help)
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections import Counter
from pathlib import Path

try:  # orjson writes a 100 MB trace several times faster than json
    import orjson
except ImportError:  # an existing environment without it (PYTHON=... ./scripts/run_demos.sh)
    orjson = None

from common import trace

REWRITE_MARK_KEY = "tensorboardCompat"  # top-level key; camelCase like Kineto's "schemaVersion"
REWRITE_VERSION = 1  # bump when the mapping changes, so a reader can tell which one was applied
GZIP_LEVEL = 9  # what torch's tensorboard_trace_handler writes (gzip's default): same file size

# Renamed for every event of the category: current name -> the name the plugin reads.
RENAMED_CATEGORIES = {
    "cuda_runtime": "Runtime",
    "cuda_driver": "Runtime",
    "fwdbwd": "forward_backward",
}
DATA_LOADING_CATEGORY = "cpu_op"  # for the DataLoader's user_annotation spans
GPU_STEP_CATEGORY = "gpu_profiler_step"  # for GPU copies of ProfilerStep#N: unknown to the plugin


def new_category(event: dict) -> str | None:
    """The category the plugin needs for this event, or None to leave the event as it is."""
    category = event.get("cat")
    if category in RENAMED_CATEGORIES:
        return RENAMED_CATEGORIES[category]
    name = event.get("name")
    if not isinstance(name, str):
        return None
    if category == "user_annotation" and trace.is_dataloader_span(name):
        return DATA_LOADING_CATEGORY
    if category == "gpu_user_annotation" and name.startswith(trace.STEP_PREFIX):
        return GPU_STEP_CATEGORY
    return None


def rewrite_events(events: list) -> Counter:
    """Rename categories in place. Returns how many events each rename touched, keyed
    "old -> new"."""
    renamed: Counter = Counter()
    for event in events:
        if not isinstance(event, dict):
            continue
        category = new_category(event)
        if category is not None:
            renamed[f"{event['cat']} -> {category}"] += 1
            event["cat"] = category
    return renamed


def rewrite_trace(trace_json: dict) -> bool:
    """Rewrite a loaded trace in place and mark it. Returns whether anything changed."""
    renamed = rewrite_events(trace_json["traceEvents"])
    mark = trace_json.get(REWRITE_MARK_KEY)
    if isinstance(mark, dict) and mark.get("version") == REWRITE_VERSION and not renamed:
        return False
    counts = Counter(mark.get("renamed", {})) if isinstance(mark, dict) else Counter()
    counts.update(renamed)
    trace_json[REWRITE_MARK_KEY] = {
        "version": REWRITE_VERSION,
        "by": "python -m common.tensorboard_compat (pytorch-profiling-case-studies)",
        "why": "category names that torch-tb-profiler 0.4.3 reads; events and times unchanged",
        "renamed": dict(sorted(counts.items())),
    }
    return True


def read_trace(path: Path) -> tuple[dict, bool]:
    """The parsed trace and whether the file was gzip. Raises trace.TraceError (one line)."""
    try:
        with open(path, "rb") as file:
            was_gzip = file.read(len(trace.GZIP_MAGIC)) == trace.GZIP_MAGIC
    except OSError as error:
        raise trace.TraceError(f"{path}: cannot read ({error.strerror or error})") from None
    return trace.load_trace(path), was_gzip


def encode_trace(trace_json: dict, use_gzip: bool) -> bytes:
    data = None
    if orjson is not None:
        try:
            data = orjson.dumps(trace_json)
        except TypeError:  # orjson.JSONEncodeError: e.g. an integer wider than 64 bits
            pass
    if data is None:  # the same compact JSON from json, only slower
        data = json.dumps(trace_json, separators=(",", ":")).encode()
    return gzip.compress(data, compresslevel=GZIP_LEVEL) if use_gzip else data


def write_atomically(path: Path, data: bytes) -> None:
    """Write beside the target, then rename: TensorBoard (or a user) reading the folder never
    sees half a file. The temporary name does not end in .pt.trace.json, so TensorBoard skips it."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def rewrite_file(source: Path, destination: Path | None = None) -> bool:
    """Rewrite one trace file, gzip if and only if the source was. Without a destination the file
    is rewritten in place, and left untouched when there is nothing to change. Returns whether
    the written trace differs from the source."""
    source = Path(source)
    trace_json, was_gzip = read_trace(source)
    changed = rewrite_trace(trace_json)
    if destination is None or Path(destination).resolve() == source.resolve():
        if changed:
            write_atomically(source, encode_trace(trace_json, was_gzip))
        return changed
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(destination, encode_trace(trace_json, was_gzip))
    return changed


def traces_under(folder: Path) -> list[Path]:
    """Every trace file in a folder and its subfolders (a run directory, or all of traces/)."""
    return sorted(p for p in Path(folder).rglob("*")
                  if p.is_file() and p.name.endswith(trace.TRACE_SUFFIXES))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m common.tensorboard_compat",
        description=__doc__.split("\n\n")[0] + " (torch-tb-profiler 0.4.3 misreads the category "
        "names current PyTorch writes: DataLoader 0 %, Runtime 0 %, no Tensor Cores row).",
        epilog="Only the category of a few events changes; the table is in this module's "
               "docstring and in common/README.md, 'The trace rewrite for TensorBoard'. Running it again changes nothing. "
               "The harness applies it to every trace it writes.")
    parser.add_argument("source", metavar="IN", type=Path,
                        help="a trace file (.pt.trace.json or .pt.trace.json.gz) or a folder: "
                             "every trace under it is rewritten")
    parser.add_argument("destination", metavar="OUT", type=Path, nargs="?",
                        help="where to write (default: rewrite IN in place); a folder if IN is "
                             "one, keeping the layout below IN")
    return parser


def fail(message: str) -> int:
    """Bad input: one line on stderr and exit code 2, as for a bad flag."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    flags = build_parser().parse_args(argv)
    source, destination = flags.source, flags.destination
    if source.is_dir():
        if destination is not None and destination.exists() and not destination.is_dir():
            return fail(f"IN {source} is a folder, so OUT must be a folder too, not a file")
        sources = traces_under(source)
        if not sources:
            return fail(f"no trace files (*{trace.TRACE_SUFFIXES[0]}, *{trace.TRACE_SUFFIXES[1]}) "
                        f"under {source}")
        pairs = [(path, None if destination is None else destination / path.relative_to(source))
                 for path in sources]
    elif source.is_file():
        if destination is not None and destination.is_dir():
            destination = destination / source.name
        pairs = [(source, destination)]
    else:
        return fail(f"IN {source} does not exist")
    for path, target in pairs:
        try:
            changed = rewrite_file(path, target)
        except trace.TraceError as error:
            return fail(str(error))
        except OSError as error:
            return fail(f"cannot write {target or path}: {error.strerror or error}")
        if target is not None:
            print(f"{path} -> {target}{'' if changed else ' (copied: already rewritten)'}")
        else:
            print(f"{path}: {'rewritten' if changed else 'unchanged (already rewritten)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
