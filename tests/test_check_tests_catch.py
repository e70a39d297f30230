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
    assert check_tests_catch.stale(edit) is None
    assert edit.new != edit.old


def test_a_stale_edit_is_reported():
    """The check above would pass on a stale() that never finds anything."""
    edit = check_tests_catch.EDITS[0]
    gone = check_tests_catch.Edit(edit.name, edit.path, "no such line in the code", "x",
                                  edit.tests)
    assert "holds 0 copies" in check_tests_catch.stale(gone)
    missing = check_tests_catch.Edit(edit.name, edit.path, edit.old, edit.new,
                                     ("tests/test_no_such_file.py",))
    assert "no test file tests/test_no_such_file.py" in check_tests_catch.stale(missing)
