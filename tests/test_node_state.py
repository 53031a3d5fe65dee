"""A node's state has one home (real/rounds/state.py NodeState), and the checkpoint format is a contract.

No module outside real/process/ reads or sets an attribute of the worker's `Node` (real/process/worker.py):
checkpoint and membership code work on the NodeState and the node's Checkpointer. The scan reads the
source with `ast`: inside every function of real/ outside real/process/, a parameter is taken for a
Node when it is annotated `Node` or is named `node` without an annotation (a plan's node is annotated
NodePlan), and every attribute used on it (`node.x`, `getattr(node, "x")`) is counted. Before the
move, checkpoint.py used 31 attributes of a Node (175 times) and members.py 26 (109 times).

Sets written before the move (tests/fixtures/ckpt_format4, geodt 4ca7f5c) still load: into a Node built
in this process, whose state then gives back what the files hold, key by key and in the files' order;
and a run resumed from them finishes as a run that never stopped.
"""
from __future__ import annotations

import ast
import shutil
from collections import Counter
from pathlib import Path

import pytest

from formats.plan import NodePlan, Plan

torch = pytest.importorskip("torch")

from real.checkpoint import ckpt_set  # noqa: E402
from real.checkpoint.checkpoint import latest_state, snapshot, with_set_times  # noqa: E402
from real.core.streaming import StreamingSpec  # noqa: E402
from real.process.launch import check_inputs, launch  # noqa: E402
from real.process.worker import ExecOptions, Node  # noqa: E402
from real.rounds.state import NodeState  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "ckpt_format4"
NODE_ANNOTATIONS = {"Node", "worker.Node"}


def _node_params(fn: ast.AST) -> set[str]:
    """The parameters of `fn` taken for a worker's Node (the module doc)."""
    args = fn.args
    found = set()
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is None:
            continue
        annotation = ast.unparse(arg.annotation).strip("'\"") if arg.annotation is not None else None
        if annotation in NODE_ANNOTATIONS or (arg.arg == "node" and annotation is None):
            found.add(arg.arg)
    return found


def node_uses(root: Path = ROOT) -> dict[str, Counter]:
    """{module: Counter(attribute: uses)} of the attributes used on a Node outside real/process/."""
    uses: dict[str, Counter] = {}
    for path in sorted((root / "real").rglob("*.py")):
        if "process" in path.relative_to(root / "real").parts:
            continue
        counted = Counter()
        for fn in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            names = _node_params(fn)
            for inner in ast.walk(fn) if names else ():
                if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id in names:
                    counted[inner.attr] += 1
                elif (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name)
                      and inner.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(inner.args) >= 2
                      and isinstance(inner.args[0], ast.Name) and inner.args[0].id in names):
                    name = inner.args[1]
                    counted[name.value if isinstance(name, ast.Constant) else ast.unparse(name)] += 1
        if counted:
            uses[str(path.relative_to(root))] = counted
    return uses


def test_no_module_outside_process_uses_a_node():
    assert node_uses() == {}


@pytest.mark.parametrize("source, attrs", [
    ("def save(node, row):\n    node.ckpt_first = node.rounds_done\n", {"ckpt_first": 1, "rounds_done": 1}),
    ("def f(w: Node):\n    return getattr(w, 'ckpt_every', None)\n", {"ckpt_every": 1}),
    ("class P:\n    def run(self, node: 'Node'):\n        return node.round.run()\n", {"round": 1}),
    ("g = lambda node: node.trace\n", {"trace": 1}),
])
def test_a_node_used_outside_process_is_caught(tmp_path, source, attrs):
    (tmp_path / "real" / "process").mkdir(parents=True)
    (tmp_path / "real" / "process" / "worker.py").write_text("def f(node):\n    return node.state\n")
    (tmp_path / "real" / "membership").mkdir()
    (tmp_path / "real" / "membership" / "bad.py").write_text(source)
    (tmp_path / "real" / "membership" / "fine.py").write_text(
        "def f(node: NodePlan, state: NodeState):\n    return node.gpus, state.rounds_done\n")
    assert node_uses(tmp_path) == {"real/membership/bad.py": Counter(attrs)}


def _bare_state(plan_overrides: dict, round_=None, **opts) -> NodeState:
    """A NodeState of a two-node plan, with no parts: enough for its kind and its round's own state."""
    nodes = (NodePlan(node="a", gpus=1, batch_size=1, local_steps=4, step_s=1.0),
             NodePlan(node="b", gpus=1, batch_size=1, local_steps=4, step_s=1.0))
    plan = Plan("t", nodes, comm_s=1.0, seq_len=8, **plan_overrides)
    return NodeState(0, plan, None, ExecOptions(out_dir="out", **opts), {}, torch.device("cpu"), None, round=round_)


