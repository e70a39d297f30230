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

import numpy as np

from common.intervals import Spans, concat
from common.metrics import self_time_us
from common.trace_columns import TraceColumns

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


def innermost_user_frame(starts: np.ndarray, frame_start: np.ndarray, frame_end: np.ndarray,
                         frame_thread: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """For each time in `starts` (on its `thread`), the index of the innermost user frame that
    holds it (the latest-starting one open then), -1 for none."""
    found = np.full(starts.size, -1, np.int64)
    for i, (at, on) in enumerate(zip(starts.tolist(), thread.tolist())):
        holds = np.flatnonzero((frame_thread == on) & (frame_start <= at) & (frame_end > at))
        if holds.size:
            found[i] = holds[np.argmax(frame_start[holds])]
    return found


def frame_times(columns: TraceColumns, host_window: tuple[float, float], n_steps: int
                ) -> tuple[dict[str, tuple[float, float]], dict[str, bool], np.ndarray,
                           np.ndarray]:
    """Every frame label in the host window -> (self ms per step, calls per step), which labels
    are the user's, and the frames (indices into columns.python) of the user's own Python code
    with their labels (where syncs and copies are attributed)."""
    frames = columns.python
    low, high = host_window
    inside = np.flatnonzero((frames.start >= low) & (frames.start < high))
    ops = columns.cpu_ops
    both = concat(Spans(frames.start[inside], frames.end[inside]), ops)
    threads = np.r_[columns.python_thread[inside], columns.cpu_op_thread]
    self_us = self_time_us(both, threads)[:inside.size]
    names = columns.python_names[inside]
    labelled = [frame_label(str(name), str(caller))
                for name, caller in zip(names, columns.python_call_from[inside])]
    times: dict[str, tuple[float, float]] = {}
    for (label, _), us in zip(labelled, self_us.tolist()):
        ms, calls = times.get(label, (0.0, 0.0))
        times[label] = (ms + us / 1000.0 / n_steps, calls + 1.0 / n_steps)
    user_of = {label: user for label, user in labelled}
    code = np.array([user and FRAME_NAME.match(str(name)) is not None
                     for (_, user), name in zip(labelled, names)], dtype=bool)
    return (times, user_of, inside[code],
            np.array([label for label, _ in labelled], dtype=object)[code])


def python_frames(columns: TraceColumns, host_window: tuple[float, float], n_steps: int,
                  syncs_at: tuple[np.ndarray, np.ndarray],
                  copies_at: tuple[np.ndarray, np.ndarray]) -> dict | None:
    """The hot frames in the host window (HOT_FRAMES_SHOWN by self time: label, user's or not, ms
    per step, share of the host window) and, per line of the user's code, the syncs and the
    host-device copies it issued per step (`syncs_at`, `copies_at`: the start and thread of each
    sync call and copy call in the steps). None for a trace without Python frames."""
    frames = columns.python
    low, high = host_window
    if not ((frames.start >= low) & (frames.start < high)).any():
        return None
    times, user_of, user_index, user_labels = frame_times(columns, host_window, n_steps)
    step_ms = (high - low) / 1000.0 / n_steps
    hot = sorted(times, key=lambda label: (-times[label][0], label))[:HOT_FRAMES_SHOWN]

    def per_user_line(at: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
        holder = innermost_user_frame(at[0], frames.start[user_index], frames.end[user_index],
                                      columns.python_thread[user_index], at[1])
        counts: dict[str, float] = {}
        for index in holder[holder >= 0].tolist():
            counts[user_labels[index]] = counts.get(user_labels[index], 0.0) + 1.0 / n_steps
        return dict(sorted(counts.items(), key=lambda item: -item[1])[:USER_LINES_SHOWN])

    return {
        "hot_frames": [{"frame": label, "user": user_of[label],
                        "self_ms_per_step": times[label][0],
                        "pct": 100.0 * times[label][0] / step_ms if step_ms > 0 else 0.0}
                       for label in hot],
        "user_ms_per_step": sum(ms for label, (ms, _) in times.items() if user_of[label]),
        "syncs_by_user_frame_per_step": per_user_line(syncs_at),
        "copies_by_user_frame_per_step": per_user_line(copies_at),
    }
