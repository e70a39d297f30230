"""Python frames in a trace (torch.profiler with_stack=True, the harness's --with-stack): the hot
frames by self time, the user's own marked, and the syncs and host-device copies each line of the
user's code issued. Imports no torch.

A python_function event is one call: "file(line): function" for Python code (the line where the
function starts, or for one already running when the profiler started, the line it was at), or a
built-in's name ("<built-in method tolist of Tensor object at 0x...>"),
with its caller's "file:line" in args.CallFrom. Frames and operators nest by time on their
thread; a frame's self time is its time less the frames and operators it holds, so a Python loop
over .tolist() values keeps its own time and a frame that only calls torch does not.

The user's files are named by their path relative to the working directory of the analyzing
process, so that one bad.py of many is told apart (user_paths). torch writes a file's path less
the longest of the recording process's sys.path entries that holds it: a script run by path
reads "bad.py" (its folder is sys.path[0]), a module of a tree on PYTHONPATH "common/harness.py",
and only a file under none of them keeps its absolute path. So an absolute path under the
working directory is named relative to it; a relative one by the single file under the working
directory whose path ends with it and whose source agrees with every frame the trace names in it
(each function's line within a definition of that name); any other keeps the path as recorded.
Library frames keep theirs.
"""
from __future__ import annotations

import ast
import os
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
# ...and code torch.compile generated: Inductor's Python modules in its cache folder (by default
# <tmp>/torchinductor_<user>/, two-letter subfolders, "c" and a 51-letter hash), Triton's under
# ~/.triton/. Not the user's lines, though nothing installed them.
GENERATED_CODE = re.compile(r"/torchinductor_[^/]+/[a-z0-9]{2}/c[a-z0-9]{40,}\.py$|/\.triton/")
# Looking for the user's files under the working directory: folders no user's file lies in
# (installed packages, by the rule above; caches; JavaScript's packages) and hidden ones (.git,
# .venv) are skipped, and the search gives up past this many folders, leaving the paths as
# recorded. This project's tree is 63 folders; os.walk ran 1,500 folders/s cold and 50,000/s
# warm here (2 cores, /usr), so the cap costs at most ~0.7 s once and ~0.02 s after.
SOURCE_SEARCH_MAX_DIRS = 1000  # folders walked under the working directory
SOURCE_SEARCH_SKIPPED = frozenset({"__pycache__", "site-packages", "dist-packages",
                                   "node_modules"})


def is_user_file(path: str) -> bool:
    """Whether a frame's file is the user's code (not a library's, not the standard library's)."""
    path = path.replace("\\", "/")
    if (path.startswith("<frozen") or any(marker in path for marker in INSTALLED_MARKERS)
            or GENERATED_CODE.search(path)):
        return False
    top = path.lstrip("./").split("/", 1)[0]
    top = top[:-3] if top.endswith(".py") else top
    return top not in LIBRARY_PACKAGES and top not in sys.stdlib_module_names


def frame_label(name: str, call_from: str,
                paths: dict[str, str] | None = None) -> tuple[str, bool]:
    """("file:line function", whether it is the user's) for a Python frame; for a built-in,
    ("<built-in ...> called at file:line", whether its caller is the user's), without the
    object's address (a new one per object). `paths` names files otherwise than as recorded
    (user_paths); whose file it is is read from the path as recorded."""
    paths = paths or {}
    found = FRAME_NAME.match(name)
    if found:
        file = found["file"]
        return (f"{paths.get(file, file)}:{found['line']} {found['function']}",
                is_user_file(file))
    name = BINDING_OBJECT.sub(">", OBJECT_ADDRESS.sub(">", name))
    caller = call_from.rsplit(":", 1)[0] if call_from else ""
    if caller in paths:  # the caller's file, named as the user's files are
        call_from = paths[caller] + call_from[len(caller):]
    return (f"{name} called at {call_from}" if call_from else name,
            bool(caller) and is_user_file(caller))


