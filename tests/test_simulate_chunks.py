"""Simulation at fleet size (issue 32): chunks, the engine `auto` picks, Parquet tables, aggregation,
the streaming recurrence's closed form for repeating rounds."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator.outputs.run_outputs
from simulator.cli import simulate_main
from simulator.engines.engine import pick_engine, simulate_chunks, simulate_syncs
from simulator.engines.engine_analytic import run_streaming_analytic
from simulator.engines.engine_simpy import run_simpy
from simulator.scenario import load_scenario
from simulator.strategies import make_plan


def _chunks(scenario, plan, engine, chunk):
    parts = []
    simulate_chunks(scenario, plan, engine, lambda t, s: parts.append((t, s)), chunk)
    return (pd.concat([t for t, _ in parts], ignore_index=True), pd.concat([s for _, s in parts], ignore_index=True),
            len(parts))


@pytest.mark.parametrize("strategy", ["baseline", "C", "streaming"])
@pytest.mark.parametrize("engine", ["simpy", "analytic"])
def test_chunks_are_the_whole_run_bit_for_bit(strategy, engine):
    """Chunks of whole rounds, each engine carrying its state across them: concatenated, exactly the
    tables of one whole run (jitter on)."""
    scenario = load_scenario("paper", ["training.rounds=7", "simulation.jitter_cv=0.1"])
    plan = make_plan(scenario, strategy)
    timeline, syncs = simulate_syncs(scenario, plan, engine)
    for chunk, count in ((1, 7), (3, 3), (100, 1)):
        t, s, parts = _chunks(scenario, plan, engine, chunk)
        assert parts == count
        pd.testing.assert_frame_equal(t, timeline, check_exact=True)
        pd.testing.assert_frame_equal(s, syncs, check_exact=True)


def test_simpy_chunks_with_a_sync_per_node_and_a_checkpoint():
    """The SimPy engine's replay from barrier releases, chunked, with per-node syncs and a checkpoint:
    the unchunked run's arrays exactly (and those agree with the analytic path: test_simulator_engines)."""
    rng = np.random.default_rng(3)
    compute = rng.uniform(0.5, 3.0, size=(9, 5))
    comm = rng.uniform(0.1, 2.0, size=5)
    whole = run_simpy(compute, comm, 0.25)
    parts = []
    assert run_simpy(compute, comm, 0.25, emit=lambda a, first: parts.append((first, a)), chunk_rounds=2) is None
    assert [first for first, _ in parts] == [0, 2, 4, 6, 8]
    for key, value in whole.items():
        assert np.array_equal(np.concatenate([a[key] for _, a in parts]), value), key


def test_auto_is_the_analytic_path_and_says_so(tmp_path, capsys):
    scenario = load_scenario("paper", ["training.rounds=2"])
    assert pick_engine(scenario, make_plan(scenario, "baseline"))[0] == "analytic"
    assert pick_engine(scenario, make_plan(scenario, "baseline"), "simpy")[0] == "simpy"
    assert simulate_main(["paper", "--set", "training.rounds=2", "--strategy", "baseline", "--out", str(tmp_path)]) == 0
    assert "engine: analytic (exact here" in capsys.readouterr().out


def test_parquet_and_csv_hold_the_same_tables(tmp_path):
    args = ["paper", "--set", "training.rounds=3", "--strategy", "baseline", "streaming", "--engine", "simpy"]
    assert simulate_main([*args, "--out", str(tmp_path / "p")]) == 0
    assert simulate_main([*args, "--out", str(tmp_path / "c"), "--csv"]) == 0
    for name in ("timeline", "syncs"):
        parquet = pd.read_parquet(tmp_path / "p" / f"{name}.parquet")
        csv = pd.read_csv(tmp_path / "c" / f"{name}.csv")
        assert list(parquet.columns) == list(csv.columns)
        for column in parquet.columns:
            a, b = parquet[column].to_numpy(), csv[column].to_numpy()
            if a.dtype.kind == "f":  # CSV keeps 9 significant digits
                assert np.allclose(a, b, rtol=1e-8, atol=0), column
            else:
                assert list(a.astype(str)) == list(b.astype(str)), column
    assert not (tmp_path / "p" / "timeline.csv").exists() and not (tmp_path / "c" / "timeline.parquet").exists()


