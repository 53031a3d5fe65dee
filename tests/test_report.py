"""simulator/outputs/report.py: the table and the recommendation `geodt simulate` ends with, on hand-made plans."""
from __future__ import annotations

import pytest

from formats.plan import NodePlan, Plan
from simulator.cli import simulate_main
from simulator.engines.engine import simulate
from simulator.outputs.report import answer, answer_table, recommend
from simulator.scenario import load_scenario


def plan(name: str, nodes: list[tuple[int, int, float]]) -> Plan:
    """(batch, H, step_s) per node a, b, c; one GPU, seq_len 1 (tokens = H × b), a 0.5 s sync."""
    return Plan(strategy=name, comm_s=0.5, seq_len=1,
                nodes=tuple(NodePlan(n, 1, b, h, s) for n, (b, h, s) in zip("abc", nodes)))


# Two rounds each (the SMALL scenario). Compute per round and what follows from it:
BASELINE = plan("baseline", [(4, 10, 0.1), (4, 10, 0.2), (4, 10, 0.25)])  # 1, 2, 2.5 s: round 3 s, idle 2 s
MORE_WORK = plan("more-work", [(4, 25, 0.1), (4, 12, 0.2), (4, 10, 0.25)])  # 2.5, 2.4, 2.5 s; 188 tokens
EVEN_IDLE = plan("even-idle", [(4, 10, 0.125), (4, 10, 0.2), (4, 10, 0.2)])  # 1.25, 2, 2 s: round 2.5, idle 0.75
EVEN = plan("even", [(4, 10, 0.2), (4, 10, 0.2), (4, 10, 0.2)])  # 2, 2, 2 s: round 2.5 s, no idle
SLOWER = plan("slower", [(4, 10, 0.25), (4, 10, 0.25), (4, 10, 0.25)])  # 2.5 s each: round 3 s, no idle


@pytest.fixture
def runs(write_scenario):
    scenario = load_scenario(str(write_scenario()))
    return scenario, [(p, simulate(scenario, p, "analytic")) for p in (BASELINE, MORE_WORK, EVEN_IDLE, EVEN)]


def test_table_numbers(runs):
    _, pairs = runs
    table, base = answer_table(pairs, pairs[0])
    assert list(table["strategy"]) == ["baseline", "more-work", "even-idle", "even"]
    assert list(table["round_s"]) == [3.0, 3.0, 2.5, 2.5]
    assert list(table["tokens_per_round"]) == [120, 188, 120, 120]
    assert list(table["tokens"]) == [240, 376, 240, 240]
    assert list(table["tokens_per_s"]) == [40.0, 376 / 6.0, 48.0, 48.0]
    assert list(table["speedup"]) == [1.0, (376 / 6.0) / 40.0, 1.2, 1.2]
    assert list(table["idle_s"]) == [4.0, pytest.approx(0.2, abs=1e-12), 1.5, 0.0]  # 2.5 - 2.4 is not 0.1 in binary
    assert list(table["comparable"]) == [True, False, True, True]  # 188/120 = 1.567 is other work
    assert (base["tokens_per_s"], base["idle_s"]) == (40.0, 4.0)


def test_recommendation_breaks_the_tie_by_idle_and_names_the_excluded_faster_one(runs):
    _, pairs = runs
    rec = recommend(*answer_table(pairs, pairs[0]))
    # even and even-idle: both 48 tokens/s (a tie); even has no idle. more-work is faster (62.7) but 1.57x the tokens.
    assert rec.strategy == "even"
    assert rec.line() == (
        "recommended: even — least idle of the fastest doing the baseline's work (run tokens within ±5%; "
        "even-idle within 1% of its tokens/s): 48 tokens/s, 1.20× the baseline's; idle 0.00 s against 4.00 s; "
        "more-work is faster (1.57×) but trains on 1.57× the baseline's tokens")


def test_rule_without_tie_and_with_nothing_comparable(runs):
    scenario, pairs = runs
    base, more_work, even = pairs[0], pairs[1], pairs[3]
    rec = recommend(*answer_table([base, even], base))  # 48 against 40 tokens/s: no tie
    assert rec.line().startswith("recommended: even — most tokens/s of those doing the baseline's work "
                                 "(run tokens within ±5%): 48 tokens/s, 1.20×")
    slower = (SLOWER, simulate(scenario, SLOWER, "analytic"))  # 240 tokens in 6 s: the baseline's 40 tokens/s
    for order in ([base, slower], [slower, base]):  # a tie, whichever comes first: least idle (0 s against 4 s)
        assert recommend(*answer_table(order, base)).strategy == "slower"
    rec = recommend(*answer_table([more_work], base))
    assert rec.strategy is None and rec.line().startswith("no recommendation: no strategy here does")
    rec = recommend(*answer_table([even], base))
    assert rec.line().startswith("recommended: even — the only one doing the baseline's work")


def test_simulate_ends_with_the_answer(tmp_path, capsys, write_scenario):
    assert simulate_main([str(write_scenario()), "--out", str(tmp_path), "--strategy", "C", "measured-steps",
                          "--engine", "analytic"]) == 0
    lines = capsys.readouterr().out.rstrip().splitlines()
    assert lines[-1].startswith(("recommended: ", "no recommendation: "))
    table = lines[lines.index(next(line for line in lines if line.startswith("strategy "))):]
    assert [line.split()[0] for line in table[1:3]] == ["C", "measured-steps"]
    assert any(line.startswith("baseline (for the ratios): ") for line in table)  # not asked for: simulated for reference
    assert (tmp_path / "trace.json").exists()


def test_answer_simulates_the_baseline_when_absent(runs):
    from simulator.strategies import make_plan

    scenario, pairs = runs
    baseline = make_plan(scenario, "baseline")  # the scenario's own: 64-token sequences, its network's sync
    wall = simulate(scenario, baseline, "analytic")["round_end_s"].max()
    text = answer(scenario, pairs[3:], engine="analytic")
    assert f"baseline (for the ratios): {2 * baseline.tokens_per_round / wall:,.0f} tokens/s, idle 4.00 s" in text
