"""The SimPy engine and the analytic path: hand-worked idle times, and agreement on random scenarios
(classic rounds and Streaming DiLoCo's fragment syncs, with the closed forms of the latter)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from formats.plan import merge_steps
from simulator.engines.engine import simulate, simulate_syncs, summary
from simulator.engines.engine_analytic import run_analytic, run_streaming_analytic
from simulator.engines.engine_simpy import run_simpy, run_streaming_simpy
from simulator.models.network import sync_s
from simulator.models.workload import compute_matrix
from simulator.scenario import load_scenario
from simulator.strategies import make_plan


def test_hand_worked_idle(write_scenario):
    # steps of 0.1, 0.2 and 0.25 s, H = 10: compute 1.0, 2.0, 2.5 s per round, so node a waits
    # 1.5 s and node b 0.5 s for node c in each of the 2 rounds.
    scenario = load_scenario(str(write_scenario()))
    plan = make_plan(scenario, "baseline")
    for engine in ("simpy", "analytic"):
        timeline = simulate(scenario, plan, engine)
        totals = summary(timeline, plan).set_index("node")
        assert np.allclose(totals["compute_s"], [2.0, 4.0, 5.0], rtol=0, atol=1e-12)
        assert np.allclose(totals["idle_s"], [3.0, 1.0, 0.0], rtol=0, atol=1e-12)
        comm = sync_s(scenario)
        assert np.allclose(totals["comm_s"], 2 * comm, rtol=0, atol=1e-12)
        assert np.allclose(timeline["round_end_s"].iloc[-1], 2 * (2.5 + comm), rtol=0, atol=1e-12)
        # round_s = compute + idle + comm is the same for every node
        per_round = timeline.compute_s + timeline.idle_s + timeline.comm_s
        assert np.allclose(per_round, 2.5 + comm, rtol=0, atol=1e-12)
        assert list(totals["tokens"]) == [10 * 4 * 64 * 2] * 3


def test_timeline_columns_and_order(write_scenario):
    scenario = load_scenario(str(write_scenario()))
    timeline = simulate(scenario, make_plan(scenario, "baseline"), "simpy")
    assert list(timeline.columns) == ["strategy", "node", "round", "compute_s", "idle_s", "comm_s",
                                      "round_start_s", "round_end_s", "tokens"]
    assert list(timeline["node"].astype(str)) == ["a", "b", "c"] * 2
    assert list(timeline["round"]) == [0, 0, 0, 1, 1, 1]


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.floats(1e-3, 10.0), min_size=1, max_size=12),
    rounds=st.integers(1, 12),
    comm_s=st.floats(0.0, 100.0),
)
def test_engines_agree_on_random_rounds(steps, rounds, comm_s):
    rng = np.random.default_rng(len(steps) * 1000 + rounds)
    compute = np.array(steps) * rng.integers(1, 200, size=(rounds, len(steps)))
    a, b = run_simpy(compute, comm_s), run_analytic(compute, comm_s)
    for key in a:
        assert np.max(np.abs(np.asarray(a[key]) - np.asarray(b[key]))) <= 1e-9, key


def test_hand_worked_per_node_sync():
    """Nodes whose syncs end apart (measured per node on unequal links): a node that ends early
    starts its next round early and waits longer at the next barrier. Compute 1 s and 2 s per
    round, syncs 3 s (fast link) and 4 s (slow link). Round 0: barrier at 2, ends at 5 and 6.
    Round 1 starts at 5 and 6, the barrier at max(6, 8) = 8, ends at 11 and 12."""
    compute = np.array([[1.0, 2.0], [1.0, 2.0]])
    for run in (run_simpy, run_analytic):
        out = run(compute, np.array([3.0, 4.0]), 0.5)  # and a 0.5 s checkpoint after each sync
        assert np.array_equal(out["round_start_s"], [[0.0, 0.0], [5.5, 6.5]])
        assert np.array_equal(out["idle_s"], [[1.0, 0.0], [2.0, 0.0]])
        assert np.array_equal(out["comm_s"], [[3.0, 4.0], [3.0, 4.0]])
        assert np.array_equal(out["round_end_s"], [[5.0, 6.0], [11.5, 12.5]])


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.floats(1e-3, 10.0), min_size=1, max_size=12),
    rounds=st.integers(1, 12),
    comm_s=st.lists(st.floats(0.0, 100.0), min_size=12, max_size=12),
    ckpt_s=st.sampled_from([0.0, 0.25]),
)
def test_engines_agree_with_a_sync_per_node(steps, rounds, comm_s, ckpt_s):
    rng = np.random.default_rng(len(steps) * 1000 + rounds)
    compute = np.array(steps) * rng.integers(1, 200, size=(rounds, len(steps)))
    comm = np.array(comm_s[:len(steps)])
    a, b = run_simpy(compute, comm, ckpt_s), run_analytic(compute, comm, ckpt_s)
    for key in a:
        assert np.max(np.abs(np.asarray(a[key]) - np.asarray(b[key]))) <= 1e-9, key
    # equal syncs per node: exactly the one-number path's timeline
    same = run_analytic(compute, np.full(len(steps), comm_s[0]), ckpt_s)
    for key, value in run_analytic(compute, comm_s[0], ckpt_s).items():
        assert np.array_equal(np.asarray(same[key]), np.asarray(value)), key


# the fixture only writes a file, overwritten for each example
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    step_times=st.lists(st.floats(0.01, 2.0), min_size=2, max_size=6),
    local_steps=st.integers(1, 50),
    rounds=st.integers(1, 5),
    jitter=st.sampled_from([0.0, 0.1]),
    strategy=st.sampled_from(["baseline", "C", "measured-steps", "measured-batch"]),
)
def test_engines_agree_on_random_scenarios(write_scenario, step_times, local_steps, rounds, jitter, strategy):
    nodes = "".join(f'[[nodes]]\nname = "n{i}"\ngpus = {{ "a30" = {1 + i % 3} }}\nstep_time_s = {t!r}\n'
                    for i, t in enumerate(step_times))
    text = (f'name = "r"\n[model]\npreset = "llama-60m"\n[training]\nrounds = {rounds}\n'
            f'local_steps = {local_steps}\n[simulation]\njitter_cv = {jitter}\n{nodes}')
    scenario = load_scenario(str(write_scenario(text)))
    plan = make_plan(scenario, strategy)
    a, b = simulate(scenario, plan, "simpy"), simulate(scenario, plan, "analytic")
    pd.testing.assert_frame_equal(a[["strategy", "node", "round"]], b[["strategy", "node", "round"]])
    assert np.max(np.abs(a.iloc[:, 3:].to_numpy() - b.iloc[:, 3:].to_numpy())) <= 1e-9


def test_jitter_is_seeded_and_mean_preserving(write_scenario):
    path = write_scenario()
    base = ["simulation.jitter_cv=0.2", "training.rounds=400"]
    one = load_scenario(str(path), base)
    two = load_scenario(str(path), base)
    other = load_scenario(str(path), base + ["seed=1"])
    plan = make_plan(one, "baseline")
    t1, t2, t3 = (simulate(s, plan, "analytic") for s in (one, two, other))
    assert t1.equals(t2)
    assert not t1["compute_s"].equals(t3["compute_s"])
    # 400 rounds × 10 steps per node: the mean factor is 1 within a few standard errors
    mean = t1.groupby("node", observed=True)["compute_s"].mean().to_numpy()
    assert np.allclose(mean, [1.0, 2.0, 2.5], rtol=0.02)
    assert (t1["idle_s"] >= 0).all()


# --- Streaming DiLoCo: the fragment-sync engines ------------------------------------------

@settings(max_examples=40, deadline=None)
@given(segments=st.lists(st.floats(0.01, 5.0), min_size=1, max_size=4), window_s=st.floats(0.0, 3.0),
       allreduce_s=st.floats(0.0, 6.0), outer_s=st.floats(0.0, 1.0), nodes=st.integers(1, 5), rounds=st.integers(1, 5))
def test_streaming_closed_forms_for_equal_nodes(segments, window_s, allreduce_s, outer_s, nodes, rounds):
    # Equal nodes: each fragment costs its pre-sync compute, then the longer of its τ window and its
    # all-reduce, then the outer step: round = Σ_p (pre_p + max(window, A) + O). τ = 0 (window 0) is
    # the fully exposed case, round = T + P·(A + O); a window ≥ A the hidden one, round = T + P·O.
    p = len(segments)
    pre = np.tile(np.array(segments)[:, None], (rounds, nodes))
    delay = np.full_like(pre, window_s)
    closed = sum(s + max(window_s, allreduce_s) + outer_s for s in segments)
    for run in (run_streaming_simpy, run_streaming_analytic):
        rec = run(pre, delay, allreduce_s, outer_s, p)
        assert np.allclose(rec["resume_s"][-1], rounds * closed, rtol=1e-12, atol=1e-9)
    totals = run_streaming_analytic(pre, delay, allreduce_s, outer_s, p, record=False)
    assert np.allclose(totals["idle_s"], 0.0, atol=1e-9)  # nobody waits for anybody
    assert np.allclose(totals["comm_s"], rounds * p * (max(allreduce_s - window_s, 0.0) + outer_s), atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.integers(2, 30), min_size=1, max_size=6), step_s=st.floats(0.01, 3.0),
       fragments=st.integers(1, 4), allreduce_s=st.floats(0.0, 20.0), outer_s=st.floats(0.0, 2.0),
       rounds=st.integers(1, 6), ckpt=st.sampled_from([0.0, 0.7]), data=st.data())
def test_engines_agree_on_random_streaming_schedules(steps, step_s, fragments, allreduce_s, outer_s, rounds, ckpt,
                                                     data):
    fragments = min(fragments, min(steps))
    tau = data.draw(st.integers(0, min(steps) // fragments - 1))
    rng = np.random.default_rng(len(steps) + rounds)
    step = step_s * rng.uniform(0.3, 1.0, size=len(steps))
    pre = np.array([[(merge_steps(h, fragments)[p] - (merge_steps(h, fragments)[p - 1] if p else 0) - tau) * t
                     for h, t in zip(steps, step)] for _ in range(rounds) for p in range(fragments)])
    delay = np.tile(tau * step, (rounds * fragments, 1)) * rng.uniform(0.5, 1.5, size=pre.shape)
    a = run_streaming_simpy(pre, delay, allreduce_s, outer_s, fragments, ckpt)
    b = run_streaming_analytic(pre, delay, allreduce_s, outer_s, fragments, ckpt)
    for key in a:
        assert np.max(np.abs(np.asarray(a[key]) - np.asarray(b[key]))) <= 1e-9, key
    # nodes that end each all-reduce apart (offsets ≤ 0, measured per node): the engines still agree,
    # and offsets of 0 are the one-end schedule exactly
    offsets = -allreduce_s * rng.uniform(0.0, 1.0, size=len(steps))
    a_own = run_streaming_simpy(pre, delay, allreduce_s, outer_s, fragments, ckpt, node_offsets_s=offsets)
    b_own = run_streaming_analytic(pre, delay, allreduce_s, outer_s, fragments, ckpt, node_offsets_s=offsets)
    for key in a_own:
        assert np.max(np.abs(np.asarray(a_own[key]) - np.asarray(b_own[key]))) <= 1e-9, key
    zero = run_streaming_analytic(pre, delay, allreduce_s, outer_s, fragments, ckpt, node_offsets_s=np.zeros(len(steps)))
    for key in b:
        assert np.array_equal(np.asarray(zero[key]), np.asarray(b[key])), key
    totals = run_streaming_analytic(pre, delay, allreduce_s, outer_s, fragments, ckpt, record=False)
    assert totals["wall_s"] == pytest.approx(b["resume_s"][-1].max(), rel=1e-12)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step_times=st.lists(st.floats(0.01, 2.0), min_size=2, max_size=5), local_steps=st.integers(4, 40),
       rounds=st.integers(1, 4), jitter=st.sampled_from([0.0, 0.1]), fragments=st.integers(1, 3), data=st.data())
def test_engines_agree_on_random_streaming_scenarios(write_scenario, step_times, local_steps, rounds, jitter,
                                                     fragments, data):
    tau = data.draw(st.integers(0, local_steps // fragments - 1))
    nodes = "".join(f'[[nodes]]\nname = "n{i}"\ngpus = {{ "a30" = {1 + i % 3} }}\nstep_time_s = {t!r}\n'
                    for i, t in enumerate(step_times))
    text = (f'name = "r"\n[model]\npreset = "llama-60m"\n[training]\nrounds = {rounds}\nlocal_steps = {local_steps}\n'
            f'[diloco]\nfragments = {fragments}\nsync_delay_steps = {tau}\n[simulation]\njitter_cv = {jitter}\n{nodes}')
    scenario = load_scenario(str(write_scenario(text)))
    plan = make_plan(scenario, "baseline")
    (ta, sa), (tb, sb) = simulate_syncs(scenario, plan, "simpy"), simulate_syncs(scenario, plan, "analytic")
    assert np.max(np.abs(ta.iloc[:, 3:].to_numpy() - tb.iloc[:, 3:].to_numpy())) <= 1e-9
    assert np.max(np.abs(sa.iloc[:, 4:].to_numpy() - sb.iloc[:, 4:].to_numpy())) <= 1e-9
    # every node's round is its compute, idle and comm, back to back
    span = ta["round_end_s"] - ta["round_start_s"]
    assert np.allclose(span, ta["compute_s"] + ta["idle_s"] + ta["comm_s"], rtol=1e-12, atol=1e-9)
    # the segments hold the same draws as the rounds
    assert np.allclose(ta["compute_s"].to_numpy(), compute_matrix(scenario, plan).ravel(), rtol=1e-12)
    assert len(sa) == rounds * fragments * len(step_times)


