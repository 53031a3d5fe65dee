"""The registry of round kinds (formats/rounds.py): each kind's code resolves in its stage, the look-ups
answer as the branches they replaced did, no branch on a kind's name is left outside the registry
(tests/round_kind_branches.py), and docs/DESIGN.md's "How to add a kind of round or a strategy"
names the files that register one.
"""
from __future__ import annotations

import ast
import fnmatch
import re
from dataclasses import FrozenInstanceError
from pathlib import Path
from pkgutil import resolve_name
from types import SimpleNamespace

import pytest
from round_kind_branches import branches, count

from formats.plan import REQUIRED_COLUMNS, NodePlan, Plan, PlanError, QuorumSettings, load_plan
from formats.rounds import (
    CAPABILITIES,
    KINDS,
    SYNC_MODES,
    RoundKind,
    is_streaming,
    kinds_table,
    round_kind,
    runs_in_fragments,
)
from simulator.engines.frames import RoundEngine
from simulator.strategies import BARRIERLESS, STRATEGIES

ROOT = Path(__file__).resolve().parents[1]
NODES = (NodePlan(node="a", gpus=1, batch_size=1, local_steps=4, step_s=1.0),
         NodePlan(node="b", gpus=1, batch_size=1, local_steps=4, step_s=2.0))
DESIGN = ROOT / "docs" / "DESIGN.md"
# The branches left outside the registry: none (the last, a node's streaming round's state and the executor's
# forced streaming loop, ask NodeState.kind, `kind.state_key` and `runs_in_fragments`): a new one fails here.
RESIDUE = {}


def _file(path: str) -> Path:
    """The source file of a "module:Class" path."""
    return ROOT / (path.split(":")[0].replace(".", "/") + ".py")


@pytest.mark.parametrize("sync, fragments, expected", [
    (None, False, "diloco"), ("diloco", False, "diloco"), ("diloco", True, "streaming"),
    ("gradients", False, "gradients"), ("gradients", True, "gradients"),  # sync-ddp syncs whole: refused by plans
    ("async", False, "async"), ("async", True, "async"), ("quorum", True, "quorum"),
])
def test_a_sync_and_its_fragments_name_the_kind(sync, fragments, expected):
    assert round_kind(sync, fragments).name == expected


def test_the_syncs_are_the_kinds_own():
    assert SYNC_MODES == ("diloco", "gradients", "async", "quorum")
    with pytest.raises(KeyError):
        round_kind("gossip")
    assert [bool(b) for b in is_streaming([1, 2, 1], [0, 0, 1])] == [False, True, True]


def test_every_engine_is_a_round_engine_in_the_engines_room():
    for kind in KINDS.values():
        assert kind.engine.startswith("simulator.engines.rounds_"), kind.name
        assert issubclass(resolve_name(kind.engine), RoundEngine), kind.name


def test_every_round_class_is_defined_in_real_rounds():
    for kind in KINDS.values():
        module, name = kind.round_class.split(":")
        assert module.startswith("real.rounds.round_"), kind.name
        classes = [n.name for n in ast.walk(ast.parse(_file(kind.round_class).read_text()))
                   if isinstance(n, ast.ClassDef)]
        assert name in classes, kind.name


def test_every_round_class_resolves_to_a_round():
    pytest.importorskip("torch")
    from real.rounds.rounds import Round

    assert all(issubclass(resolve_name(kind.round_class), Round) for kind in KINDS.values())


def test_capabilities_are_known_and_refused_ones_unsupported():
    for kind in KINDS.values():
        assert set(kind.capabilities) <= set(CAPABILITIES) and set(kind.refusals) <= set(CAPABILITIES)
        assert not any(kind.supports(c) for c in kind.refusals), kind.name
    with pytest.raises(KeyError):
        KINDS["diloco"].supports("gossip")
    with pytest.raises(ValueError, match="unknown capability"):
        RoundKind("x", "diloco", "", "", True, (), True, True, "round", "", "", capabilities=frozenset({"gossip"}))


