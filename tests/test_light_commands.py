"""The light commands run where torch cannot be imported, and every import left inside a function says why.

A core install (`pip install -e .`) has no torch. Here a sitecustomize.py on PYTHONPATH puts a finder
first on sys.meta_path that refuses torch, transformers, torchft, pyroute2 and dask (and records each
attempt), so `python -m geodt ...` runs as on a core install even where torch is installed: the
README's light commands must work and must not even try to import them (issue 57). Imports stay at
the top of a module except where one is deferred for a reason (a light command's start, a cycle):
each such import carries `# deferred: <reason>` on its line or the line above (ruff's PLC0415 names
the ones without a noqa).
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("formats", "facts", "train", "calibrate", "simulator", "real", "geodt")
BLOCKED = ("torch", "transformers", "torchft", "pyroute2", "dask", "distributed")

BLOCKER = f'''
import os, sys

BLOCKED = {BLOCKED!r}


class Blocker:
    """Refuses the blocked packages (as if not installed) and records each attempt."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            with open(os.environ["GEODT_BLOCKED_LOG"], "a") as log:
                log.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None


sys.meta_path.insert(0, Blocker())
'''

# The README's light commands (its quick start and "Which command answers what?"), each with what it prints
LIGHT = [
    (["--help"], "usage: geodt COMMAND"),
    (["--version"], "torch "),
    (["simulate", "paper", "--out", "{tmp}/simulate"], "recommended: "),
    (["plan", "paper", "--strategy", "hybrid", "--out", "{tmp}/plan"], "hybrid"),
    (["sweep", "--table", "paper", "--out", "{tmp}/table"], "baseline"),
    (["catalog"], "h100"),
    (["profile", "check", str(ROOT / "profiles" / "cpu-1thread.csv")], "batch"),
] + [([command, "--help"], "usage:") for command in
     ("simulate", "plan", "sweep", "calibrate", "profile", "run", "validate", "paper", "catalog")] + [
    (["calibrate", mode, "--help"], "usage:") for mode in ("device", "network", "scenario", "convergence")]


def blocked_run(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`python -m geodt ARGS` with the blocker first on sys.meta_path; (the process, the imports it tried)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    log = tmp_path / "blocked.log"
    log.write_text("")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "GEODT_BLOCKED_LOG": str(log), "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-m", "geodt", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    return done, log.read_text().split()


def test_the_blocker_blocks(tmp_path):
    # the blocker must work, or every test below would pass for nothing
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    log = tmp_path / "blocked.log"
    env = {**os.environ, "PYTHONPATH": str(site), "GEODT_BLOCKED_LOG": str(log)}
    done = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 1 and "No module named 'torch' (blocked)" in done.stderr
    assert log.read_text().split() == ["torch"]


@pytest.mark.parametrize("argv, says", LIGHT, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_light_command_runs_without_trying_torch(tmp_path, argv, says):
    done, tried = blocked_run([a.format(tmp=tmp_path) for a in argv], tmp_path)
    assert done.returncode == 0, done.stderr
    assert says in done.stdout
    assert tried == [], f"geodt {' '.join(argv)} tried to import {tried}"


def deferred_imports(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file, line, the import) of every import inside a function of the packages."""
    found = []

    def walk(node, inside: bool, name: str, lines: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((name, child.lineno, lines[child.lineno - 1]))
            walk(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)), name, lines)

    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text()
            walk(ast.parse(text), False, str(path.relative_to(root)), text.splitlines())
    return found


def unexplained(root: Path = ROOT) -> list[str]:
    """The deferred imports whose line, or the comment above it (over the imports of the same block), gives
    no `deferred:` reason."""
    bad = []
    for name, line, text in deferred_imports(root):
        lines = (root / name).read_text().splitlines()
        above = line - 2
        while above >= 0 and lines[above].strip().startswith(("import ", "from ")):
            above -= 1
        comment = lines[above].strip() if above >= 0 else ""
        if "deferred:" not in text and not (comment.startswith("#") and "deferred:" in comment):
            bad.append(f"{name}:{line}: {text.strip()}")
    return bad


def test_every_import_inside_a_function_says_why():
    assert unexplained() == []


def test_an_import_without_its_reason_is_caught(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "real" / "a.py").write_text(
        "def f():\n    import torch  # noqa: PLC0415  deferred: torch only here\n\n\n"
        "def g():\n    # deferred: pyroute2 only with --wan shaped\n    import pyroute2  # noqa: PLC0415\n\n\n"
        "def h():\n    # deferred: torch's submodules only here\n    import torch\n    import torch.distributed\n\n\n"
        "def i():\n    import json\n")
    assert unexplained(tmp_path) == ["real/a.py:17: import json"]
