"""--on-node-loss continue (real/membership/members.py, real/process/respawn.py): a node's process SIGKILLed mid-run
leaves the others training among themselves, and with --rejoin-after-s it comes back from a live
peer's global weights and outer state; stop stays as it was (tests/test_real_failures.py)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from proctree import launcher_env, spawned_children
from tiny_run import tiny_scenario

ROUNDS = 40
SCENARIO = tiny_scenario("nodeloss", ROUNDS, diloco='averaging = "tokens"\n')
# Emulated steps of 0.25 s: 0.5 s a round, long beside a sync on the loopback, so that the run is
# still going when the killed node's process has restarted (torch's import takes seconds here).
PLAN = """strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s
baseline,a,1,1,2,0.25,32,0.0
baseline,b,1,1,2,0.25,32,0.0
baseline,c,1,1,2,0.25,32,0.0
"""


def _command(tmp_path: Path, out: str, *extra: str, plan: str = PLAN) -> list[str]:
    (tmp_path / "plan.csv").write_text(plan)
    (tmp_path / "scenario.toml").write_text(SCENARIO)
    return [sys.executable, "-m", "real", "--plan", str(tmp_path / "plan.csv"), "--scenario",
            str(tmp_path / "scenario.toml"), "--out", str(tmp_path / out), "--emulate", "--timeout-s", "30",
            "--threads", "1", *extra]


def _kill_node_b(cmd: list[str]) -> tuple[int, str, str]:
    """Run cmd; once rank 0's bar shows 3 rounds of steps, SIGKILL node b (the second process
    spawned); (exit status, stdout, stderr)."""
    proc = subprocess.Popen(cmd, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.set_blocking(proc.stderr.fileno(), False)
    err, deadline = b"", time.monotonic() + 240
    try:
        while not [n for n in re.findall(rb"(\d+)/%d" % (2 * ROUNDS), err) if int(n) >= 6]:
            assert proc.poll() is None and time.monotonic() < deadline, err.decode()
            err += proc.stderr.read() or b""
            time.sleep(0.05)
        children = sorted(spawned_children(proc.pid))
        assert len(children) == 3
        os.kill(children[1], signal.SIGKILL)
        os.set_blocking(proc.stderr.fileno(), True)
        out, rest = proc.communicate(timeout=300)
    finally:
        proc.kill()
    return proc.returncode, out.decode(), (err + rest).decode().replace("\r", "\n")


def test_a_killed_node_leaves_the_others_training(tmp_path):
    code, out, err = _kill_node_b(_command(tmp_path, "out", "--on-node-loss", "continue"))
    assert code == 0, err
    assert "real: node b (rank 1) was killed by SIGKILL; the others continue without it" in err
    trace = pd.read_csv(tmp_path / "out" / "trace.csv")
    for node in "ac":  # the survivors did every round
        assert trace[trace.node == node]["round"].tolist() == list(range(ROUNDS))
    b_rounds = trace[trace.node == "b"]["round"].tolist()
    assert b_rounds == list(range(len(b_rounds))) and 2 <= len(b_rounds) < ROUNDS - 5
    members = trace.groupby("round")["members"].first()
    assert set(members[:len(b_rounds)]) == {"a+b+c"} and set(members[len(b_rounds):]) == {"a+c"}
    assert (trace.groupby("round")["members"].nunique() == 1).all()  # every node agreed on each round's members
    assert f"node b: absent from rounds {len(b_rounds)}-{ROUNDS - 1}: left after round {len(b_rounds) - 1}" in out
    assert "did not rejoin" in out
    assert re.search(r"final global weights \(sha256\) identical on the members: a=(\w+), c=\1$", out, re.M), out


def test_a_killed_node_rejoins_with_its_peers_weights(tmp_path):
    # Rounds of 1 s: the restarted process (python, torch, the model) is ready well before the end
    # even on a loaded machine (12 s measured with two other test suites running).
    code, out, err = _kill_node_b(_command(tmp_path, "out", "--on-node-loss", "continue", "--rejoin-after-s", "0.5",
                                           plan=PLAN.replace(",0.25,", ",0.5,")))
    assert code == 0, err
    assert "real: node b (rank 1) restarted; it rejoins at the next round boundary" in err
    assert re.search(r"real: node b \(rank 1\) rejoined at round \d+, [\d.]+ s after the launcher restarted it", err), err
    trace = pd.read_csv(tmp_path / "out" / "trace.csv")
    for node in "ac":
        assert trace[trace.node == node]["round"].tolist() == list(range(ROUNDS))
    b_rounds = trace[trace.node == "b"]["round"].tolist()
    gap = [r for r in range(ROUNDS) if r not in b_rounds]
    assert gap and gap == list(range(gap[0], gap[-1] + 1)) and b_rounds[-1] == ROUNDS - 1  # left, came back, finished
    members = trace.groupby("round")["members"].first()
    assert set(members[gap]) == {"a+c"} and set(members.drop(gap)) == {"a+b+c"}
    assert f"rejoined at round {gap[-1] + 1}" in out
    # every member's θ_g at the end, hashed on its own process: bitwise equal
    assert re.search(r"identical on the members: a=(\w+), b=\1, c=\1$", out, re.M), out


# rebalance: node a steps twice as fast as b and c; K = 4 + 2 + 2 samples a round
REBALANCE = """strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s,adapt
rebalance,a,1,1,4,0.25,64,0.0,rebalance
rebalance,b,1,1,2,0.5,32,0.0,rebalance
rebalance,c,1,1,2,0.5,32,0.0,rebalance
"""


# node a: two processes, its model sharded by FSDP2 (real/core/sharding.py)
SHARDED = (PLAN.replace("comm_s\n", "comm_s,sharding\n").replace("0.0\n", "0.0,\n")
           .replace("baseline,a,1,1,2,0.25,32,0.0,", "baseline,a,2,1,2,0.25,64,0.0,fsdp"))


@pytest.mark.parametrize("plan, time_scale", [(PLAN, "0.1"), (REBALANCE, "2"), (SHARDED, "0.1")],
                         ids=["baseline", "rebalance", "sharded"])
def test_continue_without_a_loss_is_the_stop_run_bit_for_bit(tmp_path, plan, time_scale):
    """The epochs' own gloo group averages as the run-wide group does: same final weights. A sharded
    node, which under continue builds its model whole and shards it over its first epoch's node group
    (real/process/worker.py reshard_parts), ends as the stop run's, sharded from the start. A rebalance
    plan too: its barrier (an all-reduce MAX of 3n under continue, a SUM of 2n under stop) agrees on the
    same H_i from the measured step times: emulated steps of 0.5 s and 1 s (time scale 2) move a ⌊T/t̂_i⌋
    only if a's steps run 50% over b's or c's (a loaded machine's overruns of round 0 reached 60% at
    0.125 s steps, flipping H_i between the two runs; at 0.5 s they are a few %)."""
    env = launcher_env()
    for out, policy in (("stop", "stop"), ("cont", "continue")):
        cmd = _command(tmp_path, out, "--on-node-loss", policy, "--no-progress", "--time-scale", time_scale, plan=plan)
        scenario = (tmp_path / "scenario.toml")
        scenario.write_text(SCENARIO.replace(f"rounds = {ROUNDS}", "rounds = 4"))
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
    stop = torch.load(tmp_path / "stop" / "final_weights.pt", weights_only=True)
    cont = torch.load(tmp_path / "cont" / "final_weights.pt", weights_only=True)
    assert stop.keys() == cont.keys()
    assert all(torch.equal(stop[k], cont[k]) for k in stop)
    a, b = pd.read_csv(tmp_path / "stop" / "trace.csv"), pd.read_csv(tmp_path / "cont" / "trace.csv")
    assert a["loss"].tolist() == b["loss"].tolist() and set(b["members"]) == {"a+b+c"}
    assert a["local_steps"].tolist() == b["local_steps"].tolist()


def _adaptive_plan(mode: str):
    from formats.plan import NodePlan, Plan

    # step times of binary fractions: the round times below are exact
    return Plan(mode, nodes=(NodePlan("a", 1, 1, 4, 0.125), NodePlan("b", 1, 1, 2, 0.25), NodePlan("c", 1, 1, 2, 0.25)),
                comm_s=0.0, seq_len=16, adapt=mode)


def test_an_adaptive_round_after_a_loss_covers_the_plans_K_over_the_members_and_a_joiner_plans_the_same():
    """K = 4 + 2 + 2 = 8 samples a round. Round 0 measures a 0.125 s, b 0.5 s, c 0.375 s a step; b is
    lost and a and c's retried barrier plans round 1 over them: T = 0.75 s (6 + 2 steps = K), b keeps
    its estimate. b rejoins, taking a's state: T = 0.75 s over all three (6 + 1 + 2 = 9 >= K, the least
    T; with the plan's 0.25 s for b it would be 0.625 s and 5 + 2 + 1)."""
    from real.rounds.adaptive import AdaptiveRounds, round_weights

    for mode in ("rebalance", "deadline"):
        plan = _adaptive_plan(mode)
        a, c = AdaptiveRounds(plan, 0, scale=2.0), AdaptiveRounds(plan, 2, scale=2.0)  # --time-scale 2
        everyone = np.array([0.25, 1.0, 0.75, 4, 2, 2])  # round 0 (step times x2), all three members
        for node in (a, c):
            assert node.take(everyone, range(3)).tolist() == [4, 2, 2]
        retried = np.array([0.25, 0.0, 0.75, 4, 0, 2])  # the MAX barrier over a and c: b's slots 0
        for node in (a, c):
            assert node.take(retried, [0, 2]).tolist()[::2] == [4, 2]
            assert node.estimates.tolist() == [0.125, 0.5, 0.375]
            if mode == "rebalance":
                assert node.steps[[0, 2]].tolist() == [6, 2]
            else:
                assert node.deadline_s == 0.75
                assert [node.wants_step(k, k * 0.25) for k in (5, 6)] == [True, False]  # a: 6 steps in 2 × 0.75 s
        joiner = AdaptiveRounds(plan, 1, scale=2.0)
        for node in (a, c, joiner):
            node.entered(a.state(), [0, 1, 2], replan=True)
        if mode == "rebalance":
            assert [node.steps.tolist() for node in (a, c, joiner)] == [[6, 1, 2]] * 3
        else:
            assert [node.deadline_s for node in (a, c, joiner)] == [0.75] * 3
    # the round's averaging over its members, by the tokens each did (16 a step)
    assert round_weights(plan, "tokens", np.array([6, 0, 2]), [0, 2], 2) == (32.0, 128.0)


