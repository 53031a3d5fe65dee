"""The registry of strategies: each module registers its `decide` under its command-line name.

Its own module so that a strategy's module imports the registry, not the package that imports
every strategy (no import cycle).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


def register(name: str, note: Note | None = None, barrier: bool = True) -> Callable[[Decide], Decide]:
    def add(fn: Decide) -> Decide:
        (STRATEGIES if barrier else BARRIERLESS)[name] = Strategy(name, fn, note)
        return fn
    return add


def known(name: str) -> Strategy | None:
    """The strategy of a command-line name, with or without a barrier; None if unknown."""
    return STRATEGIES.get(name) or BARRIERLESS.get(name)
