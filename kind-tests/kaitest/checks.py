"""pytest names for the checks the suites printed as `ok NAME` / `FAIL NAME`."""
import pytest


def named(name):
    """Gives the test `name` as its id (`test_x[NAME]`), the line the check
    printed before pytest: `-k` selects on its words. The test takes a
    `check` argument (the name)."""
    return pytest.mark.parametrize("check", [name], ids=[name])