def test_a_long_run_aggregates_its_timeline_in_blocks(tmp_path, monkeypatch, capsys):
    """Above TIMELINE_FULL_MAX_ROWS node-rounds a strategy's timeline sums blocks of rounds and its syncs
    keep the first rounds; the totals (summary.csv) are the full run's; --full-timeline keeps all."""
    monkeypatch.setattr(simulator.outputs.run_outputs, "TIMELINE_FULL_MAX_ROWS", 12)  # 4 nodes: 3 rounds
    monkeypatch.setattr(simulator.outputs.run_outputs, "CHUNK_NODE_ROUNDS", 16)  # chunks of several blocks
    args = ["paper", "--set", "training.rounds=10", "--set", "simulation.jitter_cv=0.1", "--strategy", "baseline",
            "streaming"]
    assert simulate_main([*args, "--out", str(tmp_path / "agg")]) == 0
    assert "summed in blocks of 4 rounds" in capsys.readouterr().out
    assert simulate_main([*args, "--out", str(tmp_path / "full"), "--full-timeline"]) == 0
    agg = pd.read_parquet(tmp_path / "agg" / "timeline.parquet")
    full = pd.read_parquet(tmp_path / "full" / "timeline.parquet")
    assert "rounds" in agg.columns and "rounds" not in full.columns
    for strategy in ("baseline", "streaming"):
        a, f = agg[agg.strategy == strategy], full[full.strategy == strategy]
        assert sorted(set(a["round"])) == [0, 4, 8] and list(a["rounds"].unique()) == [4, 2]
        for node, rows in a.groupby("node"):
            mine = f[f.node == node]
            block = mine["round"] // 4
            for column in ("compute_s", "idle_s", "comm_s"):
                assert np.allclose(rows[column].to_numpy(), mine.groupby(block)[column].sum().to_numpy(),
                                   rtol=1e-12), column
            assert np.array_equal(rows["round_start_s"], mine.groupby(block)["round_start_s"].first())
            assert np.array_equal(rows["round_end_s"], mine.groupby(block)["round_end_s"].last())
    syncs = pd.read_parquet(tmp_path / "agg" / "syncs.parquet")
    assert syncs["round"].max() == 2  # baseline: 3 rounds of 4 nodes in 12 rows (streaming: 1 round of 4 x 4)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "agg" / "summary.csv"),
                                  pd.read_csv(tmp_path / "full" / "summary.csv"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 5), fragments=st.integers(1, 4), rows=st.integers(1, 3), rounds=st.integers(1, 80),
       ckpt=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 10**6))
def test_repeating_rounds_in_closed_form_equal_every_round(nodes, fragments, rows, rounds, ckpt, seed):
    """One round's rows repeated: the recurrence stops once the schedule repeats and adds the rest
    in closed form; the totals are every round's, run one by one, to rounding."""
    rng = np.random.default_rng(seed)
    pre = rng.uniform(0.0, 3.0, size=(fragments, rows, nodes))
    delay = rng.uniform(0.0, 1.0, size=(fragments, rows, nodes)) * rng.integers(0, 2)
    allreduce, outer = rng.uniform(0.0, 5.0, size=rows), rng.uniform(0.0, 1.0, size=rows)
    fast = run_streaming_analytic(pre, delay, allreduce, outer, fragments, ckpt, record=False, syncs=rounds * fragments)
    every = run_streaming_analytic(np.tile(pre, (rounds, 1, 1)), np.tile(delay, (rounds, 1, 1)), allreduce, outer,
                                   fragments, ckpt, record=False)
    for key, value in every.items():
        assert np.allclose(fast[key], value, rtol=1e-9, atol=1e-9), key


@pytest.mark.parametrize("strategy,sets", [
    ("rebalance", ['nodes.node1.drift=[{kind="step", round=3, factor=1.2}]']),
    ("deadline", ["simulation.jitter_cv=0.1"]),
    ("baseline", ['nodes.node1.outage={round=2, rounds=2}', 'simulation.on_node_loss="continue"']),
])
@pytest.mark.parametrize("engine", ["simpy", "analytic"])
def test_adaptive_and_outage_runs_are_one_whole_chunk_with_their_tokens(strategy, sets, engine):
    """An adaptive plan's rounds are made from the rounds before, an outage settled on the whole
    run: simulate_chunks hands them on as one chunk, the whole run's tables exactly, and the totals
    kept chunk by chunk give summary() the tokens the rounds trained on (not plan tokens x rounds)."""
    from simulator.engines.engine import summary
    from simulator.models.totals import RunTotals

    scenario = load_scenario("paper", ["training.rounds=7", *sets])
    plan = make_plan(scenario, strategy)
    timeline, syncs = simulate_syncs(scenario, plan, engine)
    t, s, parts = _chunks(scenario, plan, engine, 2)
    assert parts == 1
    pd.testing.assert_frame_equal(t, timeline, check_exact=True)
    pd.testing.assert_frame_equal(s, syncs, check_exact=True)
    per_round = timeline.groupby("node", observed=True)["tokens"].nunique()
    assert (per_round > 1).any()  # the tokens vary round by round here
    whole = summary(timeline, plan)
    pd.testing.assert_frame_equal(summary(RunTotals.of(timeline), plan), whole, check_exact=True)
    planned = {n.node: n.tokens_per_round(plan.seq_len) * 7 for n in plan.nodes}
    assert whole["tokens"].tolist() == [int(timeline.loc[timeline["node"] == n, "tokens"].sum()) for n in planned]
    assert whole["tokens"].tolist() != list(planned.values())


def test_chunked_totals_carry_the_plans_tokens():
    """A plan simulated in chunks: RunTotals added chunk by chunk give summary() the tokens column's sums."""
    from simulator.engines.engine import summary
    from simulator.models.totals import RunTotals

    scenario = load_scenario("paper", ["training.rounds=7"])
    plan = make_plan(scenario, "C")
    totals, parts = RunTotals(), []
    simulate_chunks(scenario, plan, "analytic", lambda t, s: (totals.add(t), parts.append(t)), 3)
    assert len(parts) == 3 and all(len(p) == 3 * len(plan.nodes) or p is parts[-1] for p in parts)
    whole = pd.concat(parts, ignore_index=True)
    assert totals.tokens == int(whole["tokens"].sum()) == plan.tokens_per_round * 7
    assert summary(totals, plan)["tokens"].tolist() == [n.tokens_per_round(plan.seq_len) * 7 for n in plan.nodes]
