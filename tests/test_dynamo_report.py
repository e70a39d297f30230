"""devices.dynamo_report: what torch.compile did, from Dynamo's counters, in a process per case
(the counters are per process): a fork of the demo fork server, which imported torch and compiled
nothing, under the session's environment (a fresh `python` would spend most of a case importing).
Dynamo's own backend "eager" runs each graph as traced: graph breaks and recompiles are Dynamo's,
whatever the backend, and no compiler is needed."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import run_python

# A forward whose loop count is a Python int that changes every call (each value a recompile),
# with an .item() in a condition (a graph break a call): the two silent failures the report names.
CASE = """
import json, sys
import torch
from common import devices
limit = {limit}
torch._dynamo.config.recompile_limit = limit

def forward(x, n):
    for _ in range(n):
        x = torch.sin(x)
    if {item}:
        x = x * 2
    return x

compiled = torch.compile(forward, backend="eager")
for n in range(1, {calls} + 1):
    compiled(torch.ones(4), n)
print(json.dumps(devices.dynamo_report()))
"""


def report_of(folder: Path, limit: int, calls: int, item: bool) -> dict:
    script = folder / f"case_{limit}_{calls}_{item}.py"
    script.write_text(CASE.format(limit=limit, calls=calls,
                                  item="x.sum().item() > 0" if item else "False"))
    result = run_python([str(script)], in_a_fork=True, timeout_s=CASE_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# The cases (limit, calls, item) the tests read, each a process of its own, two at a time (the CI
# machine's cores): what Dynamo counts in one does not depend on how fast it ran.
CASES = {"over the limit": (3, 6, False), "under the limit": (8, 3, False),
         "an item": (8, 2, True)}
CASE_JOBS = 2
CASE_TIMEOUT_S = 300  # a case takes seconds; this only stops a hang


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("dynamo_cases")
    with ThreadPoolExecutor(max_workers=CASE_JOBS) as pool:
        found = pool.map(lambda case: report_of(folder, *case), CASES.values())
        return dict(zip(CASES, found))


def test_a_recompile_per_value_hits_the_limit_and_says_so(reports):
    found = reports["over the limit"]
    assert found["recompile_limit_hit"] is True
    assert found["frames_compiled"] == 3 and found["graphs"] == 3  # then it ran eagerly
    # compile ids 0, 1, 2 compiled, and the attempt for the 4th value, refused at the limit
    assert found["recompiles"] == 3
    assert found["graph_breaks"] == 0 and found["compile_s"] > 0


def test_under_the_limit_it_is_not_hit(reports):
    found = reports["under the limit"]
    assert found["recompile_limit_hit"] is False and found["frames_compiled"] == 3
    assert found["recompiles"] == 2  # one function, compile ids 0, 1, 2


def test_an_item_in_a_condition_is_a_graph_break_with_its_reason(reports):
    found = reports["an item"]
    assert found["graph_breaks"] >= 2  # one a call
    assert any("item()" in reason for reason in found["graph_break_reasons"])
    assert all("\n" not in reason for reason in found["graph_break_reasons"])  # first lines only
