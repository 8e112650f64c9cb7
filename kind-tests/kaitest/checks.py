"""pytest names for the checks the suites printed as `ok NAME` / `FAIL NAME`,
and output past pytest's capture."""
import contextlib

import pytest


def named(name):
    """Gives the test `name` as its id (`test_x[NAME]`), the line the check
    printed before pytest: `-k` selects on its words. The test takes a
    `check` argument (the name)."""
    return pytest.mark.parametrize("check", [name], ids=[name])


def generate(cases):
    """A module's `pytest_generate_tests` hook for a table of checks:
    `cases(check)` calls `check(name, function)` for each, in order; every
    test taking a `case` argument runs once per check, its id the name."""
    def pytest_generate_tests(metafunc):
        if "case" in metafunc.fixturenames:
            found = []
            cases(lambda name, fn: found.append((name, fn)))
            metafunc.parametrize("case", [fn for _, fn in found], ids=[name for name, _ in found])
    return pytest_generate_tests


@contextlib.contextmanager
def uncaptured(request):
    """Output straight to the terminal, past pytest's capture: what a
    fixture prints at its teardown when a test failed (logs) is seen even
    when the test it tears down with passed (pytest shows a passed test's
    captured output nowhere)."""
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        yield
