"""One scenario schema: every section's keys defined once, in one style (`key()`, formats/sections.py).

[training], [network], [simulation] (formats/sections.py), [model], [diloco] (formats/scenario.py)
and [[nodes]] (simulator/scenario.py). The simulator and the executor read the shared sections
through the same classes; docs/DESIGN.md's lines for every section are rendered from the same
metadata; and no stage's scenario reader keeps a second copy of a default or of an allowed-value
list (checked on the source with `ast`).
"""
from __future__ import annotations

import ast
from dataclasses import MISSING, fields, replace
from pathlib import Path

import pytest

from formats.scenario import DilocoConfig, ModelSection
from formats.scenario_doc import DESIGN, NODES, SECTIONS, render_section, written_section
from formats.sections import NetworkConfig, SimulationConfig, TrainingConfig
from simulator.scenario import NodeConfig

ROOT = Path(__file__).resolve().parents[1]
# The stages' scenario readers: neither may define a default or an allowed value of these sections.
READERS = ("simulator/scenario.py", "real/core/config.py")
CLASSES = (TrainingConfig, NetworkConfig, SimulationConfig, ModelSection, DilocoConfig)
KEYS = {f.name for cls in CLASSES for f in fields(cls)}
STRING_DEFAULTS = {f.default for cls in CLASSES for f in fields(cls) if isinstance(f.default, str)}
CHOICES = {c for cls in CLASSES for f in fields(cls) for c in f.metadata["choices"]}


@pytest.mark.parametrize("name", [s[0] for s in SECTIONS])
def test_design_md_holds_exactly_the_rendered_section(name):
    assert written_section(DESIGN.read_text(), name) == render_section(name), \
        "docs/DESIGN.md differs from the keys' definition: run `python -m formats.scenario_doc`"


def test_design_md_holds_exactly_the_rendered_nodes():
    assert written_section(DESIGN.read_text(), NODES) == render_section(NODES, NodeConfig), \
        ("docs/DESIGN.md's [[nodes]] differs from simulator/scenario.py: run `python -c 'from "
         "formats.scenario_doc import rewrite; from simulator.scenario import NodeConfig; rewrite(nodes=NodeConfig)'`")


@pytest.mark.parametrize("cls", CLASSES + (NodeConfig,), ids=lambda c: c.__name__)
def test_every_key_is_made_by_key_with_a_one_line_doc(cls):
    """One style for every section: each field made by `key()` (its metadata), with a default, a
    factory or REQUIRED, and an example wherever docs cannot show a default."""
    for f in fields(cls):
        doc = f.metadata.get("doc", "")
        assert doc and "\n" not in doc and "checks" in f.metadata, f"{cls.__name__}.{f.name}"
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        assert has_default or f.metadata["example"] is not None, f"{cls.__name__}.{f.name}"
        if f.default is None or not has_default:
            assert f.metadata["example"] is not None, f"{cls.__name__}.{f.name}"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_the_defaults_pass_the_checks(cls):
    cls(**({"preset": "tiny"} if cls is ModelSection else {}))


@pytest.mark.parametrize("cls, name, value, message", [
    (TrainingConfig, "rounds", 10**6 + 1, "expected an integer from 1 to 1000000"),
    (ModelSection, "seq_len", 10**7 + 1, "expected an integer from 1 to 10000000"),
    (NetworkConfig, "bandwidth_gbps", 2e6, "expected a number from 1e-06 to 1e+06"),
    (NodeConfig, "intra_node_gbps", 1e-4, "expected a number from 0.001 to 1e+06"),
])
def test_a_keys_bounds_sit_beside_it(cls, name, value, message):
    """Bounds are the key's own (`key(..., bounds=)`), checked with its other checks."""
    from formats.errors import FieldError

    base = {"ModelSection": {"preset": "tiny"}, "NodeConfig": {"name": "a", "gpus": {"cpu": 1}}}
    with pytest.raises(FieldError) as refused:
        cls(**base.get(cls.__name__, {}), **{name: value})
    assert (refused.value.key, refused.value.expected.split(",")[0]) == (name, message)


