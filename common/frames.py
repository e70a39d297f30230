"""Python frames in a trace (torch.profiler with_stack=True, the harness's --with-stack): the hot
frames by self time, the user's own marked, and the syncs and host-device copies each line of the
user's code issued. Imports no torch.

A python_function event is one call: "file(line): function" for Python code (the line where the
function starts), or a built-in's name ("<built-in method tolist of Tensor object at 0x...>"),
with its caller's "file:line" in args.CallFrom. Frames and operators nest by time on their
thread; a frame's self time is its time less the frames and operators it holds, so a Python loop
over .tolist() values keeps its own time and a frame that only calls torch does not.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import numpy as np

from common.intervals import Spans, concat
from common.syncs import innermost_holders
from common.trace_columns import TraceColumns
from common.trace_steps import US_PER_MS, per_name, self_time_us

HOT_FRAMES_SHOWN = 10  # the top frames by self time, as cProfile's listings show
USER_LINES_SHOWN = 3  # lines of the user's code named per kind (syncs, copies)
FRAME_NAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<function>.+)$")
OBJECT_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>$")  # built-ins name their object's address
BINDING_OBJECT = re.compile(r" of pybind11_builtins\.\S+ object>$")  # torch's C++ bindings
# Code the user rarely means when looking for their own hot line: files of these top-level
# packages (their paths are written relative to site-packages: "torch/nn/modules/module.py"),
# the standard library's (sys.stdlib_module_names, and the interpreter's frozen modules), and
# anything under a site-packages or dist-packages folder. Everything else is the user's.
LIBRARY_PACKAGES = frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "functorch", "triton", "numpy", "scipy",
    "transformers", "accelerate", "tokenizers", "datasets", "PIL", "typing_extensions",
    "_pytest", "pytest", "pluggy"})
INSTALLED_MARKERS = ("site-packages/", "dist-packages/")


def is_user_file(path: str) -> bool:
    """Whether a frame's file is the user's code (not a library's, not the standard library's)."""
    path = path.replace("\\", "/")
    if path.startswith("<frozen") or any(marker in path for marker in INSTALLED_MARKERS):
        return False
    top = path.lstrip("./").split("/", 1)[0]
    top = top[:-3] if top.endswith(".py") else top
    return top not in LIBRARY_PACKAGES and top not in sys.stdlib_module_names


def frame_label(name: str, call_from: str) -> tuple[str, bool]:
    """("file:line function", whether it is the user's) for a Python frame; for a built-in,
    ("<built-in ...> called at file:line", whether its caller is the user's), without the
    object's address (a new one per object)."""
    found = FRAME_NAME.match(name)
    if found:
        return (f"{found['file']}:{found['line']} {found['function']}",
                is_user_file(found["file"]))
    name = BINDING_OBJECT.sub(">", OBJECT_ADDRESS.sub(">", name))
    caller = call_from.rsplit(":", 1)[0] if call_from else ""
    return (f"{name} called at {call_from}" if call_from else name,
            bool(caller) and is_user_file(caller))


@dataclass
class FrameTimes:
    """Every frame label in the host window -> (self ms per step, calls per step); which labels
    are the user's; and the frames of the user's own Python code (indices into columns.python),
    with their labels: where syncs and copies are attributed."""
    times: dict[str, tuple[float, float]]
    user: dict[str, bool]
    user_code: np.ndarray
    user_code_labels: np.ndarray


def frame_times(columns: TraceColumns, host_window: tuple[float, float],
                n_steps: int) -> FrameTimes:
    """Self time per frame label (frame_label) in the host window. Labelled once per distinct
    (name, caller) pair: a trace holds 100 000s of frames of a few hundred pairs (names and
    callers are interned strings, so their ids stand for them)."""
    frames = columns.python
    low, high = host_window
    inside = np.flatnonzero((frames.start >= low) & (frames.start < high))
    both = concat(Spans(frames.start[inside], frames.end[inside]), columns.cpu_ops)
    threads = np.r_[columns.python_thread[inside], columns.cpu_op_thread]
    self_us = self_time_us(both, threads)[:inside.size]
    names, callers = columns.python_names[inside], columns.python_call_from[inside]
    pair_ids = np.stack([np.fromiter(map(id, names), np.int64, names.size),
                         np.fromiter(map(id, callers), np.int64, callers.size)], axis=1)
    _, first, codes = np.unique(pair_ids.reshape(-1, 2), axis=0, return_index=True,
                                return_inverse=True)
    # Codes in order of first appearance, not of the strings' addresses: labels that two pairs
    # share (built-ins of two objects) then add up in the same order on every run and reader.
    by_appearance = np.argsort(first, kind="stable")
    rank = np.empty_like(by_appearance)
    rank[by_appearance] = np.arange(by_appearance.size)
    first, codes = first[by_appearance], rank[codes.ravel()]
    labelled = [frame_label(str(names[i]), str(callers[i])) for i in first.tolist()]
    labels = [label for label, _ in labelled]
    # The user's own Python code (not a built-in they called): where syncs and copies are put.
    code = np.array([user and FRAME_NAME.match(str(names[i])) is not None
                     for (_, user), i in zip(labelled, first.tolist())], dtype=bool)[codes]
    return FrameTimes(times=per_name(codes, labels, self_us, n_steps),
                      user={label: user for label, user in labelled},
                      user_code=inside[code],
                      user_code_labels=np.array(labels, dtype=object)[codes[code]])


def python_frames(columns: TraceColumns, table: FrameTimes, host_window: tuple[float, float],
                  n_steps: int, syncs: tuple[Spans, np.ndarray],
                  copies: tuple[Spans, np.ndarray]) -> dict:
    """The hot frames (HOT_FRAMES_SHOWN by self time: label, user's or not, ms per step, share of
    the mean host step) and, per line of the user's code, the syncs and the host-device copies
    it issued per step (`syncs`, `copies`: the calls in the steps, and their threads): each to
    the innermost frame of the user's code that holds the call (syncs.innermost_holders)."""
    times = table.times
    step_ms = (host_window[1] - host_window[0]) / US_PER_MS / n_steps
    hot = sorted(times, key=lambda label: (-times[label][0], label))[:HOT_FRAMES_SHOWN]
    user_frames = Spans(columns.python.start[table.user_code], columns.python.end[table.user_code])
    user_threads = columns.python_thread[table.user_code]

    def per_user_line(calls: Spans, threads: np.ndarray) -> dict[str, float]:
        holder = innermost_holders(user_frames, user_threads, calls, threads)
        counts: dict[str, float] = {}
        for index in holder[holder >= 0].tolist():
            line = table.user_code_labels[index]
            counts[line] = counts.get(line, 0.0) + 1.0 / n_steps
        return dict(sorted(counts.items(), key=lambda item: -item[1])[:USER_LINES_SHOWN])

    return {
        "hot_frames": [{"frame": label, "user": table.user[label],
                        "self_ms_per_step": times[label][0],
                        "pct": 100.0 * times[label][0] / step_ms if step_ms > 0 else 0.0}
                       for label in hot],
        "user_ms_per_step": sum(ms for label, (ms, _) in times.items() if table.user[label]),
        "syncs_by_user_frame_per_step": per_user_line(*syncs),
        "copies_by_user_frame_per_step": per_user_line(*copies),
    }
