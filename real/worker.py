"""One process of a DiLoCo node: its rounds, clocks and WAN emulation, read top to bottom.

A node with G devices runs G processes, data parallel inside the node: each device takes b
samples per step (the plan's per-device batch) and, after backward, the devices' gradients
are averaged in the node's group (real/groups.py), so the node waits for its slowest device
each step and all its processes hold the same weights and optimizer state. The outer sync is
hierarchical (as OpenDiLoCo/torchft): the leaders average the pseudo-gradients across nodes
(real/sync.py: the plan's collective and payload dtype), then each leader broadcasts the
average within its node and every process applies the same outer step.

Every kind of round runs the same inner-step loop (`inner_steps`): DiLoCo, synchronous data
parallel, and Streaming DiLoCo (real/streaming.py, which syncs fragments in the background
from hooks after chosen steps). Per round, with the leader's clock (one trace row per node,
real/trace.py):
- compute_s: the H_i inner steps, intra-node gradient all-reduces included (synchronised on
  CUDA). Under --emulate each step is padded by sleeping to step_s × time_scale from the
  plan; deadlines accumulate, so sleep overshoot does not pile up, and a step whose real
  compute overran its target is counted.
- idle_s: time blocked in a one-element all-reduce of every process (the barrier) before
  the sync: the wait for the slowest node.
- comm_s: pseudo-gradient, cross-node average, broadcast in the node, outer step; under
  --emulate padded to the plan's comm_s × time_scale.
- bytes_sent: what the leader put on the wire in the cross-node average.
Plans with sync = gradients (sync-ddp) are synchronous data parallel instead: after every
step's backward each device scales its gradients by b/B (B = Σ G_i·b_i, so the result is the
gradient of the global batch's mean loss), the node all-reduces them, the leaders average
across nodes (the same collectives and payloads), the leader broadcasts in the node, and
every device applies its own AdamW step to identical gradients; no outer step. Per round,
compute_s is the round minus idle_s (barrier waits before each cross-node average) and
comm_s (the averages and broadcasts); under --emulate each step's compute is padded to
step_s and each average to comm_s.
Times are relative to a common start (a barrier right before round 0). Checkpoints and
resuming are real/checkpoint.py's. Nothing travels as pickles: rendezvous data, checkpoint
agreement and trace rows are tensors.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import torch

from train.models import build_model
from facts.presets import load_arch
from train.step import make_optimizer, make_scaler, train_step, use_compile
from formats.plan import Plan
from real import checkpoint
from real.config import RunSpec
from real.data import make_shard
from real.diloco import OuterState, averaging_weights, inner_lr
from real.groups import Groups
from real.options import ExecOptions, run_collective, run_config, sleep_until
from real.sharding import (ShardingSpec, node_scaler, peak_memory_bytes, peak_memory_reset, prepare_model,
                           sharded_average)
from real.streaming import SYNC_NUMERIC, StreamingRound, StreamingSpec, write_syncs
from real.sync import CrossNodeSync
from real.trace import NUMERIC_COLUMNS, gather_tables, summary, trace_row, trace_rows, write_trace

__all__ = ["ExecOptions", "Node"]


@dataclass
class RoundClock:
    """What a round has measured so far, besides its start and end."""

    idle_s: float = 0.0      # barrier waits before cross-node averages (gradient rounds)
    comm_s: float = 0.0      # cross-node averages and broadcasts (gradient rounds)
    bytes_sent: int = 0
    overruns: int = 0        # emulated steps whose real compute overran step_s
    step_start: float = 0.0  # when the current inner step began
    deadline: float = 0.0    # when the current emulated step may end (DiLoCo and streaming rounds)


class Node:
    """State and loop of one process of one node of the DiLoCo run."""

    def __init__(self, rank: int, world: int, local_rank: int, spec: RunSpec, plan: Plan,
                 opts: ExecOptions, backend: str, data_tokens=None):
        self.rank, self.world, self.spec, self.plan, self.opts = rank, world, spec, plan, opts
        self.device = torch.device(f"cuda:{local_rank}" if backend == "nccl" else "cpu")
        me = plan.nodes[plan.node_of_rank(rank)]
        self.sharding = ShardingSpec.of(plan, me)
        self.gradient_sync = plan.sync == "gradients"
        streaming = opts.streaming or StreamingSpec.from_plan(plan)
        streams = not self.gradient_sync and (opts.streaming is not None or not streaming.classic)
        # The outer state, and the leaders' cross-node average, live where the plan says:
        # outer_state cpu on GPUs sends the WAN traffic through gloo from host memory (as OpenDiLoCo).
        # Streaming DiLoCo syncs its fragments from the device (real/streaming.py), and sync-ddp
        # has no outer step: both keep the outer state beside the model.
        on_cpu = self.sharding.outer_state == "cpu" and not self.gradient_sync and not streams
        self.outer_device = torch.device("cpu") if on_cpu else self.device
        self.groups = Groups(plan, rank, world, self.device, opts.collective_timeout_s(),
                             "gloo" if self.outer_device != self.device else None)
        self.index, self.me, self.is_leader = self.groups.index, self.groups.me, self.groups.is_leader
        self.leader_rank = self.groups.leader_rank
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._build_training(data_tokens)
        self._build_sync()
        self.config = run_config(spec, plan, opts)
        self.clock = RoundClock()
        self.rounds_done = 0
        self.inner_step = 0
        self.data_position = 0  # samples of the node's shard consumed (all its devices)
        self.time_offset_s = 0.0
        self.trace: list[dict] = []
        self.loaded_digest = None  # of the global weights a resume loaded (canonical layout; real/checkpoint.py)
        # Streaming DiLoCo (real/streaming.py) when the plan asks for it, or when forced by
        # ExecOptions.streaming (P = 1, τ = 0 then checks the streaming loop against this one).
        self.streaming = StreamingRound(self, streaming) if streams else None

    def _build_training(self, data_tokens) -> None:
        """The model (the same initial weights everywhere; sharded as the plan says), inner and
        outer optimizer state, data."""
        spec, opts, d = self.spec, self.opts, self.spec.diloco
        arch = load_arch(spec.model.preset)
        seq_len = spec.model.seq_len
        self.model = build_model(arch, seq_len, seed=spec.seed).to(self.device)
        self.model.train()
        self.compiled = use_compile(spec.compile, self.device)
        self.layout = prepare_model(self.model, self.sharding, self.groups.node, self.me.gpus, self.device,
                                    compiled=self.compiled)
        self.optimizer = make_optimizer(self.model, lr=d.inner_lr, weight_decay=d.weight_decay, betas=d.betas)
        self.scaler = node_scaler(make_scaler(self.device, spec.model.dtype), self.layout, self.device)
        self.outer = OuterState(self.layout.local_tensors() if self.layout else list(self.model.parameters()),
                                device=self.outer_device)
        self.batch = self.me.batch_size  # per device
        self.node_batch = self.batch * self.me.gpus
        self.tokens_per_round = self.me.tokens_per_round(seq_len)
        self.total_steps = spec.rounds * self.me.local_steps
        shard, shards = (0, 1) if opts.replicate_data else (self.index, len(self.plan.nodes))
        self.shard = make_shard(opts.data_path, seed=spec.seed, vocab_size=arch.vocab_size, seq_len=seq_len,
                                shard=shard, shards=shards, tokens=data_tokens)
        self.vocab_size = arch.vocab_size

    def _build_sync(self) -> None:
        """The averaging weights and, on leaders, the cross-node average (real/sync.py)."""
        plan, seq_len = self.plan, self.spec.model.seq_len
        tokens = [node.tokens_per_round(seq_len) for node in plan.nodes]
        coefs, self.divisor = averaging_weights(self.spec.diloco.averaging, tokens,
                                                [node.local_steps for node in plan.nodes])
        self.coef = coefs[self.index]
        params = self.layout.full_numel if self.layout else self.outer.global_flat.numel()
        self.cross = (CrossNodeSync(self.groups.leaders, len(plan.nodes), self.index, params, plan.payload_dtype,
                                    plan.collective, [node.link_gbps for node in plan.nodes])
                      if self.is_leader else None)
        self.grad_scale = self.batch / sum(node.gpus * node.batch_size for node in plan.nodes)

    # --- one round -----------------------------------------------------------------------
    def run_round(self, r: int, t0: float, bar=None) -> dict:
        """Round r: H_i inner steps and the sync; returns the node's trace row."""
        if self.gradient_sync:
            return self._gradient_round(r, t0, bar)
        if self.streaming is not None:  # Streaming DiLoCo: fragments synced in the background
            return self.streaming.run_round(r, t0, bar)
        return self._diloco_round(r, t0, bar)

    def _diloco_round(self, r: int, t0: float, bar) -> dict:
        """H_i inner steps, the barrier, then the outer sync of the pseudo-gradients."""
        peak_memory_reset(self.device)
        round_start = time.perf_counter()
        self.clock = RoundClock(deadline=round_start)
        loss_sum = self.inner_steps(self.clock, self.node_grad_sync(), bar)
        self.groups.sync_device()
        compute_end = time.perf_counter()
        self.groups.barrier()
        sync_start = time.perf_counter()
        sent = self._outer_sync()
        if self.opts.emulate:
            sleep_until(sync_start + self.plan.comm_s * self.opts.time_scale)
        sync_end = time.perf_counter()
        return self._row(r, t0, loss_sum, compute_s=compute_end - round_start, idle_s=sync_start - compute_end,
                         comm_s=sync_end - sync_start, start=round_start, end=sync_end, bytes_sent=sent)

    def _gradient_round(self, r: int, t0: float, bar) -> dict:
        """Synchronous data parallel: H steps, each ending in a global gradient average (the hook)."""
        peak_memory_reset(self.device)
        round_start = time.perf_counter()
        clock = self.clock = RoundClock(deadline=round_start)
        loss_sum = self.inner_steps(clock, self._global_grad_sync, bar)
        self.outer.capture()  # checkpoints and the resume check read θ_g
        self.groups.sync_device()
        end = time.perf_counter()
        return self._row(r, t0, loss_sum, compute_s=end - round_start - clock.idle_s - clock.comm_s,
                         idle_s=clock.idle_s, comm_s=clock.comm_s, start=round_start, end=end,
                         bytes_sent=clock.bytes_sent)

    def node_grad_sync(self):
        """The per-step gradient average of a DiLoCo round: in the node's group, when it has
        several devices and is not sharded (FSDP2 reduce-scatters the gradients itself)."""
        return self.groups.average_gradients if self.me.gpus > 1 and self.layout is None else None

    def peak_memory(self) -> int:
        """The largest peak memory of the node's device processes since the round began."""
        return self.groups.node_max(peak_memory_bytes(self.device))

    def inner_steps(self, clock: RoundClock, grad_sync, bar, after_step=None) -> torch.Tensor:
        """The round's H_i inner steps; returns the node's loss (mean over its devices) summed
        over them. after_step(step), step = 1..H_i, runs after each (streaming's fragment syncs)."""
        loss_sum = torch.zeros((), device=self.device)
        for step in range(1, self.me.local_steps + 1):
            loss_sum += self._inner_step(clock, grad_sync)
            if bar is not None:
                bar.update(1)
            if after_step is not None:
                after_step(step)
        self.groups.node_mean(loss_sum)
        return loss_sum

    def _inner_step(self, clock: RoundClock, grad_sync) -> torch.Tensor:
        """One inner step (its loss). Under --emulate a DiLoCo or streaming step is padded here to
        step_s × time_scale, deadlines accumulating; a gradient-sync step inside its hook, before
        the global average."""
        clock.step_start = step_start = time.perf_counter()
        lr = inner_lr(self.inner_step, self.spec.diloco, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # Device j of the node reads samples j·b .. j·b + b − 1 of the node's next G·b.
        start = self.data_position + self.groups.local * self.batch
        batch = self.shard.batch(start, self.batch).to(self.device, non_blocking=True)
        loss = train_step(self.model, self.optimizer, batch, self.spec.model.dtype, self.scaler, grad_sync=grad_sync)
        self.data_position += self.node_batch
        self.inner_step += 1
        if self.opts.emulate and not self.gradient_sync:
            step_target = self.me.step_s * self.opts.time_scale
            self.groups.sync_device()
            if time.perf_counter() - step_start > step_target:
                clock.overruns += 1
            clock.deadline = max(clock.deadline, step_start) + step_target
            sleep_until(clock.deadline)
        return loss

    def _outer_sync(self) -> int:
        """Pseudo-gradient, cross-node average (leaders), broadcast in the node, outer step;
        returns the bytes this node sent."""
        groups, d = self.groups, self.spec.diloco
        sent = 0
        if self.layout is not None:  # every process its own shard (real/sharding.py)
            self.outer.params = self.layout.local_tensors()
            delta = self.outer.pseudo_gradient(self.coef)
            sent = run_collective(sharded_average, self.layout, delta, self.cross, self.divisor, self.outer_device)
        else:
            if groups.is_leader:
                delta = self.outer.pseudo_gradient(self.coef)
                average, sent = run_collective(self.cross.average, delta, self.divisor)
                if average is not self.outer.delta:
                    self.outer.delta.copy_(average)
            groups.broadcast_in_node(self.outer.delta)
        self.outer.outer_step(self.outer.delta, d.outer_lr, d.outer_momentum)
        self.outer.load_into_model()
        groups.sync_device()
        return sent

    def _global_grad_sync(self, model: torch.nn.Module) -> None:
        """Synchronous data parallel: the global batch's gradient on every device (see module doc)."""
        opts, clock, groups = self.opts, self.clock, self.groups
        for p in model.parameters():  # every device sends the same layout, unused weights too
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads]).mul_(self.grad_scale)
        groups.node_sum(flat)
        if opts.emulate:
            groups.sync_device()
            if time.perf_counter() - clock.step_start > self.me.step_s * opts.time_scale:
                clock.overruns += 1
            sleep_until(clock.step_start + self.me.step_s * opts.time_scale)
        groups.sync_device()
        wait_start = time.perf_counter()
        groups.barrier()
        sync_start = time.perf_counter()
        if groups.is_leader:
            average, sent = run_collective(self.cross.average, flat, 1.0)
            if average is not flat:
                flat.copy_(average)
            clock.bytes_sent += sent
        groups.broadcast_in_node(flat)
        groups.sync_device()
        if opts.emulate:
            sleep_until(sync_start + self.plan.comm_s * opts.time_scale)
        sync_end = time.perf_counter()
        clock.idle_s += sync_start - wait_start
        clock.comm_s += sync_end - sync_start
        for g, chunk in zip(grads, torch.split(flat, [g.numel() for g in grads])):
            g.copy_(chunk.view_as(g))

    def _row(self, r: int, t0: float, loss_sum: torch.Tensor, *, compute_s: float, idle_s: float, comm_s: float,
             start: float, end: float, bytes_sent: int) -> dict:
        return trace_row(self.plan.strategy, self.me, r, compute_s=compute_s, idle_s=idle_s, comm_s=comm_s,
                         start_s=self.time_offset_s + start - t0, end_s=self.time_offset_s + end - t0,
                         loss=float(loss_sum.item()) / self.me.local_steps, tokens=self.tokens_per_round,
                         overruns=self.clock.overruns, bytes_sent=bytes_sent, peak_mem_bytes=self.peak_memory())

    # --- the run -------------------------------------------------------------------------
    def warm_up(self) -> None:
        """One forward/backward on a fixed batch, gradients discarded: the first step's one-off
        costs (allocations, kernel selection) stay out of round 0. Weights, optimizer state,
        data position and RNG are untouched (the model has no dropout)."""
        batch = torch.zeros((self.batch, self.spec.model.seq_len), dtype=torch.long, device=self.device)
        self.model(input_ids=batch, labels=batch).loss.backward()
        self.model.zero_grad(set_to_none=True)
        self.groups.sync_device()

    def run(self) -> None:
        """Resume if asked, then the rounds (each leader checkpoints after each), then finish()."""
        if self.groups.is_leader:
            checkpoint.remove_stale_temps(self.opts.out_dir, self.index)
        if self.opts.resume:
            checkpoint.resume(self)
        self.warm_up()
        last = self.spec.rounds if self.opts.stop_after is None else min(self.spec.rounds, self.opts.stop_after)
        bar = self._progress_bar()
        self.groups.barrier()
        t0 = time.perf_counter()
        try:
            for r in range(self.rounds_done, last):
                row = self.run_round(r, t0, bar)
                self.rounds_done = r + 1
                ckpt_start = time.perf_counter()
                # A sharded node's processes all take part in gathering its checkpoint.
                state = (checkpoint.node_state(self) if self.opts.checkpoint and (self.is_leader or self.layout)
                         else None)
                if self.is_leader:
                    self.trace.append(row)
                    if state is not None:
                        checkpoint.save_node(self.opts.out_dir, self.index, state)
                        row["ckpt_s"] = time.perf_counter() - ckpt_start
                if bar is not None:
                    bar.set_postfix(round=r, loss=f"{row['loss']:.3f}")
        finally:
            if bar is not None:
                bar.close()
        self.finish()

    def _progress_bar(self):
        """Rank 0's progress bar over the run's inner steps, or None."""
        if self.rank != 0 or not self.opts.progress:
            return None
        import threading

        from tqdm import tqdm

        # tqdm's default lock is a multiprocessing semaphore, which the os._exit at the end
        # would leak (a resource_tracker warning); one process needs only a thread lock.
        tqdm.set_lock(threading.RLock())
        return tqdm(total=self.spec.rounds * self.me.local_steps, initial=self.rounds_done * self.me.local_steps,
                    desc=f"DiLoCo ({self.me.node})", unit="step", file=sys.stderr, dynamic_ncols=True)

    def finish(self) -> None:
        """Gather the leaders' rows to rank 0, which writes trace.csv (and syncs.csv when
        streaming) and the model's final weights."""
        if self.streaming is not None:
            self.streaming.close()
        weights = None
        if self.index == 0:  # node 0's processes all take part when its weights are sharded
            weights = (self.layout.full_weights(self.model) if self.layout is not None else
                       {name: p.detach().cpu() for name, p in self.model.named_parameters()})
        n = len(self.plan.nodes)
        tables = gather_tables(self.groups, n, self.trace, NUMERIC_COLUMNS)
        sync_tables = (gather_tables(self.groups, n, self.streaming.rows, SYNC_NUMERIC)
                       if self.streaming is not None else None)
        if tables is not None:  # rank 0
            if sync_tables is not None:
                write_syncs(self.plan, sync_tables, os.path.join(self.opts.out_dir, "syncs.csv"))
            frame = write_trace(trace_rows(self.plan, tables), [node.node for node in self.plan.nodes],
                                os.path.join(self.opts.out_dir, "trace.csv"))
            tmp = os.path.join(self.opts.out_dir, f".final_weights.pt.tmp{os.getpid()}")
            torch.save(weights, tmp)
            os.replace(tmp, os.path.join(self.opts.out_dir, "final_weights.pt"))
            if self.opts.summary:
                print(summary(frame), flush=True)
        # Nobody leaves before rank 0 has written: a peer closing its sockets early can abort
        # gloo's pending work in the others.
        self.groups.barrier()
