"""The dependency rule, checked on the source: no module imports across a forbidden arrow.

calibrate -> profile file -> simulator -> plan file -> real. The contracts live in formats/, the
shared facts (GPU catalog, presets) in facts/, the one training step in train/. No stage
imports another stage (calibrate, simulator and real import none of each other); formats
imports nothing of the project, facts only formats, train only formats and facts; formats,
facts and simulator never import torch; only geodt/ composes stages. No module imports
another's private (`_name`) names, and no import cycle exists between modules. Every import
statement counts, at module level or inside a function (a lazy import is still an arrow); `ast`
reads them without importing anything. Inside simulator/, its rooms (models, engines, strategies,
outputs, sweep, the commands) import down only (SIMULATOR_ROOMS); inside real/, its rooms (core,
rounds, checkpoint, membership, wan, process) likewise (REAL_ROOMS).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("formats", "facts", "train", "calibrate", "simulator", "real", "geodt")
STAGES = {"calibrate", "simulator", "real", "geodt"}
FORBIDDEN = {
    "formats": STAGES | {"facts", "train", "torch"},
    "facts": STAGES | {"train", "torch"},
    "train": STAGES,
    "calibrate": STAGES - {"calibrate"},
    "simulator": STAGES - {"simulator"} | {"train", "torch"},
    "real": STAGES - {"real"},
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
    (tmp_path / "real" / "bad.py").write_text("def f():\n    from real.process.launch import _pin_gloo\n")
    assert private_imports(tmp_path) == ["real/bad.py:2: real.process.launch._pin_gloo"]


def test_every_package_is_walked():
    for package in PACKAGES:
        assert list((ROOT / package).rglob("*.py")), package


@pytest.mark.parametrize("package, statement, name", [
    ("simulator", "import real", "real"),
    ("simulator", "    from real.plan import Plan", "real"),  # inside a function: still an arrow
    ("real", "from simulator.models import network", "simulator"),
    ("calibrate", "import simulator.scenario", "simulator"),
    ("formats", "from facts.catalog import get_gpu", "facts"),
    ("formats", "from calibrate.harness import Calibrator", "calibrate"),
    ("formats", "import torch", "torch"),
    ("simulator", "import torch.distributed as dist", "torch"),
    ("simulator", "from calibrate.harness import Calibrator", "calibrate"),
    ("real", "    from calibrate.harness import describe_device", "calibrate"),
    ("facts", "import torch", "torch"),
    ("train", "from real.core.sync import encode", "real"),
    ("calibrate", "from geodt.calibration import links", "geodt"),
])
def test_an_inserted_import_is_caught(tmp_path, package, statement, name):
    # A copy of the package with one module that holds the forbidden import.
    target = tmp_path / package
    target.mkdir()
    body = f"def f():\n{statement}\n" if statement.startswith(" ") else f"{statement}\n"
    (target / "bad.py").write_text(body)
    for other in FORBIDDEN:
        (tmp_path / other).mkdir(exist_ok=True)
    assert violations(tmp_path) == [(f"{package}/bad.py:{2 if statement.startswith(' ') else 1}: "
                                    f"{package} imports {name}")]


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the project modules it imports (absolute and relative, anywhere in the file)."""
    paths = {module_name(p, root): p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                # `from package import module` depends on the module; `from module import name` on the module
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names}
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_an_import_cycle_is_caught(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "real" / "a.py").write_text("from real import b\n")
    (tmp_path / "real" / "b.py").write_text("def f():\n    from .c import g\n")
    (tmp_path / "real" / "c.py").write_text("import real.a\n")
    (tmp_path / "real" / "d.py").write_text("import real.a\n")
    assert cycles(import_graph(tmp_path)) == [["real.a", "real.b", "real.c"]]


# simulator/'s rooms, bottom up: models/ (what a step, a link, a round cost), engines/ (the clocks),
# strategies/ (the plans), outputs/ (files, figures, the report), sweep/ (`geodt sweep`), and at the
# top cli.py. An arrow runs down only. scenario.py sits beside models/: it reads models' drift,
# outage and netfit (parts of a scenario), and models read the Scenario it builds. strategies/ may
# import engines/ (barrierless and streaming plan with the engines' arithmetic); sweep/ may import
# simulator.cli (`geodt sweep --table` is `geodt simulate`'s table, with its checks).
SIMULATOR_ROOMS = {
    "simulator.models": ("simulator.engines", "simulator.strategies", "simulator.outputs", "simulator.sweep",
                         "simulator.cli"),
    "simulator.scenario": ("simulator.engines", "simulator.strategies", "simulator.outputs", "simulator.sweep",
                           "simulator.cli"),
    "simulator.engines": ("simulator.strategies", "simulator.outputs", "simulator.sweep", "simulator.cli"),
    "simulator.strategies": ("simulator.outputs", "simulator.sweep", "simulator.cli"),
    "simulator.outputs": ("simulator.sweep", "simulator.cli"),
    "simulator.cli": ("simulator.sweep",),
}


