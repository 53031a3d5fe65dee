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
measured. Times are relative to a common start (a barrier right before round 0). Checkpoints
and resuming are real/checkpoint/checkpoint.py's: it reads and restores the Node's attributes. Nothing
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
from real.core.config import RunSpec
from real.core.data import make_shard
from real.core.diloco import OuterState, averaging_weights
from real.core.groups import Groups, SoloGroups
from real.core.options import ExecOptions, run_config, run_kind
from real.core.sharding import ShardingSpec, move_shards, node_scaler, prepare_model
from real.core.streaming import SYNC_NUMERIC, StreamingSpec, write_syncs
from real.core.sync import CrossNodeSync
from real.membership.members import Elastic, Fixed
from real.rounds.adaptive import AdaptiveRounds
from real.rounds.rounds import InnerSteps, NodeParts, make_round
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
                       batch=me.batch_size, local_steps=me.local_steps, total_steps=spec.rounds * me.local_steps,
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
    layout = prepare_model(model, sharding, node_group, gpus, device, compiled=use_compile(spec.compile, device))
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


def progress_bar(opts: ExecOptions, spec: RunSpec, me, rounds_done: int = 0):
    """The progress bar over the run's inner steps (shown by the first process), or None."""
    if not opts.progress:
        return None

    # tqdm's default lock is a multiprocessing semaphore, which the os._exit at the end
    # would leak (a resource_tracker warning); one process needs only a thread lock.
    tqdm.set_lock(threading.RLock())
    return tqdm(total=spec.rounds * me.local_steps, initial=rounds_done * me.local_steps,
                desc=f"DiLoCo ({me.node})", unit="step", file=sys.stderr, dynamic_ncols=True)


def warm_up(model, batch_size: int, seq_len: int, device: torch.device) -> None:
    """One forward/backward on a fixed batch, gradients discarded: the first step's one-off
    costs (allocations, kernel selection) stay out of round 0. Weights, optimizer state,
    data position and RNG are untouched (the model has no dropout)."""
    batch = torch.zeros((batch_size, seq_len), dtype=torch.long, device=device)
    model(input_ids=batch, labels=batch).loss.backward()
    model.zero_grad(set_to_none=True)


