"""Does the suite catch a careless edit? Each edit below is a one-line change to the analyzer that
a test should fail on: a rule reading the wrong field, a hand-off dropped, a >= made >, a
threshold changed in the code alone. For each, a copy of the project gets the edit and runs the
tests that should catch it; the table says which test failed, or that none did.

    python scripts/check_tests_catch.py [--only NAME ...] [--list]

The unedited copy runs the same tests first: they must pass, or a failure proves nothing.
Exit code 1 when an edit is caught by no test, 2 for an edit that no longer applies (its line is
gone: update it with the code). Takes a minute or two: one pytest run per edit.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST_TIMEOUT_S = 600  # one edit's tests; the slowest here take well under a minute


@dataclass(frozen=True)
class Edit:
    name: str
    path: str  # relative to the project root
    old: str  # occurs exactly once in `path`
    new: str
    tests: tuple[str, ...]  # the test files expected to catch it


VERDICT_TESTS = ("tests/test_verdict_edges.py", "tests/test_thresholds_table.py")
EDITS = (
    Edit("host_region reads the window share on a GPU", "common/verdicts.py",
         'share = {name: region["gpu_idle_pct"] if gpu else region["pct"]',
         'share = {name: region["pct"]', VERDICT_TESTS + ("tests/test_host_regions.py",)),
    Edit("small_batch no longer gives way to host_region", "common/verdicts.py",
         "if (not gpu_underfilled(gpu) or rule_dataloader(m) or rule_host_region(m)",
         "if (not gpu_underfilled(gpu) or rule_dataloader(m)", VERDICT_TESTS),
    Edit("host_overhead no longer gives way to launch_overhead", "common/verdicts.py",
         "and launch_to_kernel_ratio(gpu) is None)", ")", VERDICT_TESTS),
    Edit("graph_replayed's >= made >", "common/verdicts.py",
         ">= GRAPH_REPLAYED_MIN_PCT)", "> GRAPH_REPLAYED_MIN_PCT)",
         VERDICT_TESTS + ("tests/test_cuda_graphs.py",)),
    Edit("same_data's <= made <", "common/metrics.py",
         "<= ROUND_TRIP_SIZE_RATIO_MAX)", "< ROUND_TRIP_SIZE_RATIO_MAX)",
         ("tests/test_python_frames.py",)),
    Edit("user_ms_per_step sums every frame, not the user's", "common/frames.py",
         "for label, (ms, _) in times.items() if table.user[label]),",
         "for label, (ms, _) in times.items()),", ("tests/test_python_frames.py",)),
    Edit("one hot frame more than HOT_FRAMES_SHOWN", "common/frames.py",
         "[:HOT_FRAMES_SHOWN]", "[:HOT_FRAMES_SHOWN + 1]", ("tests/test_python_frames.py",)),
    Edit("one user line more than USER_LINES_SHOWN", "common/frames.py",
         "[:USER_LINES_SHOWN]", "[:USER_LINES_SHOWN + 1]", ("tests/test_python_frames.py",)),
    Edit("pybind11 object names kept", "common/frames.py",
         'name = BINDING_OBJECT.sub(">", OBJECT_ADDRESS.sub(">", name))',
         'name = OBJECT_ADDRESS.sub(">", name)', ("tests/test_python_frames.py",)),
    Edit("Python frames counted as impossible events twice", "common/sanity.py",
         'UNCOUNTED_GROUPS = ("cpu_named", "python")', 'UNCOUNTED_GROUPS = ("cpu_named",)',
         ("tests/test_impossible.py",)),
    Edit("named operator spans counted as impossible events twice", "common/sanity.py",
         'UNCOUNTED_GROUPS = ("cpu_named", "python")', 'UNCOUNTED_GROUPS = ("python",)',
         ("tests/test_impossible.py",)),
    Edit("compare's hardware warning reads the device kind only", "common/compare.py",
         'if (old["device"], old["gpu_name"]) != (new["device"], new["gpu_name"]):',
         'if old["device"] != new["device"]:', ("tests/test_compare_warnings.py",)),
    Edit("few steps warn at FEW_STEPS too", "common/compare.py",
         'analysis["steps"] < FEW_STEPS:', 'analysis["steps"] <= FEW_STEPS:',
         ("tests/test_compare_warnings.py",)),
    Edit("a spread of exactly STEP_SPREAD_MAX warns", "common/compare.py",
         "p95 / p50 > recorded.STEP_SPREAD_MAX:", "p95 / p50 >= recorded.STEP_SPREAD_MAX:",
         ("tests/test_compare_warnings.py",)),
    Edit("a GPU busy exactly a timed step named as the cause", "common/recorded.py",
         "if busy is None or busy <= 1", "if busy is None or busy < 1",
         ("tests/test_recorded.py",)),
    Edit("a data-wait gap of exactly DATA_WAIT_GAP_POINTS warns", "common/recorded.py",
         "if abs(timed - recorded) <= trace.DATA_WAIT_GAP_POINTS:",
         "if abs(timed - recorded) < trace.DATA_WAIT_GAP_POINTS:", ("tests/test_recorded.py",)),
    Edit("a window exactly DATA_WAIT_GAP_POINTS off records a round", "common/profiling.py",
         "return workers if gap_points > trace.DATA_WAIT_GAP_POINTS else recorded",
         "return workers if gap_points >= trace.DATA_WAIT_GAP_POINTS else recorded",
         ("tests/test_loader_round.py",)),
    Edit("--recorded-steps given still gets a round", "common/profiling.py",
         "if (run.recorded_steps_given or wait_ms is None", "if (wait_ms is None",
         ("tests/test_loader_round.py",)),
    Edit("ranks record a round each", "common/profiling.py",
         "or run.distributed\n", "\n", ("tests/test_loader_round.py",)),
    Edit("DATALOADER_WORKERS_BEHIND_MIN_PCT 10 -> 12 in the code alone", "common/verdicts.py",
         "DATALOADER_WORKERS_BEHIND_MIN_PCT = DATALOADER_SHARE_MIN_PCT / 2",
         "DATALOADER_WORKERS_BEHIND_MIN_PCT = 12.0", VERDICT_TESTS),
    Edit("a loader with workers held to the in-process cut", "common/verdicts.py",
         "return DATALOADER_WORKERS_BEHIND_MIN_PCT if workers else DATALOADER_SHARE_MIN_PCT",
         "return DATALOADER_SHARE_MIN_PCT", ("tests/test_verdict_edges.py",)),
    Edit("workers that fall behind rank by their share alone", "common/verdicts.py",
         "paces = f.get(\"sets_pace\", False)", "paces = False",
         ("tests/test_verdict_edges.py", "tests/test_loader_round.py")),
    Edit("a kernel of exactly SHORT_KERNEL_US counts as short", "common/metrics.py",
         "(duration < SHORT_KERNEL_US)", "(duration <= SHORT_KERNEL_US)", VERDICT_TESTS),
    Edit("possible_steps keeps a step that starts inside the one before", "common/sanity.py",
         "elif kept and start < kept[-1][2]:", "elif kept and start > kept[-1][2]:",
         ("tests/test_impossible.py",)),
    Edit("FP32_GEMM_MIN_PCT 20 -> 25 in the code alone", "common/verdicts.py",
         "FP32_GEMM_MIN_PCT = 20.0", "FP32_GEMM_MIN_PCT = 25.0", VERDICT_TESTS),
    Edit("H2D_MIN_PCT 10 -> 12 in the code alone", "common/verdicts.py",
         "H2D_MIN_PCT = 10.0", "H2D_MIN_PCT = 12.0", VERDICT_TESTS),
    Edit("SMALL_BATCH_MEDIAN_KERNEL_MAX_US 25 -> 30 in the code alone", "common/verdicts.py",
         "SMALL_BATCH_MEDIAN_KERNEL_MAX_US = 25.0", "SMALL_BATCH_MEDIAN_KERNEL_MAX_US = 30.0",
         VERDICT_TESTS),
    # One quantity, one value: a definition or a format changed in one output alone.
    Edit("compare's GPU idle row shows HTA's idle", "common/compare.py",
         '("GPU idle %", gpu_value("idle_pct"), ".1f", -1),',
         '("GPU idle %", gpu_value("hta_idle_pct"), ".1f", -1),', ("tests/test_one_number.py",)),
    Edit("analyze's idle line sums its causes", "common/analyze.py",
         'lines.append(f"GPU idle     {gpu[\'idle_pct\']:.1f} % of the steps: "',
         'lines.append(f"GPU idle     {sum(idle.values()):.0f} % of the steps: "',
         ("tests/test_one_number.py",)),
    Edit("utilization counts kernels only", "common/metrics.py",
         '"utilization_pct": share(gpu_busy, span),', '"utilization_pct": share(kernel_busy, span),',
         ("tests/test_one_number.py", "tests/test_analyze.py")),
    Edit("MB are MiB again", "common/trace.py", "BYTES_PER_MB = 1e6", "BYTES_PER_MB = 1024 * 1024",
         ("tests/test_analyze.py", "tests/test_one_number.py")),
    Edit("a share's change said as a ratio", "common/compare.py", 'if "%" in label:',
         'if False:', ("tests/test_compare.py",)),
    # The user's frames named by path (frames.py).
    Edit("the source search's folder limit made >=", "common/frames.py",
         "if walked > SOURCE_SEARCH_MAX_DIRS:", "if walked >= SOURCE_SEARCH_MAX_DIRS:",
         ("tests/test_python_frames.py",)),
    Edit("any agreeing file taken, not the only one", "common/frames.py",
         "if len(agreeing) == 1:", "if agreeing:", ("tests/test_python_frames.py",)),
    Edit("a recorded path matched by its end's characters", "common/frames.py",
         "path.endswith(os.sep + tail)", "path.endswith(tail)", ("tests/test_python_frames.py",)),
    # Traces as new users record them.
    Edit("a sync that ends its step counted as a mid-step wait", "common/verdicts.py",
         "    mid_step = host_starved(m)\n", "    mid_step = False\n", ("tests/test_verdict_edges.py",)),
    Edit("calls counted from the gaps between operators of any length", "common/host_ops.py",
         "short_gaps_us = float(gaps[gaps < CPU_SHORT_OP_US].sum())",
         "short_gaps_us = float(gaps.sum())", ("tests/test_new_user_traces.py",)),
    Edit("a GPU run without GPU events read as a CPU run", "common/analyze.py",
         "    gpu_run = has_gpu or bool(unrecorded_calls)",
         "    gpu_run = has_gpu", ("tests/test_new_user_traces.py",)),
    # Memory over the steps (memory.py) and its verdict.
    Edit("memory_growth's R^2 >= made >", "common/verdicts.py",
         "if r2 < MEMORY_GROWTH_R2_MIN or", "if r2 <= MEMORY_GROWTH_R2_MIN or",
         ("tests/test_memory.py",)),
    Edit("kept memory counts blocks freed before the window's end", "common/memory.py",
         "kept = allocation & (step_of < n_steps - 1) & (freed_at > high)",
         "kept = allocation & (step_of < n_steps - 1)", ("tests/test_memory.py",)),
    Edit("an allocation named by its innermost operator", "common/memory.py",
         "    outer = start >= reach\n", "    outer = start == start\n", ("tests/test_memory.py",)),
    # Memory-bound kernels, and the order of the findings.
    Edit("memory_bound_kernels no longer gives way to naive_attention", "common/verdicts.py",
         "if pct < MEMORY_BOUND_MIN_PCT or rule_naive_attention(m):",
         "if pct < MEMORY_BOUND_MIN_PCT:", VERDICT_TESTS),
    Edit("BF16 first's FP32 share >= made >", "common/verdicts.py",
         "if fp32 >= MEMORY_BOUND_FP32_MIN_SHARE * pct",
         "if fp32 > MEMORY_BOUND_FP32_MIN_SHARE * pct", VERDICT_TESTS),
    Edit("matmuls in 16 bits from equal FP32 time", "common/verdicts.py",
         'return gpu["tensor_core_pct"] - gpu["tf32_pct"] > fp32',
         'return gpu["tensor_core_pct"] - gpu["tf32_pct"] >= fp32', VERDICT_TESTS),
    Edit("the memory-bound share summed, not a union", "common/metrics.py",
         "return union_in(Spans(kernels.start[chosen], kernels.end[chosen]), low, high)",
         "return float((kernels.end - kernels.start)[chosen].sum())",
         ("tests/test_memory_bound.py",)),
    Edit("findings by share, smallest first", "common/verdicts.py",
         '-(f["share_pct"] or 0.0)', '(f["share_pct"] or 0.0)', ("tests/test_verdict_order.py",)),
    Edit("findings without a share after those with one", "common/verdicts.py",
         'f["share_pct"] is not None,', 'f["share_pct"] is None,',
         ("tests/test_verdict_order.py",)),
    Edit("dataloader_workers reads any DataLoader iterator as workers", "common/analyze.py",
         "== {trace.MULTIPROCESS_LOADER_ITERATOR}", "!= set()",
         ("tests/test_analyze.py", "tests/test_real_traces.py")),
    Edit("dataloader_workers reads a workers' iterator beside another as workers",
         "common/analyze.py", "== {trace.MULTIPROCESS_LOADER_ITERATOR}",
         ">= {trace.MULTIPROCESS_LOADER_ITERATOR}", ("tests/test_analyze.py",)),
)


def project_files() -> list[str]:
    """Tracked and untracked, not ignored: what a clean clone holds plus work not committed."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [name for name in listed if (ROOT / name).is_file()]