def test_the_look_ups_answer_as_the_branches_did():
    """What the replaced branches said of each kind (sync-ddp: no outer step, no padding, no per-node
    offsets; async and quorum: no barrier, cuts; quorum: no analytic path; sharding: DiLoCo only)."""
    kinds = KINDS.values()
    assert [k.name for k in kinds if not k.barrier] == ["async", "quorum"]
    assert [k.name for k in kinds if k.checkpoints == "cut"] == ["async", "quorum"]
    assert [k.name for k in kinds if not k.analytic] == ["quorum"]
    assert [k.name for k in kinds if not k.outer_step] == ["gradients"]
    assert [k.name for k in kinds if not k.supports("padded_steps")] == ["gradients"]
    assert [k.name for k in kinds if k.supports("node_offsets")] == ["diloco", "streaming"]
    assert [k.name for k in kinds if k.supports("sharding")] == ["diloco"]
    assert [k.name for k in kinds if k.supports("outage")] == ["diloco"]
    assert [k.name for k in kinds if k.supports("outer_on_cpu")] == ["diloco", "async", "quorum"]
    assert [k.name for k in kinds if k.supports("torchft")] == ["diloco", "streaming"]
    assert [k.name for k in kinds if k.settings] == ["quorum"]
    # node.pt's entry of a round's own state: the kinds whose round class keeps state across rounds
    assert {k.name: k.state_key for k in kinds if k.state_key} == {"streaming": "streaming", "async": "async",
                                                                    "quorum": "quorum"}


@pytest.mark.parametrize("settings, forced, expected", [
    ((1, 0, 0.0), None, False), ((2, 0, 0.0), None, True), ((1, 1, 0.0), None, True),
    ((1, 0, 0.5), None, True),   # α alone: the executor's streaming loop (the plan's kind stays diloco)
    ((1, 0, 0.0), (1, 0, 0.0), True),  # forced classic settings: the loop checked against the classic one
    (None, None, False), (None, (2, 1, 0.0), True),
])
def test_the_executor_runs_in_fragments_as_its_branch_did(settings, forced, expected):
    """real/core/options.py's `forced is not None or not spec.classic`, the launch check's `forced is not None`."""
    def spec(values):
        keys = ("fragments", "sync_delay_steps", "fragment_alpha")
        return None if values is None else SimpleNamespace(**dict(zip(keys, values)))
    assert runs_in_fragments(spec(settings), spec(forced)) is expected


@pytest.mark.parametrize("overrides, key, expected", [
    ({"sync": "gradients", "fragments": 2}, "fragments",
     "sync = gradients syncs every step; expected fragments 1 and sync_delay_steps 0, got 2 and 0"),
    ({"sync": "async", "adapt": "rebalance"}, "sync", "sync = async runs whole rounds without a barrier"),
    ({"sync": "quorum", "quorum": QuorumSettings(0.5, 0.0), "sync_delay_steps": 1}, "sync", "sync = quorum runs whole"),
    ({"fragments": 2, "adapt": "deadline"}, "adapt", "adapt = deadline re-plans whole DiLoCo rounds"),
    ({"quorum": QuorumSettings(0.5, 0.0)}, "quorum", "quorum and grace_s belong to sync = quorum; got sync diloco"),
])
def test_a_plan_asking_its_kind_for_what_it_lacks_is_refused(overrides, key, expected):
    with pytest.raises(PlanError) as info:
        Plan("t", NODES, comm_s=1.0, seq_len=8, **overrides)
    assert info.value.key == key and expected in str(info.value)


@pytest.mark.parametrize("sync, quorum, grace_s, key, expected", [
    ("diloco", "0.5", "", "quorum", "quorum and grace_s belong to sync = quorum; got sync diloco"),
    ("diloco", "2", "1", "quorum", "belong to sync = quorum"),  # another kind's settings, whatever their values
    ("quorum", "0.5", "", "grace_s", "expected a finite non-negative number, got None"),
    ("quorum", "", "", "quorum", "expected a share of the nodes in (0, 1], got None"),
    ("quorum", "1.5", "0", "quorum", "expected a share of the nodes in (0, 1], got 1.5"),
])
def test_a_kinds_settings_from_plan_csv_are_checked_with_the_kind(tmp_path, sync, quorum, grace_s, key, expected):
    (tmp_path / "plan.csv").write_text(f"{','.join(REQUIRED_COLUMNS)},sync,quorum,grace_s\n"
                                       f"t,a,1,1,4,1.0,32,1.0,{sync},{quorum},{grace_s}\n")
    with pytest.raises(PlanError) as info:
        load_plan(tmp_path / "plan.csv")
    assert info.value.key == f"{tmp_path / 'plan.csv'}: {key}" and expected in info.value.expected


