"""The committed GPU reference runs (traces/reference/<gpu>/): each pair's verdicts, the report's
ratios, the READMEs' generated tables, the conditions and the size. Reads whatever runs are
there; skips when there are none."""
from __future__ import annotations

import ast
import functools
import inspect
import json
import operator
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from common import analyze, compare, runs, trace, trace_columns, verdicts
from common.intervals import merge
from tests.conftest import ROOT

REFERENCE = ROOT / "traces" / "reference"
# MB (10^6 bytes) in traces/reference/<gpu>/: 40 for the first thirteen pairs, few profiled steps
# and no stacks; the optimization ladder's six rungs (4.3 MB on the H100) raised it.
REFERENCE_MAX_MB = 45




def gpu_runs(folder: Path) -> bool:
    """A folder of finished pairs run on a GPU (traces/reference/cpu holds CPU runs drawn for the
    walkthroughs of pairs no GPU has run yet: no GPU targets, no report, no tables)."""
    pairs = compare.finished_pairs(folder)
    return bool(pairs) and json.loads((folder / pairs[0] / "bad" / "summary.json").read_text())[
        "device"] == "cuda"


GPUS = sorted(d.name for d in REFERENCE.iterdir() if gpu_runs(d)) if REFERENCE.is_dir() else []
PAIRS = [(gpu, demo) for gpu in GPUS for demo in compare.finished_pairs(REFERENCE / gpu)]
if not PAIRS:
    pytest.skip(f"no reference runs under {REFERENCE} (<gpu>/<demo>/bad and fixed with "
                f"{trace.SUMMARY_FILE}): nothing to check", allow_module_level=True)


@functools.cache  # once per session: analyzing a pair's traces takes about a second
def comparison(gpu: str, demo: str) -> dict:
    return compare.compare(REFERENCE / gpu / demo)


def verdict_demos() -> set[str]:
    """The demos the rules in verdicts.RULES name as their lesson: the `demo` argument (the last)
    of every finding(...) call in them: a name, None, one of two by a condition (training or
    inference), or what a function of verdicts.py called there returns."""
    demos = set()

    def names(tree: ast.AST) -> set[str]:
        return {const.value for const in ast.walk(tree)
                if isinstance(const, ast.Constant) and isinstance(const.value, str)}

    for rule in verdicts.RULES:
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(rule)))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "finding":
                demo = node.args[-1]
                if isinstance(demo, ast.Call):  # e.g. host_bound_demo(m): its return values
                    chooser = ast.parse(inspect.getsource(getattr(verdicts, demo.func.id)))
                    demos |= {name for ret in ast.walk(chooser) if isinstance(ret, ast.Return)
                              for name in names(ret)}
                else:
                    demos |= names(demo)
    return demos


# Pairs no rule names as its lesson, whose own claims are checked from their summaries below
# instead: padding_waste (a trace does not say which tokens were padding, so no verdict can);
# fragmentation (memory reserved beside allocated: the analyzer prints both on its memory line,
# and no rule judges the gap between them).
PAIRS_WITHOUT_VERDICT = {"padding_waste", "fragmentation"}


def test_only_the_known_pairs_lack_a_verdict():
    assert {demo for _, demo in PAIRS} - verdict_demos() <= PAIRS_WITHOUT_VERDICT


@pytest.mark.parametrize(("gpu", "demo"),
                         [(gpu, demo) for gpu, demo in PAIRS if demo not in PAIRS_WITHOUT_VERDICT])
def test_own_verdict_on_bad_only(gpu, demo):
    c = comparison(gpu, demo)
    own = {v: [f["id"] for f in c[v]["analysis"]["findings"] if f["demo"] == demo]
           for v in compare.VARIANTS}
    every = {v: [f["id"] for f in c[v]["analysis"]["findings"]] for v in compare.VARIANTS}
    assert own["bad"], f"bad/ has no finding with demo {demo!r}; its findings: {every['bad']}"
    assert not own["fixed"], f"fixed/ still has {own['fixed']} (demo {demo!r})"


