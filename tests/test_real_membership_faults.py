"""--on-node-loss continue under the faults that strain the membership protocol (real/membership/membership.py):
two nodes lost in the same round, a node lost before round 0, a node lost while the survivors'
epoch forms, a node lost as the run finishes, a restarted node killed while it joins. Each is injected at its exact point
(real/membership/inject.py) into real processes; the survivors must finish with identical final weights, and
within --timeout-s (a survivor stuck in gloo's rendezvous for a dead member would take all of it).
Also: the membership store is private to this user, members whose final weights differ end the
run with 1, and --host's unauthenticated rendezvous is said or refused."""
from __future__ import annotations

import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")  # real processes training
from proctree import launcher_env
from tiny_run import tiny_scenario

ROUNDS = 12
TIMEOUT_S = 120  # a survivor waiting out --timeout-s would make the run outlast this
SCENARIO = tiny_scenario("faults", ROUNDS, diloco='averaging = "tokens"\n')
# Emulated steps of 0.25 s (2 a round): the joiner's restart (python, torch, the model) fits in the
# run only with rounds this long; 12 rounds of 0.5 s leave it ~6 s once the others are running.
PLAN = """strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s
baseline,a,1,1,2,0.25,32,0.0
baseline,b,1,1,2,0.25,32,0.0
baseline,c,1,1,2,0.25,32,0.0
baseline,d,1,1,2,0.25,32,0.0
"""


def _run(tmp_path: Path, faults: str, *extra: str, rounds: int = ROUNDS) -> tuple[int, str, str, float]:
    (tmp_path / "plan.csv").write_text(PLAN)
    (tmp_path / "scenario.toml").write_text(SCENARIO.replace(f"rounds = {ROUNDS}", f"rounds = {rounds}"))
    cmd = [sys.executable, "-m", "real", "--plan", str(tmp_path / "plan.csv"), "--scenario",
           str(tmp_path / "scenario.toml"), "--out", str(tmp_path / "out"), "--emulate", "--timeout-s", str(TIMEOUT_S),
           "--threads", "1", "--no-progress", "--on-node-loss", "continue", *extra]
    env = {**launcher_env(), "GEODT_TEST_FAULTS": faults}
    start = time.monotonic()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3 * TIMEOUT_S)
    return result.returncode, result.stdout, result.stderr, time.monotonic() - start


def _survivors_finished(tmp_path: Path, out: str, survivors: str, rounds: int = ROUNDS) -> pd.DataFrame:
    trace = pd.read_csv(tmp_path / "out" / "trace.csv")
    for node in survivors:
        assert trace[trace.node == node]["round"].tolist() == list(range(rounds)), trace
    assert (trace.groupby("round")["members"].nunique() == 1).all()  # every member agreed on each round's
    digests = dict(re.findall(r"(\w)=(\w+)", out.split("identical on the members: ")[1].splitlines()[0]))
    assert sorted(digests) == sorted(survivors) and len(set(digests.values())) == 1, out
    return trace


@pytest.mark.parametrize("faults, survivors, lost, with_rows", [
    ("b:round:3,c:round:3:20", "ad", "bc", "abcd"),  # (a) two nodes lost 20 ms apart, in the same round
    ("b:epoch:0", "acd", "b", "acd"),                # (b) a node lost before round 0, before epoch 0 formed
    ("b:round:3,c:epoch:1", "ad", "bc", "abcd"),     # (c) c lost as the survivors form the epoch after b's loss
    ("b:finish:0", "acd", "b", "abcd"),              # (d) a node lost after its last round, as the run finishes
], ids=["two-in-a-round", "before-round-0", "while-an-epoch-forms", "as-the-run-finishes"])
def test_survivors_finish_with_identical_weights(tmp_path, faults, survivors, lost, with_rows):
    code, out, err, wall = _run(tmp_path, faults)
    assert code == 0, err
    for node in lost:
        assert f"real: node {node} (rank {ord(node) - ord('a')}) was killed by SIGKILL" in err
    trace = _survivors_finished(tmp_path, out, survivors)
    assert set(trace.node) == set(with_rows)
    if "finish" in faults:  # its rounds were all done: every row is in the trace
        assert trace[trace.node == "b"]["round"].tolist() == list(range(ROUNDS))
    assert wall < TIMEOUT_S, f"{wall:.0f} s: a survivor waited out --timeout-s"


@pytest.mark.parametrize("point", ["asked", "admitted"])
def test_a_joiner_killed_while_joining_leaves_the_others_training(tmp_path, point):
    """b is lost at round 2 and restarted at once; its new process is killed after asking to join
    (its request must not keep the others forming epochs with it) or once admitted (the epoch that
    admits it must be abandoned for one without it)."""
    # rounds of 1 s (time scale 2): 30 s for the restarted process to start, ask and be admitted under load
    code, out, err, wall = _run(tmp_path, f"b:round:2,b:{point}:0", "--rejoin-after-s", "0", "--time-scale", "2",
                                rounds=30)
    assert code == 0, err
    assert err.count("real: node b (rank 1) was killed by SIGKILL") == 2, err  # the node, then its restart
    trace = _survivors_finished(tmp_path, out, "acd", rounds=30)
    assert trace[trace.node == "b"]["round"].tolist() == [0, 1]
    assert wall < TIMEOUT_S + 60, f"{wall:.0f} s: a survivor waited out --timeout-s"


