"""Reading Kineto traces (Chrome-trace JSON, plain or gzip). Imports no torch."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
BYTES_PER_MB = 1024 * 1024  # MiB, the unit torch.cuda.memory_summary uses
CPU_DEVICE_TYPE = 0  # "Device Type" of a [memory] event: 0 is the CPU, 1 is CUDA (c10::DeviceType)


def trace_files(run_dir: Path) -> list[Path]:
    """The trace files in a run directory, oldest first."""
    found = [p for p in Path(run_dir).iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES)]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def load_trace(path: Path) -> dict:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":  # the gzip magic number, whatever the file is called
        raw = gzip.decompress(raw)
    return json.loads(raw)


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
