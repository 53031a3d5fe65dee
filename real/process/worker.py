"""One process of a DiLoCo node: its parts, its kind of round, the run, read top to bottom.

A node with G devices runs G processes, data parallel inside the node: each device takes b
samples per step (the plan's per-device batch) and, after backward, the devices' gradients
are averaged in the node's group (real/core/groups.py), so the node waits for its slowest device
each step and all its processes hold the same weights and optimizer state. The outer sync is
hierarchical (as OpenDiLoCo/torchft): the leaders average the pseudo-gradients across nodes
(real/core/sync.py: the plan's collective and payload dtype), then each leader broadcasts the
average within its node and every process applies the same outer step.

`Node` builds the process's parts once (`build_parts`: model, optimizer, data, outer state,
averaging; real/rounds/rounds.py's NodeParts) and one round of the plan's kind (`make_round`): DiLoCo
(real/rounds/round_classic.py), synchronous data parallel for plans with sync = gradients
(real/rounds/round_ddp.py), Streaming DiLoCo (real/rounds/round_streaming.py), or without a barrier, a parameter
server on rank 0: asynchronous DiLoCo (real/rounds/round_async.py) or quorum rounds (real/rounds/round_quorum.py).
Every kind runs the same inner-step loop (real/rounds/rounds.py) and returns one trace row per node and round
(real/rounds/trace.py), on the leader's clock; each round module says how its compute_s, idle_s and comm_s are
measured. Times are relative to a common start (a barrier right before round 0). The node's
state is one object (real/rounds/state.py NodeState, with state_dict/load_state_dict): checkpoints
and resuming are its `Checkpointer`'s (real/checkpoint/checkpoint.py), and the membership policy
works on it too; neither sees the Node. Nothing
travels as pickles: rendezvous data, checkpoint agreement and trace rows are tensors.
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import replace

import torch
from tqdm import tqdm

from facts.presets import load_arch
from formats.plan import Plan
from real.checkpoint import checkpoint
from real.checkpoint.checkpoint import Checkpointer
from real.core.config import RunSpec
from real.core.data import make_shard
from real.core.diloco import OuterState, averaging_weights
from real.core.groups import Groups, SoloGroups
from real.core.options import ExecOptions, run_config, run_kind
from real.core.sharding import ShardingSpec, move_shards, node_scaler, prepare_model
from real.core.streaming import SYNC_NUMERIC, StreamingSpec, write_syncs
from real.core.sync import CrossNodeSync
from real.membership.members import Elastic, Fixed, WorkerHooks
from real.rounds.adaptive import AdaptiveRounds
from real.rounds.rounds import InnerSteps, NodeParts, make_round
from real.rounds.state import NodeState
from real.rounds.trace import NUMERIC_COLUMNS, gather_tables, run_columns, summary, trace_rows, write_trace
from train.cpulimit import set_own_quota
from train.models import build_model
from train.step import make_optimizer, make_scaler, use_compile

__all__ = ["ExecOptions", "Node"]


def streaming_spec(plan: Plan, opts: ExecOptions) -> StreamingSpec | None:
    """The Streaming DiLoCo settings when the node runs streaming rounds, else None: when the
    plan asks for them, or when forced by ExecOptions.streaming (P = 1, τ = 0 then checks the
    streaming loop against the classic one), and the node's kind of round syncs in fragments (formats/rounds.py;
    sync-ddp never streams)."""
    spec = opts.streaming or StreamingSpec.from_plan(plan)
    return spec if run_kind(plan, opts).supports("fragments") else None


def build_parts(spec: RunSpec, plan: Plan, opts: ExecOptions, groups: Groups, arch, sharding: ShardingSpec,
                outer_device: torch.device, data_tokens=None) -> NodeParts:
    """The model (the same initial weights everywhere; sharded as the plan says, or, before a continue
    run's first epoch, whole until bind shards it), inner and outer optimizer state, data, then what
    the run-wide group gives (`bind_parts`)."""
    d, me, device, seq_len = spec.diloco, groups.me, groups.device, spec.model.seq_len
    if groups.node is None:  # before a continue run's first epoch: whole, until the node's group exists (bind)
        sharding = replace(sharding, sharding="none")
    model, layout, optimizer, scaler = build_model_parts(spec, arch, sharding, groups.node, me.gpus, device)
    outer = OuterState(layout.local_tensors() if layout else list(model.parameters()), device=outer_device)
    shard, shards = (0, 1) if opts.replicate_data else (groups.index, len(plan.nodes))
    data = make_shard(opts.data_path, seed=spec.seed, vocab_size=arch.vocab_size, seq_len=seq_len,
                      shard=shard, shards=shards, tokens=data_tokens)
    # Under --emulate a DiLoCo or streaming step is padded by the loop; sync-ddp pads in its hook.
    pad_step_s = me.step_s * opts.time_scale if opts.emulate and run_kind(plan, opts).supports("padded_steps") else None
    steps = InnerSteps(model, optimizer, scaler, data, groups, diloco=d, dtype=spec.model.dtype,
                       batch=me.batch_size, local_steps=me.local_steps, total_steps=plan.rounds * me.local_steps,
                       pad_step_s=pad_step_s)
    parts = NodeParts(plan=plan, me=me, opts=opts, diloco=d, groups=groups, device=device, outer_device=outer_device,
                      model=model, layout=layout, outer=outer, steps=steps, cross=None, coef=1.0, divisor=1.0,
                      grad_scale=1.0, tokens_per_round=me.tokens_per_round(seq_len), members=groups.members)
    return bind_parts(parts, groups)


def build_model_parts(spec: RunSpec, arch, sharding: ShardingSpec, node_group, gpus: int, device: torch.device):
    """The model (the same initial weights everywhere), sharded over `node_group` as `sharding` says, its
    shard layout (or None), the inner optimizer and the loss scaler."""
    d = spec.diloco
    model = build_model(arch, spec.model.seq_len, seed=spec.seed).to(device)
    model.train()
    # the step's decoder blocks compiled (train/step.py), before FSDP2 wraps them
    compiled = use_compile(spec.training.compile, device)
    layout = prepare_model(model, sharding, node_group, gpus, device, compiled=compiled)
    optimizer = make_optimizer(model, lr=d.inner_lr, weight_decay=d.weight_decay, betas=d.betas)
    return model, layout, optimizer, node_scaler(make_scaler(device, spec.model.dtype), layout, device)


def reshard_parts(parts: NodeParts, groups: Groups, spec: RunSpec, arch, sharding: ShardingSpec) -> NodeParts:
    """A sharded node entering a continue run's epoch: its FSDP2 mesh is over the node's group, which each
    epoch builds anew (a gloo group does not outlive its epoch: real/membership/membership.py), so the
    model is built again and sharded over the new one (build_model_parts), and takes what the node
    held, each process its own shard (real/core/sharding.py move_shards): the weights (mid-round, its
    inner steps' own), the inner AdamW's moments, the loss scale, θ_g and the outer momentum."""
    model, layout, optimizer, scaler = build_model_parts(spec, arch, sharding, groups.node, parts.me.gpus,
                                                         parts.device)
    steps, old = parts.steps, parts.outer
    move_shards(list(model.parameters()), list(parts.model.parameters()), optimizer, steps.optimizer.state_dict())
    if scaler is not None and steps.scaler is not None:
        scaler.load_state_dict(steps.scaler.state_dict())
    outer = OuterState(layout.local_tensors(), device=parts.outer_device)
    for mine, held in ((outer.global_flat, old.global_flat), (outer.momentum, old.momentum)):
        mine.copy_(held if parts.layout is not None else layout.local_slice(held))  # whole before the first epoch
    steps.model, steps.optimizer, steps.scaler = model, optimizer, scaler
    warm_up(model, parts.me.batch_size, spec.model.seq_len, parts.device)  # a collective of the node
    return replace(parts, model=model, layout=layout, outer=outer)


def bind_parts(parts: NodeParts, groups: Groups) -> NodeParts:
    """`parts` in the run-wide group `groups`: the averaging weights over its members, this share of
    their global batch (sync-ddp), and on leaders their cross-node average (real/core/sync.py)."""
    plan, me, seq_len = parts.plan, parts.me, parts.plan.seq_len
    nodes = [plan.nodes[i] for i in groups.members]
    coefs, divisor = averaging_weights(parts.diloco.averaging, [node.tokens_per_round(seq_len) for node in nodes],
                                       [node.local_steps for node in nodes])
    params = parts.layout.full_numel if parts.layout else parts.outer.global_flat.numel()
    cross = (CrossNodeSync(groups.leaders, len(nodes), groups.position, params, plan.payload_dtype,
                           plan.collective, [node.link_gbps for node in nodes])
             if groups.is_leader and groups.leaders is not None else None)
    parts.steps.groups = groups
    return replace(parts, groups=groups, cross=cross, coef=coefs[groups.position], divisor=divisor,
                   grad_scale=me.batch_size / sum(node.gpus * node.batch_size for node in nodes),
                   members=groups.members)


def progress_bar(opts: ExecOptions, rounds: int, me, rounds_done: int = 0):
    """The progress bar over the run's inner steps (shown by the first process), or None."""
    if not opts.progress:
        return None

    # tqdm's default lock is a multiprocessing semaphore, which the os._exit at the end
    # would leak (a resource_tracker warning); one process needs only a thread lock.
    tqdm.set_lock(threading.RLock())
    return tqdm(total=rounds * me.local_steps, initial=rounds_done * me.local_steps,
                desc=f"DiLoCo ({me.node})", unit="step", file=sys.stderr, dynamic_ncols=True)


def warm_up(model, batch_size: int, seq_len: int, device: torch.device) -> None:
    """One forward/backward on a fixed batch, gradients discarded: the first step's one-off
    costs (allocations, kernel selection) stay out of round 0. Weights, optimizer state,
    data position and RNG are untouched (the model has no dropout)."""
    batch = torch.zeros((batch_size, seq_len), dtype=torch.long, device=device)
    model(input_ids=batch, labels=batch).loss.backward()
    model.zero_grad(set_to_none=True)


class Node:
    """One process of one node of the DiLoCo run: its parts, its round, and the run. What checkpoints
    and membership work on is the node's `state` (real/rounds/state.py NodeState), which the Node
    hands them with its `checkpointer`, never itself; the rest (how its parts are built and bound to
    a process group) is the Node's own."""

    def __init__(self, rank: int, world: int, local_rank: int, spec: RunSpec, plan: Plan,
                 opts: ExecOptions, backend: str, data_tokens=None, store=None, joining: bool = False):
        """store, joining: under --on-node-loss continue, the launcher's membership store and whether this
        is a lost node's restarted process (real/membership/members.py); the run-wide group is then an epoch's."""
        device = torch.device(f"cuda:{local_rank}" if backend == "nccl" else "cpu")
        me = plan.nodes[plan.node_of_rank(rank)]
        sharding = ShardingSpec.of(plan, me)
        streaming = streaming_spec(plan, opts)
        # The outer state, and the leaders' cross-node average, live where the plan says:
        # outer_state cpu on GPUs sends the WAN traffic through gloo from host memory (as OpenDiLoCo).
        # Streaming DiLoCo syncs its fragments from the device (real/rounds/round_streaming.py), and sync-ddp
        # has no outer step: both keep the outer state beside the model.
        on_cpu = sharding.outer_state == "cpu" and run_kind(plan, opts).supports("outer_on_cpu")
        self.outer_device = torch.device("cpu") if on_cpu else device
        elastic = opts.on_node_loss == "continue"
        groups = (SoloGroups(plan, rank) if elastic else  # until it enters its first epoch
                  Groups(plan, rank, world, device, opts.collective_timeout_s(),
                         "gloo" if self.outer_device != device else None))
        if device.type == "cuda":
            torch.cuda.set_device(device)
        arch = load_arch(spec.model.preset)
        self.vocab_size = arch.vocab_size
        self.arch, self.sharding = arch, sharding
        # a sharded node under continue shards its model over each epoch's node group (reshard_parts)
        self.reshards = elastic and sharding.sharding != "none" and me.gpus > 1
        parts = build_parts(spec, plan, opts, groups, arch, sharding, self.outer_device, data_tokens)
        # adapt = rebalance | deadline (real/rounds/adaptive.py): the next round agreed at each barrier
        if plan.adaptive:
            parts.steps.adaptive = AdaptiveRounds(plan, groups.index)
            if opts.emulate:
                parts.steps.adaptive.scale = opts.time_scale
        self.state = NodeState(rank=rank, plan=plan, spec=spec, opts=opts, config=run_config(spec, plan, opts),
                               device=device, parts=parts)
        self.streaming_settings = streaming
        self.checkpointer = Checkpointer(self.state)
        hooks = WorkerHooks(bind=self.bind, unbind=self.unbind, final_weights=self.final_weights,
                            finish=self.finish)
        self.members = (Elastic(self.state, self.checkpointer, hooks, store, joining) if elastic else
                        Fixed(self.state, self.checkpointer, hooks))
        if not elastic:
            self.bind(groups)

    def bind(self, groups) -> None:
        """Work in the run-wide group `groups` (a continue run: each membership epoch's,
        real/membership/members.py): the parts that depend on it and the round, its state carried over."""
        state = self.state
        if self.reshards:
            state.parts = reshard_parts(state.parts, groups, state.spec, self.arch, self.sharding)
        if groups is not state.parts.groups:
            state.parts = bind_parts(state.parts, groups)
        state.round = make_round(state.parts, self.streaming_settings, state.plan.rounds)
        if state.held_round is not None:
            progress, held = state.held_round
            state.round.load_state_dict(held)
            state.round.progress, state.held_round = progress, None

    def unbind(self) -> None:
        """Drop every reference to the run-wide group, so that leaving it closes its connections
        (real/membership/membership.py leave); the round's progress and state are held for the next bind."""
        state = self.state
        if state.round is not None:
            state.held_round = (state.round.progress, state.round.state_dict())
            state.round.close()
        state.round = None
        groups = SoloGroups(state.plan, state.rank)
        state.parts = replace(state.parts, groups=groups, cross=None)
        state.parts.steps.groups = groups

    # --- the run -------------------------------------------------------------------------
    def warm_up(self) -> None:
        state = self.state
        warm_up(state.model, state.batch, state.spec.model.seq_len, state.device)
        state.groups.sync_device()

    def run(self) -> None:
        """Resume if asked, then the rounds (checkpoints every checkpoint_every rounds), then finish();
        who takes part in each round is the membership policy's (real/membership/members.py)."""
        state, ckpt, opts = self.state, self.checkpointer, self.state.opts
        if state.groups.is_leader:
            checkpoint.remove_stale(opts.out_dir, state.index)
        self.members.prepare()  # --resume, or a fresh start
        ckpt.begin()  # an async or quorum run's cuts and first snapshot
        if not self.reshards:  # else warmed up once sharded, in each epoch (reshard_parts)
            self.warm_up()
        # An async or quorum run's --stop-after is a cut, not a round (real/checkpoint/checkpoint.py async_cuts).
        stop = opts.stop_after if state.plan.round_kind.checkpoints == "round" else None
        last = state.plan.rounds if stop is None else min(state.plan.rounds, stop)
        origin = self.members.start()
        shows_bar = state.rank == 0 and not self.members.joining
        bar = progress_bar(opts, state.plan.rounds, state.me, state.rounds_done) if shows_bar else None
        try:
            while state.rounds_done < last:
                r = state.rounds_done
                if ckpt.stopped():
                    break
                self._inject_drift(r)
                row = self.members.run_round(r, origin, bar)
                state.rounds_done = r + 1
                if state.is_leader:
                    state.trace.append(row)
                # A sharded node's processes all take part in gathering its checkpoint.
                if ckpt.due_here(last) and (state.is_leader or state.layout):
                    row["ckpt_block_s"] = ckpt.save(row if state.is_leader else None)
                self.members.after_round(r, row)
                if bar is not None:
                    bar.set_postfix(round=r, loss=f"{row['loss']:.3f}")
        finally:
            if bar is not None:
                bar.close()
        self.members.finish()

    def _inject_drift(self, r: int) -> None:
        """Round r's injected drift (ExecOptions.drift): the node's steps take drift × longer, padded
        under --emulate, else through its CPU quota (train/cpulimit.py), set before the round starts."""
        opts, index, steps = self.state.opts, self.state.index, self.state.parts.steps
        if opts.drift is None:
            return
        factors = opts.drift[index]
        factor = factors[min(r, len(factors) - 1)]
        if factor != steps.drift_factor and not opts.emulate:
            divisors = (opts.drift_quota or opts.drift)[index]
            set_own_quota(self.state.me.cpu_quota / divisors[min(r, len(divisors) - 1)])
        steps.drift_factor = factor

    def final_weights(self) -> dict[str, torch.Tensor]:
        """{name: whole CPU tensor} of the model: a collective of the node's processes when it is sharded."""
        model, layout = self.state.model, self.state.layout
        return (layout.full_weights(model) if layout is not None else
                {name: p.detach().cpu() for name, p in model.named_parameters()})

    def finish(self) -> None:
        """Gather the leaders' rows to rank 0, which writes trace.csv (and syncs.csv when
        streaming) and the model's final weights."""
        state, plan, out_dir = self.state, self.state.plan, self.state.opts.out_dir
        state.round.close()
        self.checkpointer.wait_writes()  # the last set on disk, its write time in the trace
        weights = None
        if state.index == 0:  # node 0's processes all take part when its weights are sharded
            weights = self.final_weights()
        n = len(plan.nodes)
        extra = list(state.round.extra_columns)
        tables = gather_tables(state.groups, n, state.trace, [*NUMERIC_COLUMNS, *extra])
        sync_tables = (gather_tables(state.groups, n, state.round.rows, SYNC_NUMERIC)
                       if state.kind.supports("fragments") else None)
        if tables is not None:  # rank 0
            if sync_tables is not None:
                write_syncs(plan, sync_tables, os.path.join(out_dir, "syncs.csv"))
            frame = write_trace(trace_rows(plan, tables, extra), [node.node for node in plan.nodes],
                                os.path.join(out_dir, "trace.csv"), run_columns(state.opts), extra)
            checkpoint.save_whole(weights, os.path.join(out_dir, "final_weights.pt"))
            if state.opts.summary:
                print(summary(frame), flush=True)
        # Nobody leaves before rank 0 has written: a peer closing its sockets early can abort
        # gloo's pending work in the others.
        state.groups.barrier()