def in_room(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


# real/'s rooms, bottom up: core/ (config, options, data, the DiLoCo and Streaming arithmetic, sync,
# sharding, groups), rounds/ (the Round interface, the inner-step loop, each kind of round, adaptive,
# trace), checkpoint/ (a checkpoint holds an async or quorum cut: it imports rounds/), membership/
# (members, the membership store's protocol, injected faults), and at the top process/ (worker,
# process, launch, supervise, respawn, outdir, cli). wan/ (the shaped WAN) imports nothing of real/
# and only process/ imports it.
REAL_ROOMS = {
    "real.core": ("real.rounds", "real.checkpoint", "real.membership", "real.wan", "real.process"),
    "real.rounds": ("real.checkpoint", "real.membership", "real.wan", "real.process"),
    "real.checkpoint": ("real.membership", "real.wan", "real.process"),
    "real.membership": ("real.wan", "real.process"),
    "real.wan": ("real.core", "real.rounds", "real.checkpoint", "real.membership", "real.process"),
}
ROOMS = {**SIMULATOR_ROOMS, **REAL_ROOMS}


def room_violations(root: Path = ROOT) -> list[str]:
    graph = import_graph(root)
    return sorted(f"{module} imports {target}" for module, targets in graph.items() for target in targets
                  for room, forbidden in ROOMS.items()
                  if in_room(module, room) and any(in_room(target, f) for f in forbidden))


def test_simulator_rooms_import_down_only():
    assert room_violations() == []


def test_real_rooms_import_down_only():
    assert [v for v in room_violations() if v.startswith("real.")] == []


def test_every_real_module_sits_in_a_room():
    rooms = (*REAL_ROOMS, "real.process", "real.__main__")
    loose = [m for m in import_graph() if in_room(m, "real") and m != "real"
             and not any(in_room(m, r) for r in rooms)]
    assert loose == []


def test_every_simulator_module_sits_in_a_room():
    rooms = (*SIMULATOR_ROOMS, "simulator.sweep", "simulator.__main__")
    loose = [m for m in import_graph() if in_room(m, "simulator") and m != "simulator"
             and not any(in_room(m, r) for r in rooms)]
    assert loose == []


@pytest.mark.parametrize("room, statement, target", [
    ("models", "from simulator.engines.engine import simulate", "simulator.engines.engine"),
    ("models", "    from simulator.outputs.report import answer", "simulator.outputs.report"),
    ("engines", "from simulator.strategies import make_plan", "simulator.strategies"),
    ("strategies", "from simulator.sweep import sweep", "simulator.sweep.sweep"),
    ("outputs", "    from simulator.sweep.sweep import SweepSpec", "simulator.sweep.sweep"),
])
def test_an_arrow_up_between_rooms_is_caught(tmp_path, room, statement, target):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    for name in ("models", "engines", "strategies", "outputs", "sweep"):
        (tmp_path / "simulator" / name).mkdir()
        (tmp_path / "simulator" / name / "__init__.py").write_text("")
    for module in ("engines/engine", "outputs/report", "sweep/sweep"):
        (tmp_path / "simulator" / f"{module}.py").write_text("")
    body = f"def f():\n{statement}\n" if statement.startswith(" ") else f"{statement}\n"
    (tmp_path / "simulator" / room / "bad.py").write_text(body)
    assert room_violations(tmp_path) == [f"simulator.{room}.bad imports {target}"]


@pytest.mark.parametrize("room, statement, target", [
    ("core", "from real.rounds.rounds import Round", "real.rounds.rounds"),
    ("core", "    from real.process.launch import launch", "real.process.launch"),  # inside a function
    ("rounds", "from real.checkpoint import checkpoint", "real.checkpoint.checkpoint"),
    ("checkpoint", "from real.membership.members import Fixed", "real.membership.members"),
    ("membership", "    from real.wan.wan import lost_message", "real.wan.wan"),
    ("membership", "from real.process.worker import Node", "real.process.worker"),
    ("wan", "from real.core.options import PeerLost", "real.core.options"),
])
def test_an_arrow_up_between_real_rooms_is_caught(tmp_path, room, statement, target):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    for name in ("core", "rounds", "checkpoint", "membership", "wan", "process"):
        (tmp_path / "real" / name).mkdir()
        (tmp_path / "real" / name / "__init__.py").write_text("")
    for module in ("core/options", "rounds/rounds", "checkpoint/checkpoint", "membership/members", "wan/wan",
                   "process/launch", "process/worker"):
        (tmp_path / "real" / f"{module}.py").write_text("")
    body = f"def f():\n{statement}\n" if statement.startswith(" ") else f"{statement}\n"
    (tmp_path / "real" / room / "bad.py").write_text(body)
    assert room_violations(tmp_path) == [f"real.{room}.bad imports {target}"]


def test_an_arrow_down_between_real_rooms_passes(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    for name in ("core", "rounds", "process"):
        (tmp_path / "real" / name).mkdir()
        (tmp_path / "real" / name / "__init__.py").write_text("")
    (tmp_path / "real" / "core" / "options.py").write_text("")
    (tmp_path / "real" / "rounds" / "rounds.py").write_text("from real.core.options import PeerLost\n")
    (tmp_path / "real" / "process" / "worker.py").write_text("from real.rounds.rounds import Round\n")
    assert room_violations(tmp_path) == []
