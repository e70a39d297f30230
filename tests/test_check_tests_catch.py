"""scripts/check_tests_catch.py lists careless edits the suite must catch; each must still apply
to today's code (its line there exactly once) and name test files that exist, or the check
silently stops checking. Running the edits is the script's job (a minute or two), not the
suite's."""
from __future__ import annotations

import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import check_tests_catch  # noqa: E402


@pytest.mark.parametrize("edit", check_tests_catch.EDITS, ids=lambda edit: edit.name)
def test_each_edit_still_applies(edit):
    text = (ROOT / edit.path).read_text()
    assert text.count(edit.old) == 1, f"{edit.path} no longer holds {edit.old!r} once"
    assert edit.new != edit.old and all((ROOT / test).is_file() for test in edit.tests)