@pytest.mark.parametrize("gpu", [gpu for gpu, demo in PAIRS if demo == "padding_waste"])
def test_padding_waste_claims(gpu):
    """What its walkthrough says of a reference run: padding from >= 50 % to <= 10 % of the
    tokens computed, >= 2x real tokens/s, tokens computed per real token (1 / (1 - padding)),
    and that padding shows as longer kernels on a busy GPU, not as idle time."""
    c = comparison(gpu, "padding_waste")
    summary = {v: c[v]["summary"] for v in compare.VARIANTS}
    gpu_metrics = {v: c[v]["analysis"]["gpu"] for v in compare.VARIANTS}
    assert summary["bad"]["padding_pct"] >= 50 and summary["fixed"]["padding_pct"] <= 10
    assert c["speedup_of"] == "real tokens/s" and c["speedup"] >= 2
    # Words joined by single spaces: a rewrapped paragraph says the same.
    walkthrough = " ".join((ROOT / "demos" / "padding_waste" / "README.md").read_text().split())
    per_real = [100 / (100 - summary[v]["padding_pct"]) for v in compare.VARIANTS]
    utilization = [gpu_metrics[v]["utilization_pct"] for v in compare.VARIANTS]
    median = [gpu_metrics[v]["median_kernel_us"] for v in compare.VARIANTS]
    for said in (f"computed {per_real[0]:.2f} tokens and `fixed` {per_real[1]:.2f}",
                 f"utilization {utilization[0]:.1f} % and {utilization[1]:.1f} %",
                 f"median {median[0]:.1f} → {median[1]:.1f} µs"):
        assert said in walkthrough, said
    assert min(utilization) >= 95 and median[1] < median[0]


@pytest.mark.parametrize("gpu", [gpu for gpu, demo in PAIRS if demo == "ddp_no_sync"])
def test_ddp_walkthrough_claims(gpu):
    """What the ddp_no_sync walkthrough says of the gloo traces on rank 0: every all-reduce
    starts inside a backward region (DDP's overlap), the gradient bytes all-reduced a step (FP32,
    record_shapes sizes), 4x fewer in fixed, and the time a step in the collectives."""
    walkthrough = " ".join((ROOT / "demos" / "ddp_no_sync" / "README.md").read_text().split())
    found = {}
    for variant in compare.VARIANTS:
        path = next((REFERENCE / gpu / "ddp_no_sync" / variant).glob("*rank0*.pt.trace.json.gz"))
        columns = trace_columns.read_trace(path)
        backward = merge(columns.regions["backward"])
        starts = columns.collective_spans.start
        inside = sum(bool(((backward.start <= x) & (x < backward.end)).any()) for x in starts)
        steps = columns.steps
        recorded = ((columns.gradient_collective_start >= steps.start[0])
                    & (columns.gradient_collective_start < steps.end[-1]))
        mb = float(columns.gradient_collective_size[recorded].sum()) * 4 / 1e6 / steps.size
        assert inside == starts.size, variant
        found[variant] = (starts.size, mb)
        in_collectives = analyze.analyze_trace(path)["distributed"]["collective_ms_per_step"]
        assert f"{in_collectives:,.0f} ms a step" in walkthrough or (
            f"{in_collectives:,.0f} ms in 9" in walkthrough), (variant, in_collectives)
    (bad_count, bad_mb), (fixed_count, fixed_mb) = found["bad"], found["fixed"]
    for said in (f"({bad_count} of {bad_count} in `bad`'s three recorded steps on rank 0, "
                 f"{fixed_count} of {fixed_count} in `fixed`'s)",
                 f"`bad` all-reduces {bad_mb:,.0f} MB", f"`fixed` {fixed_mb:,.0f} MB in 9",
                 f"{bad_mb / fixed_mb:.1f}× fewer bytes"):
        assert said in walkthrough, said


@pytest.mark.parametrize(("gpu", "demo"), PAIRS)
def test_no_impossible_event_in_the_reference(gpu, demo):
    c = comparison(gpu, demo)
    for variant in compare.VARIANTS:
        analysis = c[variant]["analysis"]
        assert analysis["warnings"] == [] and not any(analysis["impossible_events"].values())


def report_section(report: str, demo: str) -> str:
    section = re.search(rf"^## {re.escape(demo)}\n(.*?)(?=^## |\Z)", report,
                        re.MULTILINE | re.DOTALL)
    assert section, f"REPORT.md has no section '## {demo}'"
    return section.group(1)


