"""A sharded node (FSDP2 over its 2 processes, gloo) trains the same weights as an unsharded one.

Node a has 2 devices at batch 2 per device, node b 1 device; two rounds of DiLoCo, so the
sharded node's pseudo-gradient goes through the gather to its leader, the cross-node average
and the scatter back to the shards (real/core/sharding.py). Sharded and unsharded differ only in
float summation order: FSDP2 averages gradients by a reduce-scatter of each parameter where
the unsharded node all-reduces one flat vector, and the gradient norm for clipping is summed
over shards then across processes instead of over whole tensors. Those are rounding-level
differences per step (~1e-7 relative) that Adam's g/sqrt(v) can amplify on weights with tiny
gradients: the same tolerance as a 2-device node against one process at twice the batch
(tests/test_real_nodes.py). Activation checkpointing recomputes the same kernels on the same
inputs, so on CPU it changes no bit.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from facts.presets import load_arch
from formats.plan import NodePlan, Plan
from formats.wire import bytes_sent_per_sync
from real.checkpoint.checkpoint import latest_state
from real.core.options import ExecOptions
from real.core.sharding import ShardingSpec
from real.process.launch import launch
from tests.test_real_runs import SEQ_LEN, _distance, scenario_text
from train.models import build_model

NODES = [("a", 2, 2, 3), ("b", 1, 3, 2)]


def _plan_text(per_node: dict[str, dict], collective: str = "", payload_dtype: str = "") -> str:
    lines = [("strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s,sharding,"
             "activation_checkpointing,collective,payload_dtype,link_gbps")]
    for name, g, b, h in NODES:
        cells = per_node.get(name, {})
        lines.append(f"test,{name},{g},{b},{h},0.01,{g * b * h * SEQ_LEN},0.0,{cells.get('sharding', '')},"
                     f"{cells.get('activation_checkpointing', '')},{collective},{payload_dtype},"
                     f"{cells.get('link_gbps', '')}")
    return "\n".join(lines) + "\n"


def _run(tmp: Path, name: str, per_node: dict | None = None, wire: tuple[str, str] = ("", ""), **opts) -> Path:
    d = tmp / name
    d.mkdir(exist_ok=True)
    (d / "plan.csv").write_text(_plan_text(per_node or {}, *wire))
    (d / "scenario.toml").write_text(scenario_text(rounds=2))
    options = ExecOptions(out_dir=str(d / "out"), threads=1, progress=False, summary=False, **opts)
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    return d


def _weights(d: Path) -> dict[str, torch.Tensor]:
    return torch.load(d / "out" / "final_weights.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Path]:
    """Node a unsharded, and node a under FSDP; two rounds each."""
    tmp = tmp_path_factory.mktemp("sharding")
    return {"none": _run(tmp, "none"), "fsdp": _run(tmp, "fsdp", {"a": {"sharding": "fsdp"}})}


def test_sharded_node_equals_unsharded_node(reference):
    want, got = _weights(reference["none"]), _weights(reference["fsdp"])
    assert list(got) == list(want)  # full tensors under the unsharded names
    start = [p.detach() for p in build_model(load_arch("tiny"), SEQ_LEN, seed=7).parameters()]
    travelled = _distance(list(want.values()), start)
    assert _distance(list(got.values()), list(want.values())) < 1e-4 * travelled
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=5e-5)
    trace, ref = pd.read_csv(reference["fsdp"] / "out" / "trace.csv"), pd.read_csv(reference["none"] / "out" / "trace.csv")
    assert (trace["loss"] - ref["loss"]).abs().max() < 1e-4
    # The leader sends the canonical full pseudo-gradient, as an unsharded node's.
    params = sum(p.numel() for p in start)
    assert list(trace["bytes_sent"]) == bytes_sent_per_sync(params, "fp32", "ring", [1.0, 1.0]) * 2
    assert (trace["peak_mem_bytes"] > 0).all() and (ref["peak_mem_bytes"] > 0).all()
    # The check can fail: the unsharded run moved the weights far beyond the tolerance.
    assert travelled > 1e3 * 5e-5


def test_recomputation_zero2_and_resume_change_no_bit(reference, tmp_path):
    """zero2 (weights kept gathered from forward to backward) with activation checkpointing,
    stopped after round 1 and resumed from its checkpoints: the same bits as fsdp straight
    through. zero2 and fsdp run the same reduce-scatters and updates (only when weights are
    freed differs); recomputation repeats the same kernels; the checkpoint is exact."""
    node = {"a": {"sharding": "zero2", "activation_checkpointing": "full"}}
    _run(tmp_path, "split", node, stop_after=1)
    resumed = _run(tmp_path, "split", node, resume=True)
    want, got = _weights(reference["fsdp"]), _weights(resumed)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    # The checkpoint holds the canonical form: full θ_g and full AdamW moments.
    state = latest_state(resumed / "out", 0)
    assert state["outer"]["global_flat"].numel() == sum(v.numel() for v in want.values())
    assert state["inner_optimizer"]["state"][0]["exp_avg"].shape == next(iter(want.values())).shape


def test_sharded_node_with_int8_partitioned_payloads(reference, tmp_path):
    """The leader sends the whole canonical pseudo-gradient through the plan's payload and
    collective: int8, partitioned over unequal links. Its bytes are exactly an unsharded node's
    (formats.wire.bytes_sent_per_sync). Its weights stay near the fp32 run's: int8 rounds each
    value by at most half of its chunk's scale max|x|/127 per encoding, a few tenths of a
    percent of the pseudo-gradient, where a misplaced shard would be of the order of the
    distance travelled."""
    node = {"a": {"sharding": "fsdp", "link_gbps": 1.0}, "b": {"link_gbps": 3.0}}
    run = _run(tmp_path, "int8", node, wire=("partitioned", "int8"))
    want, got = _weights(reference["fsdp"]), _weights(run)
    params = sum(v.numel() for v in want.values())
    trace = pd.read_csv(run / "out" / "trace.csv")
    assert list(trace["bytes_sent"]) == bytes_sent_per_sync(params, "int8", "partitioned", [1.0, 3.0]) * 2
    start = [p.detach() for p in build_model(load_arch("tiny"), SEQ_LEN, seed=7).parameters()]
    travelled = _distance(list(want.values()), start)
    distance = _distance(list(got.values()), list(want.values()))
    assert 0 < distance < 2e-2 * travelled, distance / travelled


def test_sharding_spec_reads_the_resolved_plan():
    plan = Plan(strategy="t", nodes=(NodePlan("a", 2, 1, 1, 0.1, sharding="fsdp", activation_checkpointing="full"),
                                     NodePlan("b", 1, 1, 1, 0.1)), comm_s=0.0, seq_len=8).resolved(1)
    assert ShardingSpec.of(plan, plan.nodes[0]) == ShardingSpec("fsdp", "full", "cpu")
    assert ShardingSpec.of(plan, plan.nodes[1]) == ShardingSpec("none", "none", "cpu")


def _layout_worker(rank: int, world: int, store_path: str, results) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from real.core.sharding import ShardLayout

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    torch.manual_seed(0)
    # Odd shapes: 5 rows over 3 processes (2, 2, 1), 2 rows (one process holds none), 1 row.
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2), torch.nn.Linear(2, 1))
    full = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    shapes = [p.shape for p in model.parameters()]
    group = dist.new_group(list(range(world)))
    fully_shard(model, mesh=DeviceMesh.from_group(group, "cpu"))
    layout = ShardLayout(list(model.parameters()), shapes, group, world)
    local = torch.cat([t.detach().reshape(-1) for t in layout.local_tensors()])
    gathered = layout.gather(local)
    back = torch.empty_like(local)
    layout.scatter(full * 2 if rank == 0 else None, back)
    results[rank] = (gathered, local, layout.local_slice(full), back, layout.local_slice(full * 2))
    dist.destroy_process_group()


def test_shard_layout_round_trips_uneven_shards(tmp_path):
    """gather() rebuilds the canonical flat vector from FSDP2's shards, scatter() and
    local_slice() cut it back, for dim-0 sizes that do not divide by G (empty shards too)."""
    import torch.multiprocessing as mp

    world = 3
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_layout_worker, args=(world, str(tmp_path / "store"), results), nprocs=world)
        results = dict(results)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2), torch.nn.Linear(2, 1))
    full = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(results[0][0], full)
    assert results[1][0] is None and results[2][0] is None
    for rank in range(world):
        _, local, sliced, back, want_back = results[rank]
        assert torch.equal(local, sliced) and torch.equal(back, want_back)
    assert sum(results[r][1].numel() for r in range(world)) == full.numel()


def _sharded_copy(group):
    """The test model, sharded over `group` by FSDP2 (fresh weights), and an AdamW over it."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(1)  # other weights than the model moved into it
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2), torch.nn.Linear(2, 1))
    fully_shard(model, mesh=DeviceMesh.from_group(group, "cpu"))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _whole(model, optimizer) -> list[torch.Tensor]:
    """Every weight and AdamW moment, whole (a collective when sharded)."""
    from torch.distributed.tensor import DTensor

    def full(t):
        return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()

    return ([full(p) for p in model.parameters()]
            + [full(optimizer.state[p][k]) for p in model.parameters() for k in ("exp_avg", "exp_avg_sq")])