@pytest.mark.parametrize("plan_overrides, opts, expected", [
    ({}, {}, "diloco"), ({"fragments": 2, "sync_delay_steps": 1}, {}, "streaming"),
    ({"fragment_alpha": 0.5}, {}, "streaming"),  # the executor's streaming loop, though the plan's kind is diloco
    ({}, {"streaming": StreamingSpec()}, "streaming"),  # forced
    ({"sync": "async"}, {"streaming": StreamingSpec()}, "async"),  # refused at launch (check_async)
])
def test_a_node_asks_the_kind_the_executor_runs(plan_overrides, opts, expected):
    assert _bare_state(plan_overrides, **opts).kind.name == expected


class _Kept:
    """A round keeping a state across rounds."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


def test_a_rounds_own_state_goes_to_the_bound_round_or_is_held_for_the_next():
    state = _bare_state({"fragments": 2, "sync_delay_steps": 1})
    assert state.round_state() is None
    state.take_round_state({"v": 1})  # --resume before a continue run's first epoch: held for the bind
    assert state.held_round == (None, {"v": 1}) and state.round_state() == {"v": 1}
    state.held_round = ("progress", {"v": 1})  # between epochs (Node.unbind): a restore keeps the progress
    state.take_round_state({"v": 2})
    assert state.held_round == ("progress", {"v": 2}) and state.round_state() == {"v": 2}
    state.round, state.held_round = _Kept({"v": 3}), None  # bound
    assert state.round_state() == {"v": 3}
    state.take_round_state({"v": 4})
    assert state.round.state == {"v": 4} and state.held_round is None


def _same(got, want, where: str) -> None:
    """`got` equals `want`: tensors bitwise, dicts key by key in the same order."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want), where
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for key in want:
            _same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


@pytest.fixture
def fixture_run(tmp_path, monkeypatch):
    """A copy of the fixture's run folder, the working directory (its model is a config.json beside it)."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    monkeypatch.chdir(run)
    return run


@pytest.mark.parametrize("rank", [0, 1])
def test_sets_written_before_the_move_load_into_a_node(fixture_run, rank):
    # under continue a Node is built without a process group (until its first epoch), and resume_own
    # loads a set with no collective: the whole path from the files into the state, in this process
    opts = ExecOptions(out_dir=str(fixture_run), progress=False, on_node_loss="continue", resume=True)
    spec, plan = check_inputs(fixture_run / "plan.csv", fixture_run / "scenario.toml", opts)
    node = Node(rank, plan.world_size, 0, spec, plan, opts, "gloo")
    torch.manual_seed(1234)  # the RNG the set holds must replace this
    saved = node.checkpointer.resume_own()
    assert saved is not None and saved["rounds_done"] == 1
    manifest = ckpt_set.verify(ckpt_set.set_dir(fixture_run, rank, 1), 1, rank)
    on_disk = {name: torch.load(ckpt_set.set_dir(fixture_run, rank, 1) / name, weights_only=True)
               for name in ckpt_set.PARTS}
    assert node.state.rounds_done == 1 and node.state.inner_step == plan.nodes[rank].local_steps
    # the state gives back what it loaded, in the files' layout and order (the set's own round's times
    # are the manifest's, as a resume puts them into the trace)
    again = snapshot(node.state)
    assert list(again) == list(on_disk)
    want_node = with_set_times(on_disk["node.pt"], manifest)
    _same(again["global.pt"], on_disk["global.pt"], "global.pt")
    _same({k: v for k, v in again["node.pt"].items() if k != "time_offset_s"},
          {k: v for k, v in want_node.items() if k != "time_offset_s"}, "node.pt")
    last = want_node["trace"][-1]
    assert again["node.pt"]["time_offset_s"] == last["round_end_s"] + last["ckpt_block_s"]
    # the model holds the global weights it loaded
    flat = torch.cat([p.detach().reshape(-1) for p in node.state.model.parameters()])
    assert torch.equal(flat, on_disk["global.pt"]["outer"]["global_flat"].to(flat.dtype))


@pytest.mark.slow
def test_a_run_resumed_from_sets_written_before_the_move_finishes_as_one_that_never_stopped(fixture_run, tmp_path):
    def run(out: Path, **extra) -> list[torch.Tensor]:
        options = ExecOptions(out_dir=str(out), threads=1, progress=False, **extra)
        assert launch(fixture_run / "plan.csv", fixture_run / "scenario.toml", options) == 0
        return list(torch.load(out / "final_weights.pt", weights_only=True).values())

    resumed = run(fixture_run, resume=True, checkpoint_every=1)
    whole = run(tmp_path / "whole")
    # The fixture's round-1 state was computed on another machine, whose float kernels may differ in
    # the last bit; on one machine a resume is bitwise (tests/test_real_runs.py's resume test).
    for got, want in zip(resumed, whole, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    state = latest_state(fixture_run, 1)
    assert state["rounds_done"] == 3 and [row["round"] for row in state["trace"]] == [0, 1, 2]