def headline_ratio(section: str, words: str) -> str:
    """The ratio the section's headline ("**11.30x more samples/s, 1.01x the peak memory**")
    prints before `words`; "1.00" where it says "the same samples/s"."""
    headline = re.search(r"^\*\*(.+)\*\*$", section, re.MULTILINE)
    assert headline, "the section has no headline in bold"
    found = re.search(rf"(?:([0-9.]+)x (?:more |the )|the same ){re.escape(words)}",
                      headline.group(1))
    assert found, f"the headline {headline.group(1)!r} says nothing of {words}"
    return found.group(1) or "1.00"


def change_cell(section: str, label: str) -> str:
    """The change column of the `label` row in the section's table."""
    row = re.search(rf"^\| {re.escape(label)} \| [^|]* \| [^|]* \| ([^|]*) \|$", section,
                    re.MULTILINE)
    assert row, f"the section has no '{label}' row"
    return row.group(1)


@pytest.mark.parametrize(("gpu", "demo"), PAIRS)
def test_report_ratios_match_summaries(gpu, demo):
    c = comparison(gpu, demo)  # speedup and peak_memory_ratio: compare's, from the summaries
    section = report_section((REFERENCE / gpu / "REPORT.md").read_text(), demo)
    for label, words, ratio in ((c["speedup_of"], c["speedup_of"], c["speedup"]),
                                ("peak memory MB", "peak memory", c["peak_memory_ratio"])):
        printed = headline_ratio(section, words)
        # Tolerance: half a unit of the last printed digit (0.005 for "4.79"), the rounding's.
        half_unit = 0.5 * 10 ** -len(printed.partition(".")[2])
        assert ratio == pytest.approx(float(printed), abs=half_unit + 1e-12), (
            f"{demo} {words}: summaries give {ratio:.4f}x, REPORT.md prints {printed}x")
        # The table says the same change in words, its direction right.
        cell = change_cell(section, label)
        direction = ("the same" if f"{ratio:.2f}" == "1.00" else
                     "higher" if ratio > 1 else "lower")
        assert direction in cell, f"{demo} {label}: {ratio:.4f}x printed as {cell!r}"


@pytest.mark.parametrize("gpu", GPUS)
def test_readmes_hold_current_tables(gpu):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "reference_tables.py"),
                             str(REFERENCE / gpu), "--check"], check=False, capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, (f"rerun scripts/reference_tables.py {REFERENCE / gpu}:\n"
                                    f"{result.stdout}{result.stderr}")


@pytest.mark.parametrize("gpu", GPUS)
def test_one_gpu_one_torch(gpu):
    summaries = {path.relative_to(REFERENCE / gpu).as_posix(): json.loads(path.read_text())
                 for path in (REFERENCE / gpu).glob("*/*/summary*.json")}
    for name, summary in summaries.items():
        assert (summary["device"], summary["preset"]) == ("cuda", "cuda"), name
    for key in ("device_name", "torch_version"):
        values = {s.get(key) for s in summaries.values()}
        assert len(values) == 1, f"{key} differs in {REFERENCE / gpu}: {sorted(map(str, values))}"


@pytest.mark.parametrize("gpu", GPUS)
def test_reference_within_budget(gpu):
    size_mb = sum(p.stat().st_size for p in (REFERENCE / gpu).rglob("*") if p.is_file()) / 1e6
    assert size_mb <= REFERENCE_MAX_MB, f"{REFERENCE / gpu}: {size_mb:.1f} MB"


# --- scripts/reference_tables.py on a copy of the repository: its write path and exit codes. ----
# The copy holds the script, common/ (linked), the READMEs and two pairs of the reference, in a
# folder named as the GPU's (the block's tag). Two pairs: the top README's table then differs from
# the committed one (ten rows), each demo's does not.
TABLE_PAIRS = ("item_sync", "small_batch")
BLOCK_END = "<!-- reference-table:{gpu} end -->"


def run_tables(root, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / "scripts" / "reference_tables.py"), *args],
                          capture_output=True, text=True, cwd=root, timeout=300)