def _move_worker(rank: int, world: int, tmp: str, results) -> None:
    import torch.distributed as dist

    from real.core.sharding import move_shards

    torch.set_num_threads(1)

    def step(model, optimizer):
        model(torch.ones(4, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # whole → sharded (a continue run's first epoch): an unsharded model after one AdamW step
    torch.manual_seed(0)
    whole = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2), torch.nn.Linear(2, 1))
    whole_opt = torch.optim.AdamW(whole.parameters(), lr=0.1)
    step(whole, whole_opt)
    dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store0", world), rank=rank, world_size=world)
    model, optimizer = _sharded_copy(dist.new_group(list(range(world))))
    move_shards(list(model.parameters()), list(whole.parameters()), optimizer, whole_opt.state_dict())
    first = _whole(model, optimizer)
    step(model, optimizer)  # the moved state trains on; what it holds now moves to the next epoch's group
    held = _whole(model, optimizer)
    dist.destroy_process_group()  # the epoch's group is gone; the shards stay in memory
    # sharded → sharded over the next epoch's group
    dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store1", world), rank=rank, world_size=world)
    again, again_opt = _sharded_copy(dist.new_group(list(range(world))))
    move_shards(list(again.parameters()), list(model.parameters()), again_opt, optimizer.state_dict())
    results[rank] = (_whole(whole, whole_opt), first, held, _whole(again, again_opt))
    dist.destroy_process_group()


def test_shards_move_to_a_new_mesh_without_loss(tmp_path):
    """move_shards (a continue run's sharded node entering an epoch, real/process/worker.py reshard_parts):
    a whole model's weights and AdamW moments land in a model sharded over a new group, and a sharded
    one's in a model sharded over the next group after the first is destroyed, bit for bit, uneven
    shards (5 rows over 3 processes, 1 row: empty shards) included."""
    import torch.multiprocessing as mp

    world = 3
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_move_worker, args=(world, str(tmp_path), results), nprocs=world)
        results = dict(results)
    for rank in range(world):
        whole, first, held, again = results[rank]
        assert len(whole) == len(first) == 18
        assert all(torch.equal(a, b) for a, b in zip(whole, first))
        assert not all(torch.equal(a, b) for a, b in zip(first, held))  # the step after the move changed them
        assert all(torch.equal(a, b) for a, b in zip(held, again))
