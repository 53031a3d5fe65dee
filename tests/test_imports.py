"""The dependency rule, checked on the source: no module imports across a forbidden arrow.

calibrate -> profile file -> simulator -> plan file -> real, with the contracts in formats/:
simulator never imports real, real never imports simulator, calibrate imports neither,
formats imports none of calibrate, simulator, real and geodt, and neither simulator nor formats
imports torch; and no module imports another's private (`_name`) names. Every import statement
counts, at module level or inside a function (a lazy import is still an arrow); `ast` reads them
without importing anything.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("formats", "calibrate", "simulator", "real", "geodt")
FORBIDDEN = {
    "simulator": {"real", "torch"},
    "real": {"simulator"},
    "calibrate": {"simulator", "real"},
    "formats": {"calibrate", "simulator", "real", "geodt", "torch"},
}


def imported_roots(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level name) of every absolute import in the module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def violations(root: Path = ROOT) -> list[str]:
    problems = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for line, name in imported_roots(tree):
                if name in forbidden:
                    problems.append(f"{path.relative_to(root)}:{line}: {package} imports {name}")
    return problems


def test_no_import_crosses_a_forbidden_arrow():
    assert violations() == []


def private_imports(root: Path = ROOT) -> list[str]:
    """`from <project module> import _name`: a private name crossing modules."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                        and node.module.split(".")[0] in PACKAGES):
                    found += [f"{path.relative_to(root)}:{node.lineno}: {node.module}.{alias.name}"
                              for alias in node.names if alias.name.startswith("_")]
    return found


def test_no_private_name_crosses_modules():
    assert private_imports() == []


def test_an_imported_private_name_is_caught(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "bad.py").write_text("def f():\n    from real.launch import _pin_gloo\n")
    assert private_imports(tmp_path) == ["real/bad.py:2: real.launch._pin_gloo"]


def test_every_package_is_walked():
    for package in PACKAGES:
        assert list((ROOT / package).rglob("*.py")), package


@pytest.mark.parametrize("package, statement, name", [
    ("simulator", "import real", "real"),
    ("simulator", "    from real.plan import Plan", "real"),  # inside a function: still an arrow
    ("real", "from simulator import network", "simulator"),
    ("calibrate", "import simulator.scenario", "simulator"),
    ("formats", "from calibrate.catalog import get_gpu", "calibrate"),
    ("formats", "import torch", "torch"),
    ("simulator", "import torch.distributed as dist", "torch"),
])
def test_an_inserted_import_is_caught(tmp_path, package, statement, name):
    # A copy of the package with one module that holds the forbidden import.
    target = tmp_path / package
    target.mkdir()
    body = f"def f():\n{statement}\n" if statement.startswith(" ") else f"{statement}\n"
    (target / "bad.py").write_text(body)
    for other in FORBIDDEN:
        (tmp_path / other).mkdir(exist_ok=True)
    assert violations(tmp_path) == [f"{package}/bad.py:{2 if statement.startswith(' ') else 1}: "
                                    f"{package} imports {name}"]