def test_a_kinds_settings_are_one_frozen_value_on_the_plan_and_keep_their_columns(tmp_path):
    """sync = quorum's settings are the plan's `quorum` (QuorumSettings), plan.csv's quorum and grace_s on disk."""
    (tmp_path / "plan.csv").write_text(f"{','.join(REQUIRED_COLUMNS)},sync,quorum,grace_s\n"
                                       "t,a,1,1,4,1.0,32,1.0,quorum,0.5,1.5\nt,b,1,1,4,2.0,32,1.0,quorum,0.5,1.5\n")
    plan = load_plan(tmp_path / "plan.csv")
    assert plan.quorum == QuorumSettings(0.5, 1.5) and isinstance(plan.quorum.share, float)
    with pytest.raises(FrozenInstanceError):
        plan.quorum.share = 1.0
    assert [(row["quorum"], row["grace_s"]) for row in plan.rows()] == [(0.5, 1.5)] * 2
    classic = Plan("t", NODES, comm_s=1.0, seq_len=8)
    assert classic.quorum is None and {(row["quorum"], row["grace_s"]) for row in classic.rows()} == {("", "")}
    with pytest.raises(PlanError, match="expected QuorumSettings"):  # the flat share of before
        Plan("t", NODES, comm_s=1.0, seq_len=8, sync="quorum", quorum=0.5)


def test_a_strategy_lands_by_its_kind_of_round():
    assert list(BARRIERLESS) == ["async", "quorum"] and not set(BARRIERLESS) & set(STRATEGIES)


def test_no_branch_on_a_round_kind_outside_the_registry():
    assert {path: len(lines) for path, lines in count().items()} == RESIDUE


def test_an_inserted_branch_is_counted():
    source = ("def f(plan, node, opts):\n"
              "    if plan.sync == 'async':\n        pass\n"
              "    x = 1 if plan.barrierless else 2\n"
              "    if node.streaming is not None and isinstance(node.round, QuorumRound):\n        pass\n"
              "    return plan.sync in ('async', 'quorum') or plan.sync_delay_steps > 0\n"
              "def g(plan):\n    return plan.round_kind.supports('sharding') or not plan.round_kind.barrier\n")
    assert branches(source) == [2, 4, 5, 7]


def _how_to_add() -> str:
    text = DESIGN.read_text()
    return text.split("## How to add a kind of round or a strategy", 1)[1].split("\n## ", 1)[0]


def _numbered_paths() -> list[list[str]]:
    """The backticked paths of each numbered item of the section, in order."""
    items = re.findall(r"^\d+\. (.+?)(?=^\d+\. |^\s*$)", _how_to_add(), flags=re.M | re.S)
    return [re.findall(r"`([\w/<>.]+\.py)`", item) for item in items]


def test_the_how_to_add_section_names_at_most_five_files_and_they_exist():
    items = _numbered_paths()
    assert 0 < len(items) <= 5
    for paths in items:
        assert paths and all((ROOT / p).exists() or "<" in p for p in paths), paths


def _registers(path: Path) -> bool:
    """Whether a module decorates a function with @register(...)."""
    return any(isinstance(d, ast.Call) and getattr(d.func, "id", None) == "register"
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
               for d in node.decorator_list)


def test_the_files_it_names_are_the_ones_that_register():
    named = [p.replace("<kind>", "*").replace("<strategy>", "*") for paths in _numbered_paths() for p in paths]
    assert "formats/rounds.py" in named and "simulator/strategies/__init__.py" in named
    for kind in KINDS.values():  # every kind's code lies where the section says
        for path in (kind.engine, kind.round_class):
            rel = str(_file(path).relative_to(ROOT))
            assert any(fnmatch.fnmatch(rel, pattern) for pattern in named), rel
    registering = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "simulator" / "strategies").glob("*.py")
                         if _registers(p))
    assert registering and all(any(fnmatch.fnmatch(p, pattern) for pattern in named) for p in registering)
    imported = (ROOT / "simulator" / "strategies" / "__init__.py").read_text()
    assert all(f" {Path(p).stem}" in imported for p in registering)  # each registering module is imported there


def test_design_holds_the_registrys_table_of_kinds():
    assert kinds_table() in _how_to_add(), "paste formats.rounds.kinds_table() into docs/DESIGN.md"