@pytest.mark.parametrize("strategy", ["rebalance", "deadline"])
def test_an_adaptive_plan_loses_a_node_and_the_others_absorb_its_share(tmp_path, strategy):
    """[[nodes]] outage under continue with an adaptive strategy: node medium SIGKILLs itself at round
    2's start, the others run round 2 as planned (with medium in it), plan rounds 3 on over themselves
    at the plan's K (rebalance: by construction; deadline: on average, within a step per node), and
    medium rejoins with the members' estimates."""
    from geodt.run_cmd import run_main

    out = tmp_path / "r"
    code = run_main(["hetero-cpu", "--strategy", strategy, "--out", str(out), "--no-progress", "--emulate",
                     "--set", "training.rounds=12", "--set", "training.local_steps=3",
                     "--set", "nodes.medium.outage={round=2, rounds=3}",
                     "--set", 'simulation.on_node_loss="continue"', "--on-node-loss", "continue",
                     "--time-scale", "5"])  # 1.5 s rounds: 10 rounds leave the restart 15 s
    assert code == 0
    plan = pd.read_csv(out / "plan.csv").set_index("node")
    trace = pd.read_csv(out / "trace.csv")
    assert (trace.groupby("round")["members"].nunique() == 1).all()
    back = trace[(trace.node == "medium") & (trace["round"] >= 2)]["round"].tolist()
    assert back and back == list(range(back[0], 12)) and back[0] >= 5  # left for 3 rounds at least, came back
    assert trace[trace.node == "medium"]["round"].tolist() == [0, 1, *back]
    for node in ("fast", "slow", "slowest"):
        assert trace[trace.node == node]["round"].tolist() == list(range(12))
    samples = (trace["local_steps"] * trace.node.map(plan["batch_size"])).groupby(trace["round"]).sum()
    per_step = trace.node.map(plan["batch_size"]).groupby(trace["round"]).sum()  # one step of every member
    k = int((plan["local_steps"] * plan["batch_size"]).sum())
    members = trace.groupby("round")["members"].first()
    without = [r for r in range(12) if "medium" not in members[r]]
    assert without == list(range(2, back[0]))
    # round 2 ran as planned with medium in it: the survivors' retried barrier planned round 3 on
    planned = [r for r in range(12) if r != 2 and r != 0]
    if strategy == "rebalance":
        assert all(k <= samples[r] < k + per_step[r] for r in planned), samples
    else:  # steps that run slower or faster than the last round's (load here) end a node's round a step
        # early or late: on average over the rounds without medium, and after it, within a step per node of K
        for rounds in (without[1:], list(range(back[0], 12))):
            assert abs(samples[rounds].mean() - k) < per_step[rounds[0]], samples
    survivors = trace[trace.node != "medium"].pivot(index="round", columns="node", values="local_steps")
    assert (survivors.loc[without[1:]].mean() >= survivors.loc[[0, 1]].mean()).all()
    assert survivors.loc[without[1:], "fast"].mean() > survivors.loc[[0, 1], "fast"].mean()