@pytest.fixture
def tables_copy(tmp_path):
    gpu = GPUS[0]
    if not set(TABLE_PAIRS) <= set(compare.finished_pairs(REFERENCE / gpu)):
        pytest.skip(f"{REFERENCE / gpu} lacks one of {TABLE_PAIRS}")
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "reference_tables.py", root / "scripts")
    (root / "common").symlink_to(ROOT / "common")
    shutil.copy(ROOT / "README.md", root)
    for readme in (ROOT / "demos").glob("*/README.md"):
        (root / "demos" / readme.parent.name).mkdir(parents=True)
        shutil.copy(readme, root / "demos" / readme.parent.name)
    for demo in TABLE_PAIRS:
        shutil.copytree(REFERENCE / gpu / demo, root / "traces" / "reference" / gpu / demo)
    return root, root / "traces" / "reference" / gpu, gpu


def block_of(text: str, gpu: str) -> str:
    begin = text.index(f"<!-- reference-table:{gpu} begin")
    return text[begin:text.index(BLOCK_END.format(gpu=gpu), begin)]


def top_rows(block: str) -> dict[str, list[str]]:
    """{demo: [symptom, fix, GPU result, CPU result]} from the top README's table."""
    rows = {}
    for line in block.splitlines():
        found = re.match(r"\| \[`(\w+)`\]\(demos/\w+/\) \|(.*)\|$", line)
        if found:
            rows[found[1]] = [cell.strip() for cell in found[2].split("|")]
    return rows


def test_tables_write_only_what_changed_and_then_check_clean(tables_copy):
    root, folder, gpu = tables_copy
    demo_readme = root / "demos" / TABLE_PAIRS[0] / "README.md"
    committed = demo_readme.read_text()
    checked = run_tables(root, str(folder), "--check")
    assert checked.returncode == 1 and checked.stdout == "would change: README.md\n"
    assert (root / "README.md").read_text() == (ROOT / "README.md").read_text()  # wrote nothing
    written = run_tables(root, str(folder))
    assert written.returncode == 0 and written.stdout == "wrote: README.md\n"
    table = block_of((root / "README.md").read_text(), gpu)
    # Each row's hand-written cells (symptom, fix, CPU result) are kept; only the GPU's is
    # written: the copy's two pairs from its runs, the others said to be missing from them.
    committed_rows = top_rows(block_of((ROOT / "README.md").read_text(), gpu))
    written_rows = top_rows(table)
    assert list(written_rows) == list(committed_rows)
    for demo, cells in written_rows.items():
        kept = committed_rows[demo]
        assert (cells[0], cells[1], cells[3]) == (kept[0], kept[1], kept[3]) and cells[0], demo
        assert cells[2] == (compare.headline(compare.compare(folder / demo))
                            if demo in TABLE_PAIRS else "not in this reference run yet"), demo
    assert demo_readme.read_text() == committed
    again = run_tables(root, str(folder))
    assert again.returncode == 0 and again.stdout == ""  # a second run changes nothing
    assert run_tables(root, str(folder), "--check").returncode == 0


def test_check_names_a_stale_readme_and_a_write_restores_it(tables_copy):
    root, folder, gpu = tables_copy
    run_tables(root, str(folder))  # the top README's table now has the copy's pairs
    demo_readme = root / "demos" / TABLE_PAIRS[1] / "README.md"
    committed = demo_readme.read_text()
    block = block_of(committed, gpu)
    stale_block = re.sub(r"\| samples/s \| [^|]+ \|", "| samples/s | 1.0 |", block, count=1)
    assert stale_block != block
    demo_readme.write_text(committed.replace(block, stale_block))
    checked = run_tables(root, str(folder), "--check")
    assert checked.returncode == 1
    assert checked.stdout == f"would change: demos/{TABLE_PAIRS[1]}/README.md\n"
    assert block_of(demo_readme.read_text(), gpu) == stale_block  # --check wrote nothing
    written = run_tables(root, str(folder))
    assert written.returncode == 0
    assert written.stdout == f"wrote: demos/{TABLE_PAIRS[1]}/README.md\n"
    assert demo_readme.read_text() == committed