def user_paths(pairs: list[tuple[str, str]], root: str) -> dict[str, str]:
    """Recorded path -> path relative to `root` (the working directory), for the user's files of
    these (frame name, caller) pairs that lie under it (see the module's docstring). Walks the
    folders under `root` only for relative paths, and only once."""
    # What the trace says of each of the user's files: (line, function) of its frames, and
    # (line, None) of the lines that called something.
    told: dict[str, set[tuple[int, str | None]]] = {}
    for name, call_from in pairs:
        found = FRAME_NAME.match(name)
        if found:
            told.setdefault(found["file"], set()).add((int(found["line"]), found["function"]))
        caller, _, line = call_from.rpartition(":")
        if caller and line.isdigit():
            told.setdefault(caller, set()).add((int(line), None))
    told = {file: facts for file, facts in told.items()
            if not file.startswith("<") and is_user_file(file)}
    paths: dict[str, str] = {}
    if not root:
        return paths
    for file in [file for file in told if os.path.isabs(file)]:
        inside = path_under(file, root)
        if inside is not None:
            paths[file] = inside
    relative = [file for file in told if not os.path.isabs(file)]
    found_files = files_under(root, {os.path.basename(file) for file in relative}) if (
        relative) else None
    for file in relative if found_files is not None else []:
        tail = os.path.normpath(file)
        agreeing = [path for path in found_files.get(os.path.basename(tail), [])
                    if (path == tail or path.endswith(os.sep + tail))
                    and source_agrees(os.path.join(root, path), told[file])]
        if len(agreeing) == 1:
            paths[file] = agreeing[0]
    return paths


def path_under(path: str, root: str) -> str | None:
    """`path` relative to `root` if it lies under it (as written, or with links resolved)."""
    for path_, root_ in ((path, root), (os.path.realpath(path), os.path.realpath(root))):
        try:
            inside = os.path.relpath(path_, root_)
        except ValueError:  # another drive
            continue
        if inside != os.pardir and not inside.startswith(os.pardir + os.sep):
            return inside
    return None


def files_under(root: str, names: set[str]) -> dict[str, list[str]] | None:
    """File name -> the paths, relative to `root`, of the files of those names under it (skipping
    hidden folders and SOURCE_SEARCH_SKIPPED); None past SOURCE_SEARCH_MAX_DIRS folders."""
    found: dict[str, list[str]] = {}
    for walked, (folder, subfolders, files) in enumerate(os.walk(root), start=1):
        if walked > SOURCE_SEARCH_MAX_DIRS:
            return None
        subfolders[:] = sorted(sub for sub in subfolders
                               if not sub.startswith(".") and sub not in SOURCE_SEARCH_SKIPPED)
        for name in names.intersection(files):
            found.setdefault(name, []).append(
                os.path.relpath(os.path.join(folder, name), root))
    return found


def source_agrees(path: str, facts: set[tuple[int, str | None]]) -> bool:
    """Whether the Python source at `path` could have run the frames the trace names in it: each
    named function's line lies within a definition of that name (from its first decorator: a
    frame names the line a function starts at, or the line it was at when the profiler
    started), and each other line (a caller's, "<module>", "<lambda>", a comprehension's) lies
    in the file."""
    try:
        with open(path, "rb") as file:
            source = file.read()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):  # unreadable, or not Python this one can read
        return False
    n_lines = len(source.splitlines())
    spans: dict[str, list[tuple[int, int]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
            spans.setdefault(node.name, []).append((start, node.end_lineno or node.lineno))
    return all(any(start <= line <= end for start, end in spans.get(function, ()))
               if function and not function.startswith("<") else 1 <= line <= n_lines
               for line, function in facts)


def working_directory() -> str:
    """The analyzing process's working directory; "" where it is gone (nothing lies under it)."""
    try:
        return os.getcwd()
    except OSError:
        return ""


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
                n_steps: int, root: str | None = None) -> FrameTimes:
    """Self time per frame label (frame_label) in the host window, the user's files named
    relative to `root` (the working directory unless given; user_paths). Labelled once per
    distinct (name, caller) pair: a trace holds 100 000s of frames of a few hundred pairs (names
    and callers are interned strings, so their ids stand for them)."""
    frames = columns.python
    low, high = host_window
    in_window = (frames.start >= low) & (frames.start < high)
    # The threads that run the steps' operators (the loop's, autograd's): a thread that runs none
    # is no part of a step's time (a DataLoader queue's feeder thread sits in a lock's acquire
    # the whole step: 165 % of one). Without an operator in the window, every thread.
    ops = columns.cpu_ops
    working = np.unique(columns.cpu_op_thread[(ops.start >= low) & (ops.start < high)]
                        if columns.cpu_op_thread.size == ops.size else [])
    if working.size:
        in_window &= np.isin(columns.python_thread, working)
    inside = np.flatnonzero(in_window)
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
    pairs = [(str(names[i]), str(callers[i])) for i in first.tolist()]
    paths = user_paths(pairs, root or working_directory())
    labelled = [frame_label(name, caller, paths) for name, caller in pairs]
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
