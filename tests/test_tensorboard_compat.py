"""common/tensorboard_compat.py: which events get which category, that nothing else changes,
idempotence, gzip, the command line, and what the plugin makes of the result."""
from __future__ import annotations

import copy
import gzip
import json
import subprocess
import sys

import pytest

from common import tensorboard_compat as compat
from common import trace
from tests import synthetic_traces as synthetic
from tests.conftest import ROOT

CPU, GPU = 10, 0


def x(category: str, name: str, ts: float, pid: int = CPU, tid: int = CPU, **args) -> dict:
    return {"ph": "X", "cat": category, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": 5,
            "args": args}


def flow(category: str, phase: str, flow_id: int, ts: float) -> dict:
    return {"ph": phase, "id": flow_id, "pid": CPU, "tid": CPU, "ts": ts, "cat": category,
            "name": category}


# (event as current PyTorch writes it, the category it must have after the rewrite)
CASES = [
    (x("user_annotation", "ProfilerStep#2", 0), "user_annotation"),
    (x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1),
     "cpu_op"),
    (x("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 1.5),
     "cpu_op"),
    (x("user_annotation", "enumerate(DataPipe)#ShufflerIterDataPipe", 2), "cpu_op"),
    (x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__init__", 2.5),
     "user_annotation"),  # not a batch fetch: the plugin's rule wants __next__
    (x("user_annotation", "data", 3), "user_annotation"),
    (x("user_annotation", "Optimizer.step#SGD.step", 4), "user_annotation"),
    (x("cpu_op", "aten::addmm", 5, **{"External id": 7}), "cpu_op"),
    (x("cuda_runtime", "cudaLaunchKernel", 6, correlation=99), "Runtime"),
    (x("cuda_driver", "cuLaunchKernel", 7, correlation=100), "Runtime"),
    (x("kernel", "ampere_sgemm_128x64_nn", 8, pid=GPU, tid=7, correlation=99), "kernel"),
    (x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 9, pid=GPU, tid=7), "gpu_memcpy"),
    (x("gpu_memset", "Memset (Device)", 10, pid=GPU, tid=7), "gpu_memset"),
    (x("gpu_user_annotation", "ProfilerStep#2", 11, pid=GPU, tid=7), "gpu_profiler_step"),
    (x("gpu_user_annotation", "forward", 12, pid=GPU, tid=7), "gpu_user_annotation"),
    (x("python_function", "torch/nn/modules/module.py(1751): _call_impl", 13), "python_function"),
    (x("Trace", "PyTorch Profiler (0)", 14), "Trace"),
    (flow("ac2g", "s", 99, 6), "ac2g"),
    (flow("ac2g", "f", 99, 8), "ac2g"),
    (flow("fwdbwd", "s", 3, 5), "forward_backward"),
    (flow("fwdbwd", "f", 3, 15), "forward_backward"),
    ({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": CPU, "tid": CPU,
      "ts": 16, "args": {"Total Allocated": 8, "Device Type": 0}}, "cpu_instant_event"),
    ({"ph": "M", "name": "process_name", "pid": CPU, "tid": 0, "args": {"name": "python"}}, None),
    ({"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 17}, None),
]


def case_trace() -> dict:
    return {"schemaVersion": 1, "deviceProperties": [], "displayTimeUnit": "ms",
            "traceEvents": [copy.deepcopy(event) for event, _ in CASES]}


def without_category(event: dict) -> dict:
    return {key: value for key, value in event.items() if key != "cat"}


def test_each_event_gets_the_category_the_plugin_reads_and_nothing_else_changes():
    rewritten = case_trace()
    assert compat.rewrite_trace(rewritten)
    events = rewritten["traceEvents"]
    assert len(events) == len(CASES)  # every event kept, in order
    for (before, expected_category), after in zip(CASES, events):
        assert after.get("cat") == expected_category, before
        assert without_category(after) == without_category(before)
    original = case_trace()
    assert set(rewritten) == set(original) | {compat.REWRITE_MARK_KEY}
    assert all(rewritten[key] == original[key] for key in original if key != "traceEvents")
    assert rewritten[compat.REWRITE_MARK_KEY]["renamed"] == {
        "cuda_driver -> Runtime": 1, "cuda_runtime -> Runtime": 1,
        "fwdbwd -> forward_backward": 2, "gpu_user_annotation -> gpu_profiler_step": 1,
        "user_annotation -> cpu_op": 3}


@pytest.mark.parametrize("name", ["trace.pt.trace.json", "trace.pt.trace.json.gz"])
def test_rewriting_a_file_twice_changes_it_once_and_keeps_its_compression(tmp_path, name,
                                                                         monkeypatch):
    path = tmp_path / name
    raw = json.dumps(case_trace()).encode()
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    assert compat.rewrite_file(path) is True
    first = path.read_bytes()
    assert (first[:2] == trace.GZIP_MAGIC) == name.endswith(".gz")
    inode = path.stat().st_ino  # a rewrite replaces the file: a new inode, whatever the clock says

    def no_write(*args):
        raise AssertionError("an unchanged trace was written again")

    monkeypatch.setattr(compat, "write_atomically", no_write)
    assert compat.rewrite_file(path) is False  # idempotent: nothing left to rename
    assert path.read_bytes() == first and path.stat().st_ino == inode  # not even rewritten
    assert trace.load_trace(path)[compat.REWRITE_MARK_KEY]["version"] == compat.REWRITE_VERSION
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_a_trace_with_nothing_to_rename_is_marked_once(tmp_path):
    path = tmp_path / "cpu_only.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [x("cpu_op", "aten::mm", 0)]}))
    assert compat.rewrite_file(path) is True  # only the mark is added
    assert trace.load_trace(path)[compat.REWRITE_MARK_KEY]["renamed"] == {}
    assert compat.rewrite_file(path) is False


def test_the_harness_writes_traces_already_rewritten(workers_smoke_out):
    for variant in ("bad", "fixed"):
        path = trace.trace_files(workers_smoke_out / "dataloader_workers" / variant)[0]
        events = trace.load_trace(path)["traceEvents"]
        by_name = {}
        for event in events:
            by_name.setdefault(event.get("name"), set()).add(event.get("cat"))
        loader = [name for name in by_name if trace.is_dataloader_span(str(name))]
        assert loader and all(by_name[name] == {"cpu_op"} for name in loader)
        assert by_name["forward"] == {"user_annotation"}  # our regions stay annotations
        assert {e.get("cat") for e in events if str(e.get("name")).startswith("ProfilerStep#")} \
            == {"user_annotation"}
        assert not any(e.get("cat") == "fwdbwd" for e in events)
        assert any(e.get("cat") == "forward_backward" for e in events)
        before = path.read_bytes()
        assert compat.rewrite_file(path) is False and path.read_bytes() == before


def plugin_overview(trace_json: dict) -> dict:
    """The plugin's Overview for a trace, computed in this process by its classes (no server)."""
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    profile = RunGenerator("worker", None, RunProfileData.from_json("worker", None, trace_json))
    run = profile.generate_run_profile()
    return {"overview": run.overview,
            "gpu": {row["title"]: row["value"] for row in run.gpu_summary or []}}


# The plugin's kernel table calls pandas with an argument pandas 3 deprecates: its code, not ours.
@pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")
def test_plugin_reads_tensor_core_time_from_the_rewritten_fp16_trace():
    fp16 = synthetic.gpu_training_trace(gemm_kernel=synthetic.GEMM_FP16)
    assert "Kernel Time using Tensor Cores" not in plugin_overview(copy.deepcopy(fp16))["gpu"]
    compat.rewrite_trace(fp16)
    read = plugin_overview(fp16)
    share_pct = round(100 * synthetic.GEMM_SHARE_OF_KERNEL_TIME, 2)
    assert read["gpu"]["Kernel Time using Tensor Cores"] == f"{share_pct} %"
    assert "Automatic Mixed Precision" not in read["overview"]["recommendations"]  # it uses them


def compat_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.tensorboard_compat", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def write_trace(path, trace_json: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(trace_json).encode()))


def test_cli_rewrites_every_trace_under_a_folder_in_place_then_leaves_them(tmp_path):
    paths = [tmp_path / "a" / "bad" / "w.1.pt.trace.json.gz",
             tmp_path / "b" / "w.2.pt.trace.json.gz"]
    for path in paths:
        write_trace(path, case_trace())
    (tmp_path / "a" / "summary.json").write_text("{}")  # not a trace: left alone
    first = compat_cli(str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert first.stdout.count(": rewritten") == 2
    assert all(compat.REWRITE_MARK_KEY in trace.load_trace(path) for path in paths)
    again = compat_cli(str(tmp_path))
    assert again.returncode == 0 and again.stdout.count("unchanged") == 2


def test_cli_writes_out_and_leaves_in_as_it_was(tmp_path):
    source = tmp_path / "in" / "w.1.pt.trace.json.gz"
    write_trace(source, case_trace())
    before = source.read_bytes()
    result = compat_cli(str(source), str(tmp_path / "out"))  # OUT: a new file
    assert result.returncode == 0, result.stderr
    written = trace.load_trace(tmp_path / "out")
    assert source.read_bytes() == before
    assert [e.get("cat") for e in written["traceEvents"]] == [c for _, c in CASES]
    mirrored = compat_cli(str(tmp_path / "in"), str(tmp_path / "mirror"))
    assert mirrored.returncode == 0, mirrored.stderr
    assert compat.REWRITE_MARK_KEY in trace.load_trace(tmp_path / "mirror" / source.name)


def test_cli_help_and_bad_input_are_one_clear_line_with_exit_code_2(tmp_path):
    helped = compat_cli("--help")
    assert helped.returncode == 0 and "IN" in helped.stdout and "OUT" in helped.stdout
    (tmp_path / "notes.txt").write_text("not a trace")
    (tmp_path / "list.pt.trace.json").write_text("[1, 2]")
    (tmp_path / "empty").mkdir()
    for args in ([str(tmp_path / "missing.pt.trace.json")], [str(tmp_path / "notes.txt")],
                 [str(tmp_path / "list.pt.trace.json")], [str(tmp_path / "empty")]):
        result = compat_cli(*args)
        assert result.returncode == 2, args
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error:"), (
            args, result.stderr)
    assert compat_cli("--frobnicate", "x").returncode == 2
