"""Streaming DiLoCo (real/core/streaming.py): layout, schedule, torchft's regression fixtures, and
executor runs (P = 1 against the classic loop bit for bit, payloads and collectives per
fragment, resume, overlap accounting, bad input)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from formats.plan import NodePlan, load_plan
from formats.wire import bytes_sent_per_sync
from real.checkpoint.checkpoint import latest_state
from real.core.diloco import OuterState
from real.core.options import ExecOptions
from real.core.streaming import FragmentedOuter, StreamingSpec, fragment_layout
from real.process.launch import launch
from tests.test_real_runs import scenario_text

FIXTURES = Path(__file__).parent / "fixtures" / "torchft"
FIXTURE_CASES = [(0, 0.0), (0, 0.5), (0, 1.0), (1, 0.0), (1, 0.5), (1, 1.0)]  # (τ, α) of files _0 .. _5


def test_layout_sequential_and_strided_with_embedding_first_and_head_last():
    names = ["model.embed_tokens.weight"] + [f"model.layers.{k}.{w}.weight" for k in range(4) for w in ("q", "mlp")] \
        + ["model.norm.weight", "lm_head.weight"]
    layer = lambda i: [1 + 2 * i, 2 + 2 * i]
    assert fragment_layout(names, 2, "sequential") == [[0] + layer(0) + layer(1), layer(2) + layer(3) + [9, 10]]
    assert fragment_layout(names, 2, "strided") == [[0] + layer(0) + layer(2), layer(1) + layer(3) + [9, 10]]
    assert fragment_layout(names, 3, "sequential") == [[0] + layer(0) + layer(1), layer(2), layer(3) + [9, 10]]
    assert fragment_layout(names, 1, "strided") == [list(range(11))]
    with pytest.raises(ValueError, match="fragments: expected at most the model's 4 layers"):
        fragment_layout(names, 5, "sequential")


def test_spec_schedule_and_validation():
    assert StreamingSpec(2, 1).schedule(6) == [(2, 3), (5, 6)]
    assert StreamingSpec(3, 0).schedule(7) == [(2, 2), (4, 4), (7, 7)]  # ⌊(k+1)·H/P⌋
    assert StreamingSpec().classic and not StreamingSpec(fragment_alpha=0.5).classic
    nodes = [NodePlan("a", 1, 1, 4, 0.1), NodePlan("b", 1, 1, 6, 0.1)]
    StreamingSpec(2, 1).check(nodes, layers=2)
    with pytest.raises(ValueError, match=r"sync_delay_steps: node a \(local_steps 4\): expected sync_delay_steps < "
                                         r"local_steps // fragments = 2, got 2"):
        StreamingSpec(2, 2).check(nodes, layers=2)
    with pytest.raises(ValueError, match="fragments: expected at most the model's 2 layers"):
        StreamingSpec(3).check(nodes, layers=2)
    for bad in ({"fragments": 0}, {"sync_delay_steps": -1}, {"fragment_alpha": 1.5}, {"fragment_pattern": "random"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            StreamingSpec(**bad)


def test_spec_from_plan_reads_the_plan_and_defaults_to_classic(tmp_path):
    (tmp_path / "plan.csv").write_text(_plan([("a", 1, 1, 4, 1.0)], streaming=(2, 1, 0.5, "strided")))
    assert StreamingSpec.from_plan(load_plan(tmp_path / "plan.csv")) == StreamingSpec(2, 1, 0.5, "strided")
    (tmp_path / "plan.csv").write_text(_plan([("a", 1, 1, 4, 1.0)]))
    assert StreamingSpec.from_plan(load_plan(tmp_path / "plan.csv")) == StreamingSpec()


@pytest.mark.parametrize("case", range(6))
def test_reproduces_torchft_regression_fixture(case):
    """torchft's mocked DiLoCo run (tests/fixtures/torchft/README.md) through FragmentedOuter:
    every replica's weights after every step, and the global weights after every sync, exactly
    (the values are small dyadic fractions, exact in fp32; torchft itself allows 1e-5)."""
    tau, alpha = FIXTURE_CASES[case]
    path = FIXTURES / f"torchft.diloco_regression_test.DiLoCoMockedUpdateTest.test_diloco_mocked_updates_{case}.json"
    fixture = json.loads(path.read_text())
    spec, sync_every = StreamingSpec(2, tau, alpha), 6
    names = ["layers.0.weight", "layers.1.weight"]
    replicas = []
    for _ in fixture:
        params = [torch.ones(1, 1) for _ in names]
        replicas.append((params, FragmentedOuter(OuterState(params), fragment_layout(names, 2, "sequential"))))
    history = {0: [[p.tolist() for p in params] for params, _ in replicas]}
    global_history = {0: [[o.outer.global_flat[i:i + 1].view(1, 1).tolist() for i in range(2)] for _, o in replicas]}
    prepare_at = {p: k for k, (p, _) in enumerate(spec.schedule(sync_every))}
    sync_at = {s: k for k, (_, s) in enumerate(spec.schedule(sync_every))}
    average = None
    for step in range(1, 16):
        for params, _ in replicas:
            for p in params:
                p.add_(torch.full_like(p, 2.0), alpha=-1.0)  # the mock inner step: lr 1, gradient 2
        s = (step - 1) % sync_every + 1
        if s in prepare_at:
            deltas = [o.pseudo_gradient(prepare_at[s], 1.0).clone() for _, o in replicas]
            average = sum(deltas[1:], deltas[0]) / len(deltas)  # torchft's manager: sum, then / replicas
        if s in sync_at:
            for _, o in replicas:
                o.apply(sync_at[s], average.clone(), lr=2.0, momentum=0.0, alpha=alpha)
            global_history[step] = [[o.outer.global_flat[i:i + 1].view(1, 1).tolist() for i in range(2)]
                                    for _, o in replicas]
        history[step] = [[p.tolist() for p in params] for params, _ in replicas]
    compared = 0
    for r, replica in enumerate(fixture):
        for step, values in replica[0]["history"].items():
            assert [values[n] for n in names] == history[int(step)][r], f"replica {r} step {step}"
            compared += 1
        for step, values in replica[0]["global_parameter_history"].items():
            assert [values[n] for n in names] == global_history[int(step)][r], f"replica {r} global, step {step}"
    assert compared == 2 * 16


# --- executor runs (gloo, tiny model, one torch thread per process) ------------------------------

PLAN_HEADER = ("strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s,collective,payload_dtype,"
               "link_gbps,fragments,sync_delay_steps,fragment_alpha,fragment_pattern")


def _plan(nodes, collective="ring", payload="fp32", step_s=0.01, comm_s=0.0, streaming=None) -> str:
    """nodes: (name, gpus, batch, H, link_gbps); streaming: (P, τ, α, pattern), or empty cells (classic)."""
    cells = ",".join(map(str, streaming)) if streaming else ",,,"
    rows = [f"test,{n},{g},{b},{h},{step_s},{g * b * h * 32},{comm_s},{collective},{payload},{link},{cells}"
            for n, g, b, h, link in nodes]
    return "\n".join([PLAN_HEADER, *rows]) + "\n"


def _run(tmp: Path, name: str, plan: str, rounds: int = 2, streaming: StreamingSpec | None = None,
         **opts) -> Path:
    d = tmp / name
    if not d.exists():
        d.mkdir()
        (d / "plan.csv").write_text(plan)
        (d / "scenario.toml").write_text(scenario_text(rounds))
    opts.setdefault("checkpoint_final", True)  # the tests read the end's θ_g from its set
    options = ExecOptions(out_dir=str(d / "out"), threads=1, progress=False, summary=False, streaming=streaming, **opts)
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    return d


def _weights(d: Path) -> dict[str, torch.Tensor]:
    return torch.load(d / "out" / "final_weights.pt", weights_only=True)


def _global(d: Path, node: int) -> torch.Tensor:
    return latest_state(d / "out", node)["outer"]["global_flat"]


HETERO = [("a", 2, 1, 3, 2.0), ("b", 1, 2, 2, 1.0)]  # a 2-device node, unequal H and links


def test_p1_streaming_loop_is_the_classic_loop_bit_for_bit(tmp_path):
    """The streaming loop (background thread, fragment views) with P = 1, τ = 0, α = 0 gives the
    classic executor's weights exactly, here with int8 payloads over a partitioned all-reduce."""
    plan = _plan(HETERO, "partitioned", "int8")
    classic = _run(tmp_path, "classic", plan)
    streamed = _run(tmp_path, "streamed", plan, streaming=StreamingSpec())
    a, b = _weights(classic), _weights(streamed)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert torch.equal(_global(classic, 1), _global(streamed, 1))
    frags = pd.read_csv(streamed / "out" / "syncs.csv")
    assert len(frags) == 2 * 2 and list(frags["fragment"]) == [0, 0, 0, 0]
    trace = pd.read_csv(streamed / "out" / "trace.csv")
    assert list(trace["bytes_sent"]) == list(pd.read_csv(classic / "out" / "trace.csv")["bytes_sent"])