class Node:
    """One process of one node of the DiLoCo run: its parts, its round, and the run's state
    that checkpoints hold (real/checkpoint/checkpoint.py reads and restores these attributes)."""

    def __init__(self, rank: int, world: int, local_rank: int, spec: RunSpec, plan: Plan,
                 opts: ExecOptions, backend: str, data_tokens=None, store=None, joining: bool = False):
        """store, joining: under --on-node-loss continue, the launcher's membership store and whether this
        is a lost node's restarted process (real/membership/members.py); the run-wide group is then an epoch's."""
        self.rank, self.world, self.spec, self.plan, self.opts = rank, world, spec, plan, opts
        self.device = torch.device(f"cuda:{local_rank}" if backend == "nccl" else "cpu")
        me = plan.nodes[plan.node_of_rank(rank)]
        sharding = ShardingSpec.of(plan, me)
        streaming = streaming_spec(plan, opts)
        # The outer state, and the leaders' cross-node average, live where the plan says:
        # outer_state cpu on GPUs sends the WAN traffic through gloo from host memory (as OpenDiLoCo).
        # Streaming DiLoCo syncs its fragments from the device (real/rounds/round_streaming.py), and sync-ddp
        # has no outer step: both keep the outer state beside the model.
        on_cpu = sharding.outer_state == "cpu" and run_kind(plan, opts).supports("outer_on_cpu")
        self.outer_device = torch.device("cpu") if on_cpu else self.device
        elastic = opts.on_node_loss == "continue"
        self.groups = (SoloGroups(plan, rank) if elastic else  # until it enters its first epoch
                       Groups(plan, rank, world, self.device, opts.collective_timeout_s(),
                              "gloo" if self.outer_device != self.device else None))
        self.index, self.me, self.is_leader = self.groups.index, self.groups.me, self.groups.is_leader
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        arch = load_arch(spec.model.preset)
        self.vocab_size = arch.vocab_size
        self.arch, self.sharding = arch, sharding
        # a sharded node under continue shards its model over each epoch's node group (reshard_parts)
        self.reshards = elastic and sharding.sharding != "none" and me.gpus > 1
        self.parts = build_parts(spec, plan, opts, self.groups, arch, sharding, self.outer_device, data_tokens)
        self.model, self.layout, self.outer = self.parts.model, self.parts.layout, self.parts.outer
        steps = self.parts.steps
        self.optimizer, self.scaler, self.shard = steps.optimizer, steps.scaler, steps.shard
        self.batch = self.me.batch_size  # per device
        self.config = run_config(spec, plan, opts)
        self.rounds_done = 0
        self.time_offset_s = 0.0
        self.trace: list[dict] = []
        # of the global weights a resume loaded (canonical layout; real/checkpoint/checkpoint.py)
        self.loaded_digest = None
        # adapt = rebalance | deadline (real/rounds/adaptive.py): the next round agreed at each barrier
        if plan.adaptive:
            self.parts.steps.adaptive = AdaptiveRounds(plan, self.index)
            if opts.emulate:
                self.parts.steps.adaptive.scale = opts.time_scale
        self.streaming_settings = streaming
        self.round = self.streaming = None  # its state is checkpointed when it streams
        self.held_round = None  # between a continue run's epochs: the round's (progress, state) (unbind)
        self.members = Elastic(self, store, joining) if elastic else Fixed()
        if not elastic:
            self.bind(self.groups)

    def bind(self, groups) -> None:
        """Work in the run-wide group `groups` (a continue run: each membership epoch's,
        real/membership/members.py): the parts that depend on it and the round, its state carried over."""
        self.groups, self.is_leader = groups, groups.is_leader
        if self.reshards:
            self.parts = reshard_parts(self.parts, groups, self.spec, self.arch, self.sharding)
            self.model, self.layout, self.outer = self.parts.model, self.parts.layout, self.parts.outer
            self.optimizer, self.scaler = self.parts.steps.optimizer, self.parts.steps.scaler
        if groups is not self.parts.groups:
            self.parts = bind_parts(self.parts, groups)
        self.round = make_round(self.parts, self.streaming_settings, self.spec.rounds)
        if self.held_round is not None:
            progress, state = self.held_round
            self.round.load_state_dict(state)
            self.round.progress, self.held_round = progress, None
        self.streaming = self.round if self.streaming_settings is not None else None

    def unbind(self) -> None:
        """Drop every reference to the run-wide group, so that leaving it closes its connections
        (real/membership/membership.py leave); the round's progress and state are held for the next bind."""
        if self.round is not None:
            self.held_round = (self.round.progress, self.round.state_dict())
            self.round.close()
        self.round = self.streaming = None
        self.groups = SoloGroups(self.plan, self.rank)
        self.parts = replace(self.parts, groups=self.groups, cross=None)
        self.parts.steps.groups = self.groups

    # The inner-step loop's position, which checkpoints save and restore.
    @property
    def inner_step(self) -> int:
        return self.parts.steps.inner_step

    @inner_step.setter
    def inner_step(self, value: int) -> None:
        self.parts.steps.inner_step = value

    @property
    def data_position(self) -> int:
        return self.parts.steps.data_position

    @data_position.setter
    def data_position(self, value: int) -> None:
        self.parts.steps.data_position = value

    # --- the run -------------------------------------------------------------------------
    def warm_up(self) -> None:
        warm_up(self.model, self.batch, self.spec.model.seq_len, self.device)
        self.groups.sync_device()

    def run(self) -> None:
        """Resume if asked, then the rounds (checkpoints every checkpoint_every rounds), then finish();
        who takes part in each round is the membership policy's (real/membership/members.py)."""
        if self.groups.is_leader:
            checkpoint.remove_stale(self.opts.out_dir, self.index)
        self.members.prepare(self)  # --resume, or a fresh start
        checkpoint.begin(self)  # an async or quorum run's cuts and first snapshot
        if not self.reshards:  # else warmed up once sharded, in each epoch (reshard_parts)
            self.warm_up()
        # An async or quorum run's --stop-after is a cut, not a round (real/checkpoint/checkpoint.py async_cuts).
        stop = self.opts.stop_after if self.plan.round_kind.checkpoints == "round" else None
        last = self.spec.rounds if stop is None else min(self.spec.rounds, stop)
        origin = self.members.start(self)
        shows_bar = self.rank == 0 and not getattr(self.members, "joining", False)
        bar = progress_bar(self.opts, self.spec, self.me, self.rounds_done) if shows_bar else None
        try:
            while self.rounds_done < last:
                r = self.rounds_done
                if checkpoint.stopped(self):
                    break
                self._inject_drift(r)
                row = self.members.run_round(self, r, origin, bar)
                self.rounds_done = r + 1
                if self.is_leader:
                    self.trace.append(row)
                # A sharded node's processes all take part in gathering its checkpoint.
                if checkpoint.due_here(self, last) and (self.is_leader or self.layout):
                    row["ckpt_block_s"] = checkpoint.save(self, row if self.is_leader else None)
                self.members.after_round(self, r, row)
                if bar is not None:
                    bar.set_postfix(round=r, loss=f"{row['loss']:.3f}")
        finally:
            if bar is not None:
                bar.close()
        self.members.finish(self)

    def _inject_drift(self, r: int) -> None:
        """Round r's injected drift (ExecOptions.drift): the node's steps take drift × longer, padded
        under --emulate, else through its CPU quota (train/cpulimit.py), set before the round starts."""
        if self.opts.drift is None:
            return
        factors = self.opts.drift[self.index]
        factor = factors[min(r, len(factors) - 1)]
        if factor != self.parts.steps.drift_factor and not self.opts.emulate:
            divisors = (self.opts.drift_quota or self.opts.drift)[self.index]
            set_own_quota(self.me.cpu_quota / divisors[min(r, len(divisors) - 1)])
        self.parts.steps.drift_factor = factor

    def final_weights(self) -> dict[str, torch.Tensor]:
        """{name: whole CPU tensor} of the model: a collective of the node's processes when it is sharded."""
        return (self.layout.full_weights(self.model) if self.layout is not None else
                {name: p.detach().cpu() for name, p in self.model.named_parameters()})

    def finish(self) -> None:
        """Gather the leaders' rows to rank 0, which writes trace.csv (and syncs.csv when
        streaming) and the model's final weights."""
        self.round.close()
        checkpoint.wait_writes(self)  # the last set on disk, its write time in the trace
        weights = None
        if self.index == 0:  # node 0's processes all take part when its weights are sharded
            weights = self.final_weights()
        n = len(self.plan.nodes)
        extra = list(self.round.extra_columns)
        tables = gather_tables(self.groups, n, self.trace, [*NUMERIC_COLUMNS, *extra])
        sync_tables = (gather_tables(self.groups, n, self.streaming.rows, SYNC_NUMERIC)
                       if self.streaming is not None else None)
        if tables is not None:  # rank 0
            if sync_tables is not None:
                write_syncs(self.plan, sync_tables, os.path.join(self.opts.out_dir, "syncs.csv"))
            frame = write_trace(trace_rows(self.plan, tables, extra), [node.node for node in self.plan.nodes],
                                os.path.join(self.opts.out_dir, "trace.csv"), run_columns(self.opts), extra)
            checkpoint.save_whole(weights, os.path.join(self.opts.out_dir, "final_weights.pt"))
            if self.opts.summary:
                print(summary(frame), flush=True)
        # Nobody leaves before rank 0 has written: a peer closing its sockets early can abort
        # gloo's pending work in the others.
        self.groups.barrier()