@pytest.mark.parametrize("cls, name, value, message", [
    (DilocoConfig, "weight_decay", float("nan"), "expected a number >= 0, got nan"),
    (DilocoConfig, "outer_momentum", 1.0, "expected 0 <= momentum < 1, got 1.0"),
    (DilocoConfig, "fragment_alpha", float("nan"), "expected a number in [0, 1], got nan"),
    (DilocoConfig, "sync_delay_steps", -1, "expected an integer >= 0, got -1"),
    (SimulationConfig, "jitter_cv", 10.0, "expected a number in [0, 10), got 10.0"),
    (SimulationConfig, "detect_s", float("nan"), "expected seconds from 0 to 1e7, got nan"),
])
def test_a_range_check_refuses_in_one_line_nan_included(cls, name, value, message):
    """The checks made by formats/sections.py's value_check: the field, what was expected, the value."""
    from formats.errors import FieldError

    with pytest.raises(FieldError) as refused:
        cls(**{name: value})
    assert (refused.value.key, refused.value.expected) == (name, message)


def second_copies(source: str) -> list[str]:
    """Where `source` (a scenario reader) holds what only formats/sections.py may: a string default,
    a list of allowed values, `.get(<key>, <default>)`, or a class field named as a key with a default."""
    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(n) is not None}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in STRING_DEFAULTS and id(node) not in docstrings:
            found.append(f"line {node.lineno}: the default {node.value!r}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(
                isinstance(e, ast.Constant) and e.value in CHOICES for e in node.elts):
            found.append(f"line {node.lineno}: a list of allowed values")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and len(node.args) == 2 and isinstance(node.args[0], ast.Constant) and node.args[0].value in KEYS):
            found.append(f"line {node.lineno}: .get({node.args[0].value!r}, <a default>)")
        elif isinstance(node, ast.ClassDef):
            found += [f"line {s.lineno}: field {s.target.id} = <a default>" for s in node.body
                      if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id in KEYS
                      and s.value is not None and not _absent(s.value)]
    return found


def _absent(value: ast.expr) -> bool:
    """A field with no default of its own: `None`, or `key(None, ...)` (a node's own value of a
    [training] key, absent unless given)."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "key" and value.args:
        value = value.args[0]
    return isinstance(value, ast.Constant) and value.value is None


@pytest.mark.parametrize("reader", READERS)
def test_no_scenario_reader_keeps_a_second_copy(reader):
    assert second_copies((ROOT / reader).read_text()) == []


@pytest.mark.parametrize("copy", [
    'class RunSpec:\n    collective: str = "ring"\n',
    "class RunSpec:\n    latency_ms: float = 1.0\n",
    'def f(network):\n    return network.get("latency_ms", 1.0)\n',
    'def f(training):\n    return training.get("compile", "auto")\n',
    'def f(sim):\n    require_choice(sim, "variability", ("given", "profile"))\n',
    'X = "fp32"\n',
    'class NodeConfig:\n    sharding: str = key("auto", "a second default")\n',
    "class RunSpec:\n    seq_len: int = 1024\n",
    'def f(diloco):\n    return diloco.get("outer_lr", 0.7)\n',
])
def test_a_second_copy_is_caught(copy):
    assert second_copies(copy)


def test_executor_and_simulator_read_the_same_defaults(tmp_path):
    """A scenario that gives only what the executor requires: every value it reads is the section's default."""
    from real.core.config import load_run_spec

    path = tmp_path / "scenario.toml"
    path.write_text('name = "t"\n[model]\npreset = "tiny"\n[training]\nrounds = 3\n')
    spec = load_run_spec(path)
    training, network, simulation = TrainingConfig(), NetworkConfig(), SimulationConfig()
    assert (spec.training, spec.network, spec.simulation) == (replace(training, rounds=3), network, simulation)