def test_members_whose_final_weights_differ_end_the_run_with_1(tmp_path):
    code, _, err, _ = _run(tmp_path, "c:skew:0", rounds=2)
    assert code == 1
    said = [line for line in err.splitlines() if "final global weights differ" in line]
    assert len(said) == 1 and re.fullmatch(
        r"real: the members' final global weights differ \(--on-node-loss continue\): "
        r"a, b, d sha256 \w{16}; c sha256 \w{16}", said[0]), err


def test_differing_weights_names_the_nodes():
    from formats.plan import NodePlan, Plan
    from real.process.respawn import differing_weights

    class Store:
        def __init__(self, values):
            self.values = values

        def check(self, keys):
            return all(k in self.values for k in keys)

        def get(self, key):
            return self.values[key].encode()

    plan = Plan("baseline", nodes=tuple(NodePlan(n, 1, 1, 2, 0.25) for n in "abc"), comm_s=0.0, seq_len=16)
    same = Store({f"geodt/digest/{i}": "f" * 64 for i in range(3)})
    assert differing_weights(same, plan, [0, 1, 2]) is None
    one_off = Store({**same.values, "geodt/digest/1": "0" * 64})
    assert differing_weights(one_off, plan, [0, 1, 2]) == (
        "the members' final global weights differ (--on-node-loss continue): a, c sha256 ffffffffffffffff; "
        "b sha256 0000000000000000")
    assert differing_weights(one_off, plan, [0, 2]) is None  # b did not finish: not a member at the end


def test_the_membership_store_is_a_file_only_this_user_can_open(tmp_path):
    from real.membership.membership import connect_store
    from real.process.outdir import rendezvous_dir

    with rendezvous_dir() as folder:
        assert stat.S_IMODE(Path(folder).stat().st_mode) == 0o700
        store = connect_store(("file", str(Path(folder) / "store")), 5.0)
        store.set("geodt/epochs", "0")
    with pytest.raises(ValueError, match="private file store"):
        connect_store(("tcp", "127.0.0.1", 29500), 5.0)


def test_host_any_is_refused_without_the_flag_and_other_hosts_are_warned(tmp_path):
    from real.process.launch import LaunchError, check_host_policy

    with pytest.raises(LaunchError, match=r"^--host 0\.0\.0\.0: binds every interface .* or --allow-any-host$"):
        check_host_policy("0.0.0.0", "0.0.0.0", allow_any=False)
    assert "unauthenticated" in check_host_policy("0.0.0.0", "0.0.0.0", allow_any=True)
    assert check_host_policy("localhost", "127.0.0.1", allow_any=False) is None
    assert check_host_policy("10.0.0.5", "10.0.0.5", allow_any=False) == (
        "--host 10.0.0.5: the rendezvous is unauthenticated: any process that can reach 10.0.0.5 can join or "
        "disrupt this run; use a trusted network only")
    (tmp_path / "plan.csv").write_text(PLAN)
    (tmp_path / "scenario.toml").write_text(SCENARIO)
    for prog in (["-m", "real", "--plan", str(tmp_path / "plan.csv"), "--scenario", str(tmp_path / "scenario.toml")],
                 ["-m", "geodt", "run", "hetero-cpu", "--strategy", "baseline"]):
        result = subprocess.run([sys.executable, *prog, "--out", str(tmp_path / "o"), "--host", "0.0.0.0"],
                                env=launcher_env(), capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "--host 0.0.0.0: binds every interface" in result.stderr


class _FakeProcess:
    """A node process as the Respawner sees it: an exit code, a pid, kill() and join()."""
    pids = iter(range(1000, 2000))

    def __init__(self, rank: int, joining: bool):
        self.rank, self.joining, self.exitcode, self.pid = rank, joining, None, next(self.pids)

    def kill(self):
        self.exitcode = -9

    def join(self, timeout=None):
        pass


def test_a_node_of_two_processes_is_lost_restarted_and_admitted_as_one(tmp_path, capsys):
    """Respawner by node: node a runs ranks 0 and 1. Its rank 1 killed: rank 0 is stopped, one epoch
    without a, one line; rank 0's exit is the same loss (no second epoch); the restart starts both as
    joiners; the node is a member again only when the store admits it."""
    from formats.plan import NodePlan, Plan
    from real.membership.membership import open_store
    from real.process.respawn import Respawner

    plan = Plan("baseline", nodes=(NodePlan("a", 2, 1, 2, 0.25), NodePlan("b", 1, 1, 2, 0.25),
                                   NodePlan("c", 1, 1, 2, 0.25)), comm_s=0.0, seq_len=16)
    store = open_store(str(tmp_path / "store"), 5.0)
    started = []

    def start(rank, joining):
        started.append((rank, joining))
        return _FakeProcess(rank, joining)

    spawner = Respawner(start, plan, store, rejoin_after_s=0.0)
    assert started == [(0, False), (1, False), (2, False), (3, False)]
    first = spawner.procs[0]
    spawner.procs[1].exitcode = -9
    assert spawner._exits() is None
    assert first.exitcode == -9  # the node's other process went with it
    assert store.get("geodt/members/1").decode() == "1,2" and store.add("geodt/epochs", 0) == 1
    assert spawner._exits() is None and store.add("geodt/epochs", 0) == 1  # handled once
    said = capsys.readouterr().err.splitlines()
    assert said == [("real: node a (rank 1) was killed by SIGKILL; the others continue without it "
                     "(--on-node-loss continue); it restarts in 0 s")]
    spawner._restarts()
    assert started[4:] == [(0, True), (1, True)] and spawner.joiners == {0}
    spawner._refresh_joiners()
    assert spawner.members == {1, 2}  # not admitted yet
    store.set("geodt/admitted/0", "1")
    spawner._refresh_joiners()
    assert spawner.members == {0, 1, 2} and not spawner.joiners
