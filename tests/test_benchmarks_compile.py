"""Every benchmark script compiles: most run for minutes and outside CI, so a syntax error in one
would otherwise wait for the next person who runs it (bench_adaptive_real.py once did)."""
from __future__ import annotations

import py_compile
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def test_there_are_benchmarks():
    assert len(BENCHMARKS) >= 10


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_the_benchmark_compiles(path, tmp_path):
    py_compile.compile(str(path), cfile=str(tmp_path / "out.pyc"), doraise=True)