@pytest.mark.parametrize("section, line, message", [
    ("network", "bandwidth = 1.0", "network.bandwidth: unknown key; expected one of bandwidth_gbps"),
    ("network", 'collective = "tree"', "network.collective: expected one of ring, partitioned, got 'tree'"),
    ("simulation", "mtbf_s = 0", "simulation.mtbf_s: expected seconds between failures"),
    ("training", 'compile = "yes"', "training.compile: expected one of auto, on, off, got 'yes'"),
])
def test_both_stages_refuse_a_bad_key_alike(tmp_path, section, line, message):
    """The same one-line message from the simulator (InputError) and the executor (ConfigError)."""
    from formats.errors import InputError
    from real.core.config import ConfigError, load_run_spec
    from simulator.scenario import load_scenario

    path = tmp_path / "scenario.toml"
    tables = {"model": 'preset = "tiny"', "training": "rounds = 3"}
    tables[section] = "\n".join(filter(None, [tables.get(section), line]))
    text = 'name = "t"\n' + "".join(f"[{name}]\n{body}\n" for name, body in tables.items())
    text += '[[nodes]]\nname = "a"\ngpus = { "cpu" = 1 }\n'
    path.write_text(text)
    with pytest.raises(InputError) as simulated:
        load_scenario(str(path))
    with pytest.raises(ConfigError) as executed:
        load_run_spec(path)
    assert str(simulated.value).startswith(f"{path}: {message}")
    assert str(executed.value).startswith(f"{path}: {message}")


def test_a_keys_shorthand_is_made_from_the_key_alone():
    """--target-loss and --checkpoint-every are made from their keys (formats/cli.py SHORTHANDS): no
    command writes such a flag, its type or its `--set` by hand."""
    from formats.cli import SHORTHANDS

    hand_written = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        if path.parts[len(ROOT.parts)] in ("tests", "benchmarks", ".venv-ci"):
            continue
        text = path.read_text()
        for name, (section, flag, _) in SHORTHANDS.items():
            if f'"{flag}", type' in text or f'"{section}.{name}=' in text:
                hand_written.append(f"{path.relative_to(ROOT)}: {flag}")
    assert hand_written == []


@pytest.mark.parametrize("argv, message", [
    (["--checkpoint-every", "0"], "argument --checkpoint-every: '0': expected a positive integer (rounds between"),
    (["--target-loss", "-1"], "argument --target-loss: '-1': expected a positive finite number"),
])
def test_a_shorthand_refuses_what_its_key_refuses(argv, message, capsys):
    from geodt.run_cmd import _parser

    with pytest.raises(SystemExit) as refused:
        _parser("geodt validate", validate=True).parse_args(["hetero-cpu", *argv])
    assert refused.value.code == 2 and message in capsys.readouterr().err


def test_a_shorthand_is_recorded_as_its_key(tmp_path):
    from simulator.cli import simulate_main

    assert simulate_main(["paper", "--target-loss", "3.5", "--out", str(tmp_path / "o")]) == 0
    assert "target_loss = 3.5" in (tmp_path / "o" / "scenario.toml").read_text()


def test_both_stages_take_the_same_top_level_keys(tmp_path):
    """One list of top-level keys (formats/sections.py): the executor accepted `description`, which the
    simulator refuses."""
    from formats.errors import InputError
    from real.core.config import ConfigError, load_run_spec
    from simulator.scenario import load_scenario

    path = tmp_path / "scenario.toml"
    path.write_text('name = "t"\ndescription = "x"\n[model]\npreset = "tiny"\n[training]\nrounds = 3\n'
                    '[[nodes]]\nname = "a"\ngpus = { "cpu" = 1 }\n')
    with pytest.raises(InputError) as simulated:
        load_scenario(str(path))
    with pytest.raises(ConfigError) as executed:
        load_run_spec(path)
    message = f"{path}: description: unknown key; expected one of name, seed, model, training, network, diloco"
    assert str(simulated.value).startswith(message) and str(executed.value).startswith(message)
