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
# their own engines (simulator/engines/rounds_server.py): kept apart from STRATEGIES, which the sweep and
# `geodt paper` decide and time in bulk with the barrier's arithmetic, and which the executor runs.
BARRIERLESS: dict[str, Strategy] = {}


# What each strategy does, one sentence each, given where it registers (register's summary): `--help` of
# simulate, plan, sweep, run and validate prints them (help_lines), and tests/test_help.py checks that every
# registered strategy has one.
SUMMARIES: dict[str, str] = {}


def register(name: str, summary: str = "", note: Note | None = None,
             sync: str = "diloco") -> Callable[[Decide], Decide]:
    """Add a strategy, with what it does in one sentence (SUMMARIES; every strategy of the product has one,
    tests/test_help.py; a test's own may go without), whose plans sync as `sync` (plan.csv's column): a
    kind of round without a barrier (formats/rounds.py) puts it in BARRIERLESS."""
    def add(fn: Decide) -> Decide:
        (STRATEGIES if round_kind(sync).barrier else BARRIERLESS)[name] = Strategy(name, fn, note)
        if summary:
            SUMMARIES[name] = summary
        return fn
    return add


def help_lines(names=None) -> str:
    """`name  what it does` for each strategy (all registered ones by default), one line each."""
    names = list(names) if names is not None else [*STRATEGIES, *BARRIERLESS]
    width = max(len(n) for n in names)
    return "\n".join(f"{n:<{width}}  {SUMMARIES.get(n, '')}".rstrip() for n in names)


def known(name: str) -> Strategy | None:
    """The strategy of a command-line name, with or without a barrier; None if unknown."""
    return STRATEGIES.get(name) or BARRIERLESS.get(name)
