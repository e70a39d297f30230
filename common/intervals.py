"""Interval arithmetic on sets of events (start and end arrays, µs): union by sort and sweep,
clipping, length, and which interval holds a point."""
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


def covering(merged: Spans, points: np.ndarray) -> np.ndarray:
    """Index of the merged interval that holds each point, -1 where none does."""
    index = np.searchsorted(merged.start, points, side="right") - 1
    inside = index >= 0
    inside[inside] = points[inside] < merged.end[index[inside]]
    return np.where(inside, index, -1)


def concat(*parts: Spans) -> Spans:
    return Spans(np.concatenate([p.start for p in parts]), np.concatenate([p.end for p in parts]))