@pytest.mark.parametrize("extra, plan, said", [
    (["--on-node-loss", "continue", "--backend", "nccl"], PLAN,
     ("real: --on-node-loss continue runs on gloo only, got --backend nccl: an nccl communicator cannot be "
      "rebuilt over the survivors here (no GPU to test it on)")),
    (["--rejoin-after-s", "1"], PLAN,
     "real: --rejoin-after-s: a lost node rejoins only under --on-node-loss continue"),
])
def test_what_continue_does_not_run_is_refused_in_one_line(tmp_path, extra, plan, said):
    cmd = _command(tmp_path, "out", *extra)
    (tmp_path / "plan.csv").write_text(plan)
    result = subprocess.run(cmd, env=launcher_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == said.format(plan=tmp_path / "plan.csv")
    assert not (tmp_path / "out" / "trace.csv").exists()


def test_validate_injects_the_scenarios_outage_and_the_node_rejoins_when_predicted(tmp_path, capsys):
    """[[nodes]] outage = {round = 3, rounds = 8} under continue: the node's process SIGKILLs itself at
    round 3's start, restarts at once and is admitted at round 11's boundary, as simulator/models/outage.py has it."""
    from geodt.run_cmd import validate_main

    out = tmp_path / "v"
    # 2.5 s rounds (time scale 5): eight rounds leave the restarted process 20 s to start (3-13 s measured
    # here, the more the more loaded the machine is: that restart time is not in the prediction)
    code = validate_main(["hetero-cpu", "--strategy", "baseline", "--out", str(out), "--no-progress", "--emulate",
                          "--set", "training.rounds=14", "--set", "training.local_steps=3",
                          "--set", "nodes.medium.outage={round=3, rounds=8}",
                          "--set", 'simulation.on_node_loss="continue"', "--on-node-loss", "continue",
                          "--time-scale", "5"])
    assert code == 0
    trace = pd.read_csv(out / "trace.csv")
    assert trace[trace.node == "medium"]["round"].tolist() == [0, 1, 2, 11, 12, 13]
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in printed if line.startswith("node medium: absent")] == [
        "node medium: absent from rounds 3-10: left after round 2"], printed
    for node in ("fast", "slow", "slowest"):
        assert trace[trace.node == node]["round"].tolist() == list(range(14))
    # In a ring of 4 the survivor that is not the lost node's neighbour waited --timeout-s (300 s) at the
    # loss before survivors dropped the failed group; now the recovery takes well under a second here
    # (10 s: room for a loaded machine, far below the timeout)
    assert trace[trace["round"] == 3]["idle_s"].max() < 10.0
    timeline = pd.read_csv(out / "timeline.csv")
    table = pd.read_csv(out / "validation.csv").set_index("node")
    predicted_tokens = timeline.groupby("node")["tokens"].sum()
    assert (table["measured_tokens"] == predicted_tokens[table.index]).all()  # the lost node's 6 rounds out of both


def test_an_outage_under_stop_is_refused_in_one_line(tmp_path, capsys):
    from geodt.run_cmd import validate_main

    code = validate_main(["hetero-cpu", "--strategy", "baseline", "--out", str(tmp_path / "v"), "--no-progress",
                          "--emulate", "--set", "nodes.medium.outage={round=1, rounds=1}"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == ("geodt validate: nodes.medium.outage: a run injects a node's loss only with "
                   "simulation.on_node_loss = \"continue\" and --on-node-loss continue (the executor's stop ends the "
                   "run; --resume continues it); got 'stop' and stop")
    assert not (tmp_path / "v" / "trace.csv").exists()