def copy_project(into: Path) -> Path:
    copy = into / ROOT.name
    for name in project_files():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    shared = ROOT.parent / "shared"  # the real traces the tests read, when beside the project
    if shared.is_dir():
        (into / "shared").symlink_to(shared)
    return copy


def stale(edit: Edit, root: Path = ROOT) -> str | None:
    """Why `edit` no longer applies to the project at `root` (its line is not there exactly
    once, or a test file it names is gone); None when it does."""
    found = (root / edit.path).read_text().count(edit.old)
    if found != 1:
        return f"'{edit.name}': {edit.path} holds {found} copies of {edit.old!r}, not one"
    missing = [test for test in edit.tests if not (root / test).is_file()]
    return f"'{edit.name}': no test file {', '.join(missing)}" if missing else None


def apply(edit: Edit, root: Path) -> None:
    path = root / edit.path
    path.write_text(path.read_text().replace(edit.old, edit.new))


def failing_tests(root: Path, tests: tuple[str, ...]) -> tuple[int, list[str]]:
    """pytest's exit code on `tests` in `root`, and the tests that failed."""
    env = dict(os.environ, PYTHONPATH=str(root))  # the copy's common/, whatever is installed
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-rf", *tests], cwd=root, capture_output=True, text=True,
                            timeout=PYTEST_TIMEOUT_S, env=env)
    failed = re.findall(r"^FAILED (.+?)(?: - .*)?$", result.stdout, re.MULTILINE)
    return result.returncode, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="only the edits whose name contains one of these words")
    parser.add_argument("--list", action="store_true", help="list the edits and exit")
    flags = parser.parse_args(argv)
    edits = [e for e in EDITS if not flags.only or any(w in e.name for w in flags.only)]
    if flags.list:
        for edit in edits:
            print(f"{edit.name}: {edit.path}: {edit.old!r} -> {edit.new!r}")
        return 0
    if not edits:
        print(f"error: no edit matches {flags.only}", file=sys.stderr)
        return 2
    problems = [problem for problem in map(stale, edits) if problem]
    if problems:  # before any run: every edit applies to the project as it is
        print(f"error: {problems[0]}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="check_tests_catch_") as scratch:
        pristine = copy_project(Path(scratch) / "pristine")
        every_test = tuple(sorted({t for edit in edits for t in edit.tests}))
        print(f"unedited: {' '.join(every_test)}", flush=True)
        code, failed = failing_tests(pristine, every_test)
        if code != 0:
            print(f"error: the unedited project fails (exit {code}): {', '.join(failed)}",
                  file=sys.stderr)
            return 2
        missed = 0
        for index, edit in enumerate(edits):
            started = time.perf_counter()
            copy = copy_project(Path(scratch) / f"edit{index}")
            apply(edit, copy)
            code, failed = failing_tests(copy, edit.tests)
            caught = code == 1 and failed  # 1: tests ran and some failed (not a crash)
            missed += not caught
            shown = ", ".join(name.split("::")[-1] for name in failed[:3])
            more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
            print(f"{'caught' if caught else 'MISSED'}  {edit.name}  "
                  f"({time.perf_counter() - started:.0f} s)"
                  + (f": {shown}{more}" if caught else f" (pytest exit {code})"), flush=True)
            shutil.rmtree(copy.parent)
    print(f"{len(edits) - missed} of {len(edits)} edits caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
