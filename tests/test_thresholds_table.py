"""The thresholds stated once and held: common/README.md's thresholds table against the named
constants in the code, and each verdict's row of its rules table against the constants that
rule reads. A threshold changed in the code alone, or in the docs alone, fails here; a
deliberate change updates both. (The edge tests derive their values from the constants, so
they move with a changed constant and cannot catch it.)"""
from __future__ import annotations

import importlib
import numbers
import re

import pytest

from common import verdicts
from tests.conftest import ROOT

README = ROOT / "common" / "README.md"
THRESHOLDS_HEADER = "| constant | value | unit | source |"
RULES_HEADER = "| id | fires when | threshold source | demo |"
# Constants outside verdicts.py that a verdict or a warning cuts at (every number in verdicts.py
# is one, and is required without a list).
OTHER_THRESHOLDS = ("metrics.SHORT_KERNEL_US", "host_ops.CPU_SHORT_OP_US", "metrics.ROUND_TRIP_SIZE_RATIO_MAX",
                    "idle_causes.HOST_REGION_OUTSIDE_OPS_MIN", "idle_causes.INIT_LAUNCH_MIN_MS",
                    "idle_causes.INIT_LAUNCH_GPU_BUSY_MAX", "idle_causes.INIT_SETUP_CALL_MIN_MS",
                    "idle_causes.INIT_FIRST_LAUNCH_MIN_MS", "idle_causes.INIT_FIRST_CALL_MIN_MS",
                    "idle_causes.INIT_FIRST_CALL_RATIO", "idle_causes.INIT_MOSTLY_MIN_PCT",
                    "idle_causes.INIT_STEADY_MIN_PCT", "host_ops.HOST_OP_MIN_US", "compare.FEW_STEPS",
                    "recorded.STEP_SPREAD_MAX",
                    "trace.DATA_WAIT_GAP_POINTS", "trace.PROFILER_OVERHEAD_WARN_RATIO",
                    "memory.GROWTH_FIT_MIN_STEPS")
# The constants each rule's "fires when" cell states as a number (a constant stated in words,
# such as "launch-call time >= kernel time" for LAUNCH_TO_KERNEL_TIME_MIN, is left out).
RULE_CONSTANTS = {
    "dataloader": ("DATALOADER_SHARE_MIN_PCT", "DATALOADER_WORKERS_BEHIND_MIN_PCT"),
    "host_region": ("HOST_REGION_MIN_PCT",),
    "small_batch": ("SMALL_BATCH_UTILIZATION_MAX_PCT", "SMALL_BATCH_MEDIAN_KERNEL_MAX_US",
                    "SMALL_BATCH_INPUT_BATCH_BELOW"),
    "fp32_matmul": ("FP32_GEMM_MIN_PCT",),
    "memory_bound_kernels": ("MEMORY_BOUND_MIN_PCT", "MEMORY_BOUND_FP32_MIN_SHARE"),
    "activation_memory": ("ACTIVATION_MEMORY_MIN_PCT", "ACTIVATION_MEMORY_HIGH_PCT"),
    "memory_growth": ("MEMORY_GROWTH_R2_MIN", "memory.GROWTH_FIT_MIN_STEPS",
                      "MEMORY_GROWTH_MIN_PCT", "MEMORY_GROWTH_FULL_WITHIN_STEPS",
                      "MEMORY_ASSUMED_CAPACITY_MB"),
    "recompiles": ("RECOMPILE_DISTINCT_IDS_MIN", "DYNAMO_RECOMPILE_LIMIT"),
    "graph_breaks": ("GRAPH_BREAKS_PER_STEP_MIN",),
    "launch_overhead": ("LAUNCH_SHORT_KERNEL_MIN_PCT", "SMALL_BATCH_INPUT_BATCH_BELOW",
                        "GRAPH_REPLAYED_MIN_PCT", "metrics.SHORT_KERNEL_US"),
    "host_overhead": ("HOST_OVERHEAD_LAUNCH_IDLE_MIN_PCT", "SMALL_BATCH_INPUT_BATCH_BELOW",
                      "HOST_OVERHEAD_OPERATORS_SHOWN", "GRAPH_REPLAYED_MIN_PCT"),
    "exposed_communication": ("EXPOSED_COMM_MIN_PCT",),
    "cpu_op_overhead": ("CPU_CALLS_MIN_PCT",),
    "host_work_ops": ("HOST_REGION_MIN_PCT", "host_ops.HOST_OP_MIN_US"),
    "initialization": ("INIT_WITHHOLD_MIN_PCT",),
    "python_between_ops": ("PYTHON_OUTSIDE_OPS_MIN_PCT",),
    "host_sync": ("HOST_SYNC_PER_STEP_MIN", "HOST_SYNC_IDLE_MIN_PCT"),
    "host_roundtrip": ("HOST_ROUNDTRIP_PER_STEP_MIN", "DATA_DEPENDENT_SYNCS_PER_STEP_MIN",
                       "HOST_SYNC_IDLE_MIN_PCT"),
    "h2d_copy": ("H2D_MIN_PCT", "HOST_SYNC_PER_STEP_MIN", "HOST_SYNC_IDLE_MIN_PCT",
                 "H2D_PAGEABLE_MIN_PCT"),
    "unfused_optimizer": ("UNFUSED_OPTIMIZER_MIN_PCT", "UNFUSED_OPTIMIZER_MAX_US_PER_OP",
                          "UNFUSED_OPTIMIZER_CALLS_PER_TENSOR_MIN"),
    "ddp_sync": ("DDP_SYNCED_MICRO_BATCHES_MIN",),
    "naive_attention": ("NAIVE_ATTENTION_MIN_SEQ",),
}


