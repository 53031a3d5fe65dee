"""Count the branches on the round kind in the product code (issue 57): `python tests/round_kind_branches.py`.

A branch on the round kind is an expression that tells diloco, gradients (sync-ddp), streaming, async and
quorum apart by name or by a kind-shaped flag: a comparison of a `sync` value with a kind's name
(`plan.sync == "async"`, `sync in ("async", "quorum")`), a name in BARRIERLESS_SYNCS, a test of
`.barrierless` or `.streaming` (a plan's, a node's streaming round, an executor's forced streaming), or
isinstance against a Round class. What a kind is, what it has and supports, is formats/rounds.py's
registry: its look-ups (`round_kind(plan)`, `kind.barrier`, `kind.supports(...)`) are not branches, and
the registry itself (REGISTRY_FILES) may name kinds. The count outside it is held at zero by
tests/test_round_kinds.py.
"""
from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("formats", "facts", "train", "calibrate", "simulator", "real", "geodt")
KIND_NAMES = {"diloco", "gradients", "streaming", "async", "quorum"}
# attributes that say which kind a plan or node runs: a plan's flags, a node's streaming round, an executor's
# forced streaming (`opts.streaming is not None`), a StreamingSpec's `classic`
KIND_FLAGS = {"barrierless", "streaming", "classic"}
ROUND_CLASSES = {"ClassicRound", "GradientRound", "StreamingRound", "AsyncRound", "QuorumRound", "ServerRound"}
REGISTRY_FILES = ("formats/rounds.py",)


def _names(node: ast.AST) -> set[str]:
    """The kind names a comparison operand spells: a string, or a tuple / list / set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & KIND_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names(e) for e in node.elts)) if node.elts else set()
    return set()


def _terminal(node: ast.AST) -> str | None:
    """`sync` for `plan.sync`, `node.plan.sync` or a bare `sync`; None for anything else."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _streaming_test(node: ast.Compare) -> bool:
    """`sync_delay_steps > 0` (or `delay > 0`), the half of Streaming DiLoCo's own test
    (`fragments > 1 or sync_delay_steps > 0`) that only it has: `fragments > 1` alone also sizes a payload."""
    if len(node.ops) != 1 or not isinstance(node.ops[0], ast.Gt) or not isinstance(node.comparators[0], ast.Constant):
        return False
    return _terminal(node.left) in ("sync_delay_steps", "delay") and node.comparators[0].value == 0


def _tested(tree: ast.AST) -> list[ast.AST]:
    """Every expression used as a condition: if / while / assert / conditional-expression tests and
    comprehension filters, with the operands of `and`, `or`, `not` and comparisons inside them."""
    out, stack = [], []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            stack.append(node.test)
        elif isinstance(node, ast.comprehension):
            stack.extend(node.ifs)
    while stack:
        node = stack.pop()
        out.append(node)
        if isinstance(node, ast.BoolOp):
            stack.extend(node.values)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            stack.append(node.operand)
        elif isinstance(node, ast.Compare):
            stack.extend([node.left, *node.comparators])
    return out


def branches(source: str) -> list[int]:
    """The line of each branch on the round kind in one module's source."""
    tree = ast.parse(source)
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_terminal(o) == "sync" for o in operands) and any(_names(o) for o in operands):
                lines.add(node.lineno)
            if _streaming_test(node):
                lines.add(node.lineno)  # `fragments > 1 or sync_delay_steps > 0`: the streaming kind's own test
            if isinstance(node.left, ast.Attribute) and node.left.attr in KIND_FLAGS:
                lines.add(node.lineno)  # `node.streaming is not None`, wherever it is
        elif isinstance(node, ast.Name) and node.id == "BARRIERLESS_SYNCS" and isinstance(node.ctx, ast.Load):
            lines.add(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "barrierless" and isinstance(node.ctx, ast.Load):
            lines.add(node.lineno)
        elif (isinstance(node, ast.Call) and _terminal(node.func) == "isinstance" and len(node.args) == 2
              and {_terminal(a) for a in ast.walk(node.args[1])} & ROUND_CLASSES):
            lines.add(node.lineno)
    for node in _tested(tree):
        if isinstance(node, ast.Compare):
            node = node.left  # `x.streaming is not None`
        if isinstance(node, ast.Attribute) and node.attr in KIND_FLAGS:
            lines.add(node.lineno)
    return sorted(lines)


def count(root: Path = ROOT, skip: tuple[str, ...] = REGISTRY_FILES) -> dict[str, list[int]]:
    """{file: [lines]} of the product code's branches on the round kind, files in `skip` left out."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = str(path.relative_to(root))
            if rel not in skip and (lines := branches(path.read_text())):
                found[rel] = lines
    return found


def main() -> int:
    found = count()
    for rel, lines in found.items():
        print(f"{rel}: {len(lines)} ({', '.join(map(str, lines))})")
    per_stage = Counter(rel.split("/")[0] for rel in found)
    print(f"{sum(map(len, found.values()))} branches on the round kind in {len(found)} files "
          f"({', '.join(f'{k} {v}' for k, v in sorted(per_stage.items()))}); the registry "
          f"({', '.join(REGISTRY_FILES)}) left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
