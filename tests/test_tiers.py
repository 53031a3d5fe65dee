"""The two tiers stay honest (tests/tiers.py): a test of the fast tier that starts a process fails, naming
it; a slow one may; the rule's tables name only files and tests that exist."""
from __future__ import annotations

import ast
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
from tiers import SLOW_MODULES, SLOW_TESTS, guard_fast_tier, is_slow

TESTS = Path(__file__).resolve().parent


class FakeNode:
    """What the guard reads of a test item: its id and its slow marker."""

    def __init__(self, slow: bool):
        self.nodeid, self.slow = "tests/test_x.py::test_y", slow

    def get_closest_marker(self, name):
        return object() if name == "slow" and self.slow else None


def test_a_fast_test_that_starts_a_subprocess_fails(monkeypatch):
    monkeypatch.delenv("GEODT_TIERS_RECORD", raising=False)
    guard_fast_tier(FakeNode(slow=False), monkeypatch)
    with pytest.raises(pytest.fail.Exception, match=r"test_y is in the fast tier but starts a process \(subprocess: "):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_a_fast_test_that_starts_a_multiprocessing_process_fails(monkeypatch):
    monkeypatch.delenv("GEODT_TIERS_RECORD", raising=False)
    guard_fast_tier(FakeNode(slow=False), monkeypatch)
    process = multiprocessing.get_context("fork").Process(target=print)
    with pytest.raises(pytest.fail.Exception, match=r"test_x.py::test_y is in the fast tier but starts a process \(multiprocessing: "):
        process.start()
    assert process._popen is None  # refused before anything was forked


def test_the_failure_passes_through_code_that_catches_exception(monkeypatch):
    """The CLI catches Exception in places: the guard's failure is a BaseException, so it still reaches pytest."""
    monkeypatch.delenv("GEODT_TIERS_RECORD", raising=False)
    guard_fast_tier(FakeNode(slow=False), monkeypatch)
    with pytest.raises(pytest.fail.Exception, match=r"test_x\.py::test_y"):
        try:
            subprocess.run(["true"], check=False)
        except Exception:  # the point: code under test that swallows errors
            pass


def test_a_slow_test_is_not_guarded(monkeypatch):
    before = subprocess.Popen.__init__
    guard_fast_tier(FakeNode(slow=True), monkeypatch)
    assert subprocess.Popen.__init__ is before


@pytest.mark.slow
def test_record_mode_lets_the_process_run_and_names_the_test(monkeypatch, tmp_path):
    record = tmp_path / "record.tsv"
    monkeypatch.setenv("GEODT_TIERS_RECORD", str(record))
    guard_fast_tier(FakeNode(slow=False), monkeypatch)
    assert subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout == "42\n"
    assert record.read_text().startswith("tests/test_x.py::test_y\tsubprocess: ")


def test_the_rule_names_files_and_tests_that_exist():
    files = {p.name for p in TESTS.glob("test_*.py")}
    assert SLOW_MODULES <= files, sorted(SLOW_MODULES - files)
    for module, patterns in SLOW_TESTS.items():
        assert module in files, module
        names = {n.name for n in ast.walk(ast.parse((TESTS / module).read_text())) if isinstance(n, ast.FunctionDef)}
        for pattern in patterns:
            assert any(is_slow(module, name) for name in names if name.startswith(pattern.rstrip("*"))), pattern


def test_is_slow_matches_a_test_with_its_parameters():
    module, pattern = next(iter(SLOW_TESTS.items()))
    assert is_slow(module, f"{pattern[0]}[argv0-flags0]") and not is_slow(module, "test_not_listed")
    assert is_slow(next(iter(SLOW_MODULES)), "test_anything")