@pytest.mark.parametrize("collective,payload,pattern", [("partitioned", "int8", "sequential"), ("ring", "fp16", "strided")])
def test_fragments_travel_in_every_payload_and_collective(tmp_path, collective, payload, pattern):
    """Each fragment is averaged by the plan's collective in the plan's payload: every node ends
    with the same θ_g bits, and each fragment's bytes are the schema's formula for its size."""
    d = _run(tmp_path, "run", _plan(HETERO, collective, payload, streaming=(2, 0, 0.5, pattern)))
    assert torch.equal(_global(d, 0), _global(d, 1))
    from facts.presets import load_arch
    from train.models import build_model

    names = [n for n, _ in build_model(load_arch("tiny"), 32, seed=0).named_parameters()]
    sizes = [p.numel() for p in build_model(load_arch("tiny"), 32, seed=0).parameters()]
    numel = [sum(sizes[i] for i in idx) for idx in fragment_layout(names, 2, pattern)]
    frags = pd.read_csv(d / "out" / "syncs.csv")
    assert len(frags) == 2 * 2 * 2  # rounds × fragments × nodes
    for (node, k), rows in frags.groupby(["node", "fragment"]):
        want = bytes_sent_per_sync(numel[k], payload, collective, [2.0, 1.0])[["a", "b"].index(node)]
        assert set(rows["bytes_sent"]) == {want}
    trace = pd.read_csv(d / "out" / "trace.csv")
    per_round = frags.groupby(["round", "node"], sort=False)["bytes_sent"].sum()
    assert [per_round[(r, n)] for r, n in zip(trace["round"], trace["node"])] == list(trace["bytes_sent"])
    # The round's times add up: compute + idle + comm = the round (docs/DESIGN.md's accounting).
    total = trace["compute_s"] + trace["idle_s"] + trace["comm_s"]
    assert ((total - (trace["round_end_s"] - trace["round_start_s"])).abs() < 1e-9).all()


