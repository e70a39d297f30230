"""Impossible events: what a profiler cannot have recorded, counted by kind and kept out of the
numbers. One pass over the columns the reader built (trace_columns.finish calls it), before any
number is read off them:

- negative_duration   an event that ends before it starts (a step of "-0.1 ms");
- outside_recording   an event that starts more than a day from the median start of the trace's
                      events (of an evenly strided sample): not from this capture (ts 0 among
                      epoch timestamps of ~1.7e15 µs);
- overlong_duration   an event that lasts more than a day (a dur of 1e300);
- duplicate_step      a second ProfilerStep#N with a number already seen (the first is kept);
- overlapping_step    a ProfilerStep#N that starts before the step before it ends.

A day, because torch.profiler records seconds to minutes of a run: no capture lasts a day, and
timestamps a day apart are not of one capture. Where timestamps start at 0 (traces written
relative to the capture), ts 0 is inside the recording and stays. Imports no torch."""
from __future__ import annotations

import numpy as np

US_PER_DAY = 86_400e6
# The longest plausible capture, and the farthest a start may lie from the rest of the trace.
MAX_RECORDING_US = US_PER_DAY
# The columns the reader keeps, by the prefix of their keys in trace_columns.Pieces.arrays; each
# group's arrays are parallel (one value per event). "memory" ([memory] instants) has a ts only.
SPAN_GROUPS = ("kernel", "memcpy", "memset", "runtime", "cpu_op", "host_sync", "gpu_optimizer",
               "other", "cpu_named", "python")
# "other": CPU-side spans of no operator category but the named ones, and cuda_sync events;
# "cpu_named": steps and DataLoader spans written as operators, which the named spans hold too:
# filtered, not counted twice.
# "python": Python frames, which "other" holds too.
UNCOUNTED_GROUPS = ("cpu_named", "python")
# The groups that hold every span the reader widened its extents with, but for the named spans:
# all but the GPU's optimizer copies, which never did. The extents are taken again from them and
# the named spans, filtered, when something was left out.
EXTENT_GROUPS = tuple(group for group in SPAN_GROUPS if group != "gpu_optimizer")
INSTANT_GROUPS = ("memory",)
KIND_WORDS = {  # how a warning names each kind (count first)
    "negative_duration": "with a negative duration",
    "outside_recording": "starting more than a day from the rest of the trace",
    "overlong_duration": "lasting more than a day",
    "duplicate_step": "repeating a ProfilerStep#N already seen",
    "overlapping_step": "starting before the ProfilerStep#N before them ended",
}


def possible_duration(spans) -> np.ndarray:
    """Per span: a duration that is neither negative nor over MAX_RECORDING_US (the checks that
    need no other event)."""
    duration = spans.end - spans.start
    return (duration >= 0) & (duration <= MAX_RECORDING_US)


class NothingLeft(ValueError):
    """Left out, the impossible events took every timed event, or every ProfilerStep#N."""


def joined(arrays: dict, key: str) -> np.ndarray | None:
    """The group column `key`, its pieces joined into one array (stored back as one piece)."""
    parts = arrays.get(key)
    if not parts:
        return None
    if len(parts) > 1:
        arrays[key] = [np.concatenate(parts)]
    return arrays[key][0]


def span_verdict(start: np.ndarray, end: np.ndarray, median_start: float) -> dict[str, np.ndarray]:
    """Masks of the impossible events by kind, each event under the first kind that holds."""
    negative = end < start
    outside = ~negative & ~(np.abs(start - median_start) <= MAX_RECORDING_US)  # NaN-safe
    overlong = ~negative & ~outside & ~(end - start <= MAX_RECORDING_US)
    return {"negative_duration": negative, "outside_recording": outside,
            "overlong_duration": overlong}


ANCHOR_SAMPLE = 65_536  # starts the median is taken of, evenly strided through the events


