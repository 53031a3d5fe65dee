"""The registry of strategies: each module registers its `decide` under its command-line name.

Its own module so that a strategy's module imports the registry, not the package that imports
every strategy (no import cycle).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from formats.rounds import round_kind
from simulator.strategies.tables import NetTables, NodeTables

Decide = Callable[[NodeTables, NetTables], dict]
Note = Callable[[dict, NodeTables], str]


@dataclass(frozen=True)
class Strategy:
    name: str
    decide: Decide
    note: Note | None = None  # what the strategy decided, for row 0 (the printed report)

    def __call__(self, tables: NodeTables, net: NetTables) -> dict:
        return self.decide(tables, net)


STRATEGIES: dict[str, Strategy] = {}
# Strategies whose rounds end without DiLoCo's barrier (issue 40: async, quorum). Simulated only, by
# their own engines (simulator/engines/engine_async.py): kept apart from STRATEGIES, which the sweep and
# `geodt paper` decide and time in bulk with the barrier's arithmetic, and which the executor runs.
BARRIERLESS: dict[str, Strategy] = {}


def register(name: str, note: Note | None = None, sync: str = "diloco") -> Callable[[Decide], Decide]:
    """Add a strategy whose plans sync as `sync` (plan.csv's column): a kind of round without a barrier
    (formats/rounds.py) puts it in BARRIERLESS."""
    def add(fn: Decide) -> Decide:
        (STRATEGIES if round_kind(sync).barrier else BARRIERLESS)[name] = Strategy(name, fn, note)
        return fn
    return add


# What each strategy does, one sentence each: `--help` of simulate, plan, sweep, run and validate prints
# them (help_lines), and tests/test_help.py checks that every registered strategy has one.
SUMMARIES: dict[str, str] = {
    "baseline": "DiLoCo as configured: every node H local steps at batch b, then a barrier and the sync",
    "A": "the paper's A: each node's batch scaled by its peak FLOPS over the slowest node's",
    "B": "the paper's B: each node's batch the largest of b, 2b, 4b ... 16b its GPUs hold",
    "C": "the paper's C: each node's local steps scaled by its peak FLOPS over the slowest node's",
    "measured-steps": "each node the most whole steps that end before the slowest node, from measured step times",
    "measured-batch": "each node the largest batch that fits and steps no slower than the slowest node",
    "C-slowest": "C with each node priced by its slowest GPU's datasheet TFLOPS",
    "hybrid": "each node's batch and local steps together, within memory: the shortest round at the same samples",
    "sync-ddp": "no local steps: a gradient all-reduce every step, the global batch split by speed",
    "network-aware": "hybrid's compute, plus the collective, payload dtype and H chosen for the links",
    "streaming": "hybrid's compute, synced as Streaming DiLoCo fragments that overlap the next steps",
    "rebalance": "re-plans every round: local steps from the step times measured so far (follows drift)",
    "deadline": "re-plans every round: every node steps until a shared deadline, then syncs (follows drift)",
    "async": "no barrier: a server applies each node's pseudo-gradient on arrival (stale merges priced)",
    "quorum": "no barrier: a round closes when half the nodes wait plus a grace window; late work merges next round",
}


def help_lines(names=None) -> str:
    """`name  what it does` for each strategy (all registered ones by default), one line each."""
    names = list(names) if names is not None else [*STRATEGIES, *BARRIERLESS]
    width = max(len(n) for n in names)
    return "\n".join(f"{n:<{width}}  {SUMMARIES.get(n, '')}".rstrip() for n in names)


def known(name: str) -> Strategy | None:
    """The strategy of a command-line name, with or without a barrier; None if unknown."""
    return STRATEGIES.get(name) or BARRIERLESS.get(name)