def test_resume_mid_run_equals_uninterrupted(tmp_path):
    """Checkpoints at round ends (nothing in flight) hold θ_g, per-fragment momentum and the
    model's own weights, which τ and α keep apart from θ_g: a resumed run is the same bits."""
    plan = _plan([("a", 1, 2, 4, 1.0), ("b", 1, 1, 4, 1.0)], streaming=(2, 1, 0.5, "sequential"))
    whole = _run(tmp_path, "whole", plan, rounds=3)
    part = _run(tmp_path, "part", plan, rounds=3, stop_after=1)
    _run(tmp_path, "part", plan, rounds=3, resume=True)
    a, b = _weights(whole), _weights(part)
    assert all(torch.equal(a[n], b[n]) for n in a)
    frags = pd.read_csv(part / "out" / "syncs.csv")
    assert list(frags["round"]) == [0] * 4 + [1] * 4 + [2] * 4
    # The model's weights differ from θ_g here, so a resume that reloaded only θ_g would differ.
    state = latest_state(part / "out", 0)
    assert not torch.equal(state["streaming"]["model_flat"], state["outer"]["global_flat"])


def test_delay_hides_the_sync_behind_inner_steps(tmp_path):
    """Under --emulate each step lasts 0.1 s and each fragment's average 0.2 s (P = 2, H = 8).
    With τ = 0 the node waits for the whole average at the merge point; with τ = 3 the average
    runs during three steps (0.3 s) and almost nothing is left exposed. Bound: half, leaving room
    for a loaded machine's thread scheduling (with τ = 0 each exposed wait is the 0.2 s pad, less
    at most the pseudo-gradient time between the sync point and the merge point)."""
    exposed = {}
    for tau in (0, 3):
        plan = _plan([("a", 1, 1, 8, 1.0), ("b", 1, 1, 8, 1.0)], step_s=0.1, comm_s=0.2,
                     streaming=(2, tau, 0.0, "sequential"))
        d = _run(tmp_path, f"tau{tau}", plan, emulate=True)
        syncs = pd.read_csv(d / "out" / "syncs.csv")
        assert len(syncs) == 2 * 2 * 2 and ((syncs["end_s"] - syncs["start_s"]) >= 0.2).all()
        exposed[tau] = syncs["exposed_s"].sum()
    assert exposed[0] >= 8 * 0.15
    assert exposed[3] <= 0.5 * exposed[0], exposed


def test_bad_streaming_settings_are_one_line_errors(tmp_path, capfd):
    """Settings the plan cannot carry (formats/plan.py) or the model cannot (more fragments than
    layers): one line naming the file and key, status 2, nothing written."""
    cases = {"delay": ((2, 2, 0.0, "sequential"), ("sync_delay_steps: node a (local_steps 4): expected "
                       "sync_delay_steps < local_steps // fragments = 2, got 2")),
             "layers": ((3, 0, 0.0, "strided"), "fragments: expected at most the model's 2 layers, got 3")}
    for name, (streaming, message) in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / "plan.csv").write_text(_plan([("a", 1, 1, 4, 1.0), ("b", 1, 1, 4, 1.0)], streaming=streaming))
        (d / "scenario.toml").write_text(scenario_text(1))
        options = ExecOptions(out_dir=str(d / "out"), threads=1, progress=False)
        assert launch(d / "plan.csv", d / "scenario.toml", options) == 2
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"real: {d / 'plan.csv'}") and err[0].endswith(message), err
        assert not (d / "out").exists()
