"""A plan's open values are filled from its scenario in one place (issue 57, item 3): Plan.settings /
Plan.settings_from give the rounds, collective and payload dtype a plan runs with, and no consumer in
simulator/, geodt/, formats/ or calibrate/ merges `plan.X or scenario.Y` itself. plan.csv keeps its
empty cells for what the plan leaves to the scenario (docs/DESIGN.md: a file contract)."""
from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

from formats.plan import NodePlan, Plan, SyncSettings

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simulator", "geodt", "formats", "calibrate")  # real/ resolves its RunSpec on its own branch
# the values a plan may leave to its scenario (None in the plan), merged only by the resolver
OPEN_VALUES = {"rounds", "collective", "payload_dtype", "outer_state"}
RESOLVER = {("formats/plan.py", "resolved")}  # fills outer_state (a run's, not a sync setting) beside settings()


def _terminal(node: ast.AST) -> str | None:
    """`rounds` for `plan.rounds`, `scenario.training.rounds` or a bare `rounds`."""
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def _merge(node: ast.AST) -> str | None:
    """The open value an expression merges: `a.X or b.X` (or `a.X or X`), or `a.X if ... else b.X`."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and isinstance(node.values[0], ast.Attribute):
        name = node.values[0].attr
        if name in OPEN_VALUES and any(_terminal(v) == name for v in node.values[1:]):
            return name
    if isinstance(node, ast.IfExp) and isinstance(node.body, ast.Attribute):
        name = node.body.attr
        if name in OPEN_VALUES and _terminal(node.orelse) == name:
            return name
    return None


def merges(source: str, path: str = "<snippet>") -> list[str]:
    """`path:line name` for every merge of a plan's open value with a default, outside RESOLVER."""
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        name = _merge(node)
        if name is not None and (path, function) not in RESOLVER:
            found.append(f"{path}:{node.lineno} {name}")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), None)
    return found


def product_merges() -> list[str]:
    found = []
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            found += merges(file.read_text(), file.relative_to(ROOT).as_posix())
    return found


def test_no_consumer_merges_a_plan_value_with_its_scenario():
    assert product_merges() == []


def test_the_scan_finds_each_shape_of_merge():
    """Negative control: each way a consumer could merge again is found; look-alikes are not."""
    snippet = "\n".join([
        "def f(plan, scenario, p, net, rounds):",
        "    a = plan.rounds or scenario.training.rounds",
        "    b = p.collective or net.collective",
        "    c = plan.payload_dtype if plan.payload_dtype is not None else scenario.network.payload_dtype",
        "    d = self.outer_state or outer_state",
        "    e = plan.sync or 'diloco'",  # a plan's default, not its scenario's
        "    g = plan.note or scenario.name",
        "    h = plan.settings_from(scenario).rounds",
    ])
    assert merges(snippet) == ["<snippet>:2 rounds", "<snippet>:3 collective", "<snippet>:4 payload_dtype",
                               "<snippet>:5 outer_state"]
    resolver = "class Plan:\n    def resolved(self, outer_state):\n        return self.outer_state or outer_state\n"
    assert merges(resolver, "formats/plan.py") == []
    assert merges(resolver, "simulator/cli.py") == ["simulator/cli.py:3 outer_state"]


def _plan(**own) -> Plan:
    nodes = [NodePlan("a", 1, 4, 10, 0.1), NodePlan("b", 2, 8, 5, 0.2)]
    return Plan("s", nodes, comm_s=1.0, seq_len=16, **own)


SCENARIO = SimpleNamespace(training=SimpleNamespace(rounds=7),
                           network=SimpleNamespace(collective="partitioned", payload_dtype="int8", bandwidth_gbps=1.0),
                           nodes=[SimpleNamespace(name="a", uplink_gbps=None), SimpleNamespace(name="b")])


def test_settings_fill_what_the_plan_leaves_open_and_keep_its_own():
    assert _plan().settings_from(SCENARIO) == SyncSettings(7, "partitioned", "int8")
    own = _plan(rounds=70, collective="ring", payload_dtype="fp32")
    assert own.settings_from(SCENARIO) == SyncSettings(70, "ring", "fp32")
    resolved = _plan(rounds=70).resolved_from(SCENARIO)  # the full resolver agrees with settings
    assert (resolved.rounds, resolved.collective, resolved.payload_dtype) == (70, "partitioned", "int8")
    assert resolved.settings_from(SCENARIO) == _plan(rounds=70).settings_from(SCENARIO)


def test_plan_csv_keeps_empty_cells_for_values_left_to_the_scenario():
    row = _plan(collective="ring").rows()[0]
    assert (row["rounds"], row["collective"], row["payload_dtype"]) == ("", "ring", "")