def test_a_readme_without_the_block_gets_it(tables_copy):
    root, folder, gpu = tables_copy
    demo_readme = root / "demos" / TABLE_PAIRS[0] / "README.md"
    committed = demo_readme.read_text()
    subsection = committed.index(f"\n### On the {gpu.upper()}\n")
    end = committed.index(BLOCK_END.format(gpu=gpu)) + len(BLOCK_END.format(gpu=gpu))
    without = committed[:subsection + 1] + committed[end:].lstrip("\n")
    demo_readme.write_text(without)
    assert run_tables(root, str(folder)).returncode == 0
    # The block is back as the first subsection of the numbers, the rest as it was.
    assert demo_readme.read_text() == committed
    # A walkthrough without a numbers section gets one at its end.
    demo_readme.write_text(without[:without.index("\n## The numbers\n") + 1])
    assert run_tables(root, str(folder)).returncode == 0
    assert demo_readme.read_text().endswith(
        f"\n## The numbers\n\n### On the {gpu.upper()}\n\n{block_of(committed, gpu)}"
        f"{BLOCK_END.format(gpu=gpu)}\n")


@pytest.mark.parametrize("problem", ["no such folder", "a folder with no runs",
                                     "a pair with no demo folder"])
def test_tables_refuse_in_one_line_with_exit_2(tables_copy, problem):
    root, folder, _ = tables_copy
    if problem == "no such folder":
        target, expected = root / "nope", "no such directory"
    elif problem == "a folder with no runs":
        target, expected = root / "traces", "no runs"
        (root / "traces").mkdir(exist_ok=True)
    else:
        shutil.rmtree(root / "demos" / TABLE_PAIRS[0])
        target, expected = folder, "a pair the repository has no demo for"
    before = (root / "README.md").read_text()
    result = run_tables(root, str(target))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and expected in result.stderr
    assert (root / "README.md").read_text() == before


# --- traces/reference/README.md's target table ("| target ... | measured on the H100 | |")
# against the summaries.
# Each pair: what its row must print, from the committed runs, and the target each value is held
# to; the row says "met" exactly when every value meets its target.

def util(c: dict, variant: str) -> float:
    return c[variant]["analysis"]["gpu"]["utilization_pct"]


def recorded_util(c: dict, variant: str) -> float:
    return c[variant]["analysis"]["gpu"]["recorded_utilization_pct"]


def tensor_core_share_of_gemm(c: dict, variant: str) -> float:
    gpu = c[variant]["analysis"]["gpu"]
    return 100 * (gpu["gemm_pct"] - gpu["non_tensor_core_gemm_pct"]) / gpu["gemm_pct"]


def optimizer_ms(c: dict, variant: str, side: str) -> float:
    """The optimizer's time on one side ("cpu" or "gpu"), one definition for both runs."""
    return c[variant]["analysis"]["optimizer"][f"{side}_ms_per_step"]


def padding(c: dict, variant: str) -> float:
    return c[variant]["summary"]["padding_pct"]


def syncs(c: dict, variant: str) -> float:
    return c[variant]["analysis"]["gpu"]["syncs_per_step"]


def allocated_growth_mb(c: dict, variant: str) -> float:
    """MB a step that torch.cuda.memory_allocated() grows by over the recorded steps' ends (the
    summary's memory_by_step): the slope of a least-squares line."""
    allocated = c[variant]["summary"]["memory_by_step"]["allocated_mb"]
    return float(np.polyfit(np.arange(len(allocated)), allocated, 1)[0])


def kept_logits_mb(c: dict) -> float:
    """The logits memory_leak/bad keeps a step: batch x tokens x vocabulary, FP32."""
    summary = c["bad"]["summary"]
    return (summary["batch_size"] * summary["sizes"]["seq_len"] * summary["sizes"]["vocab"] * 4
            / trace.BYTES_PER_MB)


def unallocated_at_peak_mb(c: dict, variant: str) -> float:
    """Memory the caching allocator held from the GPU beyond the tensors' peak: peak reserved
    less peak allocated."""
    summary = c[variant]["summary"]
    return summary["peak_reserved_mb"] - summary["peak_memory_mb"]


def step_p50_ratio(c: dict) -> float:
    """bad's step p50 over fixed's: how many times lower fixed's is."""
    return c["bad"]["summary"]["step_ms_p50"] / c["fixed"]["summary"]["step_ms_p50"]