def anchor(columns: list[np.ndarray]) -> float | None:
    """The median start of the trace's events, from an evenly strided sample (a median of a
    1.5M-event trace would cost more than the rest of the pass; a day's margin needs no more
    than the bulk of the trace); None without a finite start."""
    total = sum(column.size for column in columns)
    stride = max(1, total // ANCHOR_SAMPLE)
    sample = np.concatenate([column[::stride] for column in columns] + [np.empty(0)])
    sample = sample[np.isfinite(sample)]
    return float(np.median(sample)) if sample.size else None


def drop_impossible(arrays: dict, named_spans: list, timed_points: list[list]) -> dict[str, int]:
    """Remove impossible events from the reader's columns (arrays: key -> list of pieces), its
    named CPU spans ((name, start, end, pid) tuples) and its timed points (tuples with the ts
    first: layer batches, softmaxes, collective calls), in place. Returns the count of each kind
    removed. A sound trace is only read (no list is rebuilt): the pass costs about 0.01 s on
    the 135 MiB benchmark trace."""
    starts = [joined(arrays, f"{group}_start") for group in SPAN_GROUPS]
    points = [joined(arrays, f"{group}_ts") for group in INSTANT_GROUPS]
    named_start = np.fromiter((span[1] for span in named_spans), np.float64, len(named_spans))
    found = dict.fromkeys(KIND_WORDS, 0)
    median_start = anchor([s for s in starts + points if s is not None] + [named_start])
    if median_start is None:
        return found
    for group, start in zip(SPAN_GROUPS, starts):
        if start is None:
            continue
        masks = span_verdict(start, joined(arrays, f"{group}_end"), median_start)
        keep_only(arrays, group, ~np.logical_or.reduce(list(masks.values())),
                  dict.fromkeys(KIND_WORDS, 0) if group in UNCOUNTED_GROUPS else found, masks)
    for group, ts in zip(INSTANT_GROUPS, points):
        if ts is not None:
            outside = ~(np.abs(ts - median_start) <= MAX_RECORDING_US)
            keep_only(arrays, group, ~outside, found, {"outside_recording": outside})
    if named_spans:
        named_end = np.fromiter((span[2] for span in named_spans), np.float64, len(named_spans))
        masks = span_verdict(named_start, named_end, median_start)
        bad = np.logical_or.reduce(list(masks.values()))
        for kind, mask in masks.items():
            found[kind] += int(mask.sum())
        if bad.any():
            named_spans[:] = [span for span, drop in zip(named_spans, bad.tolist()) if not drop]
    for kept in timed_points:  # layer batches, softmaxes, collective calls: their ts first
        ts = np.fromiter((point[0] for point in kept), np.float64, len(kept))
        if not (np.abs(ts - median_start) <= MAX_RECORDING_US).all():
            kept[:] = [point for point in kept
                       if abs(point[0] - median_start) <= MAX_RECORDING_US]
    return found


def keep_only(arrays: dict, group: str, keep: np.ndarray, found: dict, masks: dict) -> None:
    for kind, mask in masks.items():
        found[kind] += int(mask.sum())
    if keep.all():
        return
    for key in [key for key in arrays if key.startswith(f"{group}_")]:
        column = joined(arrays, key)
        assert column.size == keep.size, f"{key}: not parallel to {group}_start"
        arrays[key] = [column[keep]]


def possible_steps(steps: list[tuple[str, float, float]], found: dict) -> list:
    """The ProfilerStep#N spans (name, start, end) less repeats of a number and steps that start
    inside the one before; counts each into `found`."""
    seen, kept = set(), []
    for name, start, end in sorted(steps, key=lambda step: step[1]):
        if name in seen:
            found["duplicate_step"] += 1
        elif kept and start < kept[-1][2]:
            found["overlapping_step"] += 1
        else:
            seen.add(name)
            kept.append((name, start, end))
    return kept


def warning_line(found: dict) -> str | None:
    """One line naming each kind found with its count; None when the trace has none."""
    parts = [f"{count} event{'s' if count != 1 else ''} {KIND_WORDS[kind]}"
             for kind, count in found.items() if count]
    if not parts:
        return None
    return ("impossible events left out of every number: " + "; ".join(parts)
            + " (the profiler wrote them; see README.md, 'Impossible events')")