def table_rows(header: str) -> list[list[str]]:
    """The cells of each row of the Markdown table under `header` (to the first line that is no
    table row)."""
    lines = README.read_text().splitlines()
    start = lines.index(header) + 2  # past the header and its |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def constant(dotted: str):
    """`module.NAME` in common/, or a bare NAME of verdicts.py."""
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(f"common.{module or 'verdicts'}"), name)


def verdicts_numbers() -> list[str]:
    """Every number verdicts.py defines at module level (its thresholds; not what it imports)."""
    source = (ROOT / "common" / "verdicts.py").read_text()
    return [f"verdicts.{name}" for name, value in vars(verdicts).items()
            if name.isupper() and isinstance(value, numbers.Real) and not isinstance(value, bool)
            and re.search(rf"^{name} = ", source, re.MULTILINE)]


def stated(number: float) -> str:
    """A regex for `number` as prose writes it (20, 0.8, 1.5), not inside another number."""
    return rf"(?<![\d.]){re.escape(f'{number:g}')}(?![\d.])"


def test_the_thresholds_table_holds_every_threshold_once():
    named = [row[0].strip("`") for row in table_rows(THRESHOLDS_HEADER)]
    assert len(named) == len(set(named)), "a constant listed twice"
    assert set(named) == set(verdicts_numbers()) | set(OTHER_THRESHOLDS)


@pytest.mark.parametrize("row", table_rows(THRESHOLDS_HEADER), ids=lambda row: row[0])
def test_each_threshold_reads_as_its_constant(row):
    name, value, unit, source = row
    assert float(value) == constant(name.strip("`")), f"{name}: the docs say {value}"
    assert unit and source  # each says what it counts and where it comes from


def test_the_rules_table_has_a_row_per_rule():
    assert [row[0].strip("`") for row in table_rows(RULES_HEADER)] == list(RULE_CONSTANTS)
    assert {rule.__name__.removeprefix("rule_")
            for rule in (*verdicts.RULES, verdicts.rule_initialization)} == set(RULE_CONSTANTS)


@pytest.mark.parametrize("rule_id", list(RULE_CONSTANTS))
def test_each_rules_row_states_the_constants_it_reads(rule_id):
    fires_when = {row[0].strip("`"): row[1] for row in table_rows(RULES_HEADER)}[rule_id]
    for name in RULE_CONSTANTS[rule_id]:
        value = constant(name)
        assert re.search(stated(value), fires_when), f"{rule_id}: {name} = {value:g} not stated"