KEPT_LOGITS_MIN = 0.99  # bad keeps its logits each step: 1 % below allows no more than rounding
FLAT_MB_PER_STEP = 1.0  # "flat": under 1 MB a step, against the 268 MB bad keeps
SAME_SPEED = (0.95, 1.05)  # samples/s "the same within noise": +-5 %, the timed phase's spread


# (value, how the README prints it, target: (">=" or "<=", bound) or None for context only)
TARGET_ROWS = {
    # fixed's GPU utilization of the time the trace accounts for (its recording opens on work
    # launched before it: idle_causes.unrecorded_work), the window's beside it, and its data wait
    "dataloader_workers": lambda c: [
        (c["speedup"], "{:.2f}×", (">=", 3.0)),
        (recorded_util(c, "fixed"), "{:.1f} % of the time the trace accounts for", (">=", 95.0)),
        (util(c, "fixed"), "{:.1f} % of the window", None),
        (c["fixed"]["summary"]["data_wait_pct"], "data wait {:.1f} %", ("<=", 1.0))],
    "small_batch": lambda c: [(c["speedup"], "{:.2f}×", (">=", 5.0))],
    "mixed_precision": lambda c: [
        (c["speedup"], "{:.2f}×", (">=", 2.5)),
        (tensor_core_share_of_gemm(c, "fixed"), "{:.0f} %", (">=", 80.0)),
        (c["fixed"]["summary"]["bf16_peak_pct"], "{:.1f} %", (">=", 40.0))],
    # step time fixed ÷ bad: the inverse of the samples/s ratio (same batch, same steps)
    "activation_checkpointing": lambda c: [(c["peak_memory_ratio"], "{:.2f}×", ("<=", 0.5)),
                                           (1 / c["speedup"], "{:.2f}×", ("<=", 1.4))],
    "launch_overhead": lambda c: [(c["speedup"], "{:.2f}×", (">=", 3.0))],
    # 1.5x was the first target; five sizes on the H100 gave 0.99x to 1.37x (the walkthrough)
    "item_sync": lambda c: [(c["speedup"], "{:.2f}×", (">=", 1.2))],
    "naive_attention": lambda c: [(c["speedup"], "{:.2f}×", (">=", 2.0)),
                                  (c["peak_memory_ratio"], "{:.2f}×", ("<=", 0.5))],
    "unfused_optimizer": lambda c: [
        (optimizer_ms(c, "bad", "gpu") / optimizer_ms(c, "fixed", "gpu"), "{:.2f}× lower",
         (">=", 3.0)),
        (optimizer_ms(c, "bad", "gpu"), "({:.1f} →", None),
        (optimizer_ms(c, "fixed", "gpu"), "→ {:.1f} ms a step", None),
        (optimizer_ms(c, "bad", "cpu") / optimizer_ms(c, "fixed", "cpu"), "{:.2f}× on the CPU",
         (">=", 3.0)),
        (optimizer_ms(c, "bad", "cpu"), "({:.1f} →", None),
        (optimizer_ms(c, "fixed", "cpu"), "→ {:.1f})", None),
        (c["speedup"], "{:.2f}×", (">=", 1.3))],
    "padding_waste": lambda c: [(c["speedup"], "{:.2f}×", (">=", 2.0)),
                                (padding(c, "bad"), "{:.1f} % →", (">=", 50.0)),
                                (padding(c, "fixed"), "→ {:.1f} %", ("<=", 10.0))],
    "ddp_no_sync": lambda c: [(c["speedup"], "{:.2f}×", (">=", 1.3))],
    "host_roundtrip": lambda c: [(c["speedup"], "{:.2f}×", (">=", 2.0)),
                                 (syncs(c, "bad"), "{:.1f} syncs a step →", (">=", 5.0)),
                                 (syncs(c, "fixed"), "→ {:.1f}", ("<=", 0.0))],
    # latency_ratio is fixed's p50 per-token latency over bad's (the summary's rated_by)
    "llm_decode": lambda c: [(c["speedup"], "{:.2f}×", (">=", 3.0)),
                             (1 / c["latency_ratio"], "{:.2f}× lower p50 per-token latency",
                              (">=", 3.0))],
    "tokenizer_bound": lambda c: [(c["speedup"], "{:.2f}×", (">=", 3.0)),
                                  (1 / c["latency_ratio"], "{:.2f}× lower p50 latency", None)],
    "memory_leak": lambda c: [
        (allocated_growth_mb(c, "bad"), "{:.2f} MB a step",
         (">=", KEPT_LOGITS_MIN * kept_logits_mb(c))),
        (abs(allocated_growth_mb(c, "fixed")), "fixed {:.2f}", ("<=", FLAT_MB_PER_STEP)),
        (c["peak_memory_ratio"], "{:.2f}× the peak memory", None)],
    "fragmentation": lambda c: [
        (unallocated_at_peak_mb(c, "bad"), "{:,.1f} MB →", None),
        (unallocated_at_peak_mb(c, "fixed"), "→ {:,.1f} MB",
         ("<", unallocated_at_peak_mb(c, "bad"))),
        (c["speedup"], "{:.2f}× the real tokens/s", (">=", SAME_SPEED[0])),
        (c["speedup"], "{:.2f}× the real tokens/s", ("<=", SAME_SPEED[1]))],
    "recompiles": lambda c: [(c["speedup"], "{:.2f}×", (">=", 2.0)),
                             (step_p50_ratio(c), "{:.2f}× lower step p50", None)],
}


