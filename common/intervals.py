"""Interval arithmetic on sets of events (start and end arrays, µs): union by sort and sweep,
clipping, length, and how much of a range a union covers."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Spans:
    """Start and end times (µs, float) of a set of events."""
    start: np.ndarray
    end: np.ndarray

    @staticmethod
    def empty() -> "Spans":
        return Spans(np.empty(0), np.empty(0))

    @property
    def size(self) -> int:
        return int(self.start.size)


def merge(spans: Spans) -> Spans:
    """Union of possibly overlapping intervals as sorted, disjoint intervals (sort + sweep)."""
    if spans.size == 0:
        return Spans.empty()
    order = np.argsort(spans.start, kind="stable")
    start = spans.start[order]
    reach = np.maximum.accumulate(spans.end[order])  # furthest end so far
    first = np.flatnonzero(np.r_[True, start[1:] > reach[:-1]])  # an interval after a gap
    last = np.r_[first[1:] - 1, start.size - 1]
    return Spans(start[first], reach[last])


def clip(spans: Spans, low: float, high: float) -> Spans:
    start = np.maximum(spans.start, low)
    end = np.minimum(spans.end, high)
    keep = end > start
    return Spans(start[keep], end[keep])


def total(spans: Spans) -> float:
    return float((spans.end - spans.start).sum())


def union_in(spans: Spans, low: float, high: float) -> float:
    """Length of the union of `spans` inside [low, high]."""
    return total(clip(merge(spans), low, high))


def concat(*parts: Spans) -> Spans:
    return Spans(np.concatenate([p.start for p in parts]), np.concatenate([p.end for p in parts]))


def covered_length(merged: Spans, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each [start, end], how much of it the merged (sorted, disjoint) intervals cover:
    covered(end) - covered(start), from the running total of their lengths."""
    if merged.size == 0:
        return np.zeros(np.shape(start))
    running = np.r_[0.0, np.cumsum(merged.end - merged.start)]

    def covered_before(points: np.ndarray) -> np.ndarray:
        index = np.searchsorted(merged.start, points, side="right")  # intervals started by then
        last = np.maximum(index - 1, 0)
        partial = np.clip(points - merged.start[last], 0, merged.end[last] - merged.start[last])
        return running[last] + np.where(index > 0, partial, 0.0)

    return covered_before(np.asarray(end, float)) - covered_before(np.asarray(start, float))


def minus(a: Spans, b: Spans) -> Spans:
    """The union of `a` less what the union of `b` covers, as sorted, disjoint intervals."""
    a, b = merge(a), merge(b)
    if not a.size or not b.size:
        return a
    points = np.unique(np.r_[a.start, a.end, b.start, b.end])
    low, high = points[:-1], points[1:]
    middle = (low + high) / 2

    def inside(merged: Spans) -> np.ndarray:
        k = np.searchsorted(merged.start, middle, side="right") - 1
        return (k >= 0) & (middle < merged.end[np.maximum(k, 0)])
    keep = inside(a) & ~inside(b)
    return merge(Spans(low[keep], high[keep]))