HOLDS = {">=": operator.ge, "<=": operator.le, "<": operator.lt}


def target_table_rows(readme: str) -> dict[str, list[str]]:
    """{demo: [target, measured, met]} from the table whose header starts with "| target"."""
    start = readme.index("\n| target")
    rows = {}
    for line in readme[start + 1:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[re.match(r"`(\w+)`", cells[0]).group(1)] = cells
    return rows


def test_readme_target_table_matches_the_committed_runs():
    gpu = "h100"  # the table speaks of the H100 run
    if gpu not in GPUS:
        pytest.skip(f"no {gpu} reference")
    rows = target_table_rows((REFERENCE / "README.md").read_text())
    assert set(rows) == set(TARGET_ROWS) <= set(compare.finished_pairs(REFERENCE / gpu))
    for demo, expected in TARGET_ROWS.items():
        _, measured, met = rows[demo]
        values = expected(comparison(gpu, demo))
        for value, printed, _ in values:
            assert printed.format(value) in measured, (demo, printed.format(value), measured)
        held = all(bound is None or HOLDS[bound[0]](value, bound[1]) for value, _, bound in values)
        assert met.startswith("met" if held else "**missed**"), (demo, met)


@pytest.mark.parametrize("gpu", [gpu for gpu, demo in PAIRS if demo == "fragmentation"])
def test_fragmentation_snapshots_show_the_allocator_setting(gpu):
    """The committed memory snapshots hold what each run's allocator did: bad's segments are
    fixed in size (none expandable), fixed's grow in place (every one expandable), and fixed
    holds fewer of them."""
    segments = {}
    for variant in compare.VARIANTS:
        with open(REFERENCE / gpu / "fragmentation" / variant / runs.MEMORY_SNAPSHOT_FILE,
                  "rb") as file:
            segments[variant] = pickle.load(file)["segments"]
        assert segments[variant], variant
        assert {s.get("is_expandable", False) for s in segments[variant]} == {
            variant == "fixed"}, variant
    assert len(segments["fixed"]) < len(segments["bad"])


@pytest.mark.parametrize("gpu", [gpu for gpu, demo in PAIRS if demo == "fragmentation"])
def test_fragmentation_walkthrough_table_shows_reserved(gpu):
    """The pair's lesson is reserved beside allocated: its generated table has both peaks, as
    the summaries hold them (compare's one decimal)."""
    c = comparison(gpu, "fragmentation")
    walkthrough = (ROOT / "demos" / "fragmentation" / "README.md").read_text()
    for label, key in (("peak memory MB", "peak_memory_mb"),
                       ("peak reserved MB", "peak_reserved_mb")):
        bad, fixed = (c[v]["summary"][key] for v in compare.VARIANTS)
        assert f"| {label} | {bad:.1f} | {fixed:.1f} |" in walkthrough, label
