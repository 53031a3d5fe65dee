"""One process of a DiLoCo node: its training loop, clocks, process groups and WAN emulation.

Processes and groups. A node with G devices runs G processes (one per device), data
parallel inside the node: each device takes b samples per step (the plan's per-device
batch) and, after backward, the devices' gradients are averaged by an all-reduce in the
node's group (gloo on CPU, nccl on GPUs), so the node waits for its slowest device each step
and all its processes hold the same weights and optimizer state. Ranks go to nodes in plan
order, G_i consecutive ranks each (formats.plan.Plan.first_rank); the first is the node's
leader. The outer sync is hierarchical (as OpenDiLoCo/torchft): the leaders, one group of n
processes, average the pseudo-gradients across nodes (real/sync.py: the plan's collective
and payload dtype), then each leader broadcasts the average within its node and every
process applies the same outer step.

Per round, with the leader's clock (one trace row per node):
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
Times are relative to a common start (a barrier right before round 0). Nothing travels as
pickles: rendezvous data, checkpoint agreement and trace rows are tensors.
"""
from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from calibrate.models import build_model
from calibrate.presets import load_arch
from calibrate.step import make_optimizer, make_scaler, train_step
from real import checkpoint
from real.config import RunSpec
from real.data import make_shard
from real.diloco import OuterState, averaging_weights, inner_lr
from real.options import ExecOptions, _collective, _sleep_until, run_config
from formats.plan import Plan
from real.sharding import (ShardingSpec, node_scaler, peak_memory_bytes, peak_memory_reset, prepare_model,
                           sharded_average)
from real.streaming import SYNC_NUMERIC, StreamingRound, StreamingSpec, write_syncs
from real.sync import CrossNodeSync
from real.trace import INT_COLUMNS, NUMERIC_COLUMNS, summary, write_trace



class Node:
    """State and loop of one process of one node of the DiLoCo run."""

    def __init__(self, rank: int, world: int, local_rank: int, spec: RunSpec, plan: Plan,
                 opts: ExecOptions, backend: str, data_tokens=None):
        self.rank, self.world, self.spec, self.plan, self.opts = rank, world, spec, plan, opts
        self.index = plan.node_of_rank(rank)
        self.me = plan.nodes[self.index]
        self.leader_rank = plan.first_rank(self.index)
        self.local = rank - self.leader_rank
        self.is_leader = self.local == 0
        n = len(plan.nodes)
        self.sharding = ShardingSpec.of(plan, self.me)
        self.device = torch.device(f"cuda:{local_rank}" if backend == "nccl" else "cpu")
        # The outer state, and the leaders' cross-node average, live where the plan says:
        # outer_state cpu on GPUs sends the WAN traffic through gloo from host memory (as OpenDiLoCo).
        streaming = opts.streaming or StreamingSpec.from_plan(plan)
        streams = plan.sync != "gradients" and (opts.streaming is not None or not streaming.classic)
        # Streaming DiLoCo syncs its fragments from the device (real/streaming.py), and sync-ddp
        # has no outer step: both keep the outer state beside the model.
        on_cpu = self.sharding.outer_state == "cpu" and plan.sync != "gradients" and not streams
        self.outer_device = torch.device("cpu") if on_cpu else self.device
        # Every process creates every group, in the same order (torch.distributed requires it).
        # Each with --timeout-s: new_group's own default is 30 minutes, not the default group's.
        timeout = timedelta(seconds=opts.timeout_s)
        node_groups = [dist.new_group(list(range(plan.first_rank(i), plan.first_rank(i) + node.gpus)), timeout=timeout)
                       for i, node in enumerate(plan.nodes)]
        self.node_group = node_groups[self.index]
        leaders = dist.new_group([plan.first_rank(i) for i in range(n)], timeout=timeout,
                                 backend="gloo" if self.outer_device != self.device else None)
        self.leaders = leaders if self.is_leader else None
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        arch = load_arch(spec.model.preset)
        seq_len = spec.model.seq_len
        self.model = build_model(arch, seq_len, seed=spec.seed).to(self.device)
        self.model.train()
        self.layout = prepare_model(self.model, self.sharding, self.node_group, self.me.gpus, self.device)
        d = spec.diloco
        self.optimizer = make_optimizer(self.model, lr=d.inner_lr, weight_decay=d.weight_decay, betas=d.betas)
        self.scaler = node_scaler(make_scaler(self.device, spec.model.dtype), self.layout, self.device)
        self.outer = OuterState(self.layout.local_tensors() if self.layout else list(self.model.parameters()),
                                device=self.outer_device)
        params = self.layout.full_numel if self.layout else self.outer.global_flat.numel()
        self.batch = self.me.batch_size  # per device
        self.node_batch = self.batch * self.me.gpus
        self.tokens_per_round = self.me.tokens_per_round(seq_len)
        tokens = [node.tokens_per_round(seq_len) for node in plan.nodes]
        coefs, self.divisor = averaging_weights(d.averaging, tokens, [node.local_steps for node in plan.nodes])
        self.coef = coefs[self.index]
        self.total_steps = spec.rounds * self.me.local_steps
        shard, shards = (0, 1) if opts.replicate_data else (self.index, n)
        self.shard = make_shard(opts.data_path, seed=spec.seed, vocab_size=arch.vocab_size, seq_len=seq_len,
                                shard=shard, shards=shards, tokens=data_tokens)
        self.vocab_size = arch.vocab_size
        self.cross = (CrossNodeSync(self.leaders, n, self.index, params, plan.payload_dtype,
                                    plan.collective, [node.link_gbps for node in plan.nodes])
                      if self.is_leader else None)
        self.config = run_config(spec, plan, opts)
        self.gradient_sync = plan.sync == "gradients"
        self.grad_scale = self.batch / sum(node.gpus * node.batch_size for node in plan.nodes)
        self._step = {}  # per-round clocks of the gradient-sync hook
        self.rounds_done = 0
        self.inner_step = 0
        self.data_position = 0  # samples of the node's shard consumed (all its devices)
        self.time_offset_s = 0.0
        self.trace: list[dict] = []
        self._flag = torch.zeros(1, device=self.device)
        self._loaded_digest = None  # of the global weights a resume loaded (canonical layout)
        # Streaming DiLoCo (real/streaming.py) when the plan asks for it, or when forced by
        # ExecOptions.streaming (P = 1, τ = 0 then checks the streaming loop against this one).
        self.streaming = StreamingRound(self, streaming) if streams else None

    # --- collectives -------------------------------------------------------------------
    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        _collective(dist.all_reduce, self._flag)
        self._sync_device()

    def _node_broadcast(self, tensor: torch.Tensor) -> None:
        """The leader's `tensor` to the node's processes (staged through the device when the
        outer state is on the CPU and the node's group is nccl)."""
        if self.me.gpus == 1:
            return
        staged = tensor if tensor.device == self.device else tensor.to(self.device)
        _collective(dist.broadcast, staged, src=self.leader_rank, group=self.node_group)
        if staged is not tensor:
            tensor.copy_(staged)

    def _peak_memory(self) -> int:
        """The largest peak memory of the node's device processes since the round began."""
        peak = torch.tensor([peak_memory_bytes(self.device)], dtype=torch.int64, device=self.device)
        if self.me.gpus > 1:
            _collective(dist.all_reduce, peak, op=dist.ReduceOp.MAX, group=self.node_group)
        return int(peak.item())

    def _grad_sync(self, model: torch.nn.Module) -> None:
        """DDP's gradient average over the node's devices, as one flat all-reduce."""
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        _collective(dist.all_reduce, flat, group=self.node_group)
        flat.div_(self.me.gpus)
        for g, chunk in zip(grads, torch.split(flat, [g.numel() for g in grads])):
            g.copy_(chunk.view_as(g))

    def _global_grad_sync(self, model: torch.nn.Module) -> None:
        """Synchronous data parallel: the global batch's gradient on every device (see module doc)."""
        opts, clock = self.opts, self._step
        for p in model.parameters():  # every device sends the same layout, unused weights too
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads]).mul_(self.grad_scale)
        if self.me.gpus > 1:
            _collective(dist.all_reduce, flat, group=self.node_group)
        if opts.emulate:
            self._sync_device()
            if time.perf_counter() - clock["step_start"] > self.me.step_s * opts.time_scale:
                clock["overruns"] += 1
            _sleep_until(clock["step_start"] + self.me.step_s * opts.time_scale)
        self._sync_device()
        wait_start = time.perf_counter()
        self.barrier()
        sync_start = time.perf_counter()
        if self.is_leader:
            average, sent = _collective(self.cross.average, flat, 1.0)
            if average is not flat:
                flat.copy_(average)
            clock["bytes"] += sent
        if self.me.gpus > 1:
            _collective(dist.broadcast, flat, src=self.leader_rank, group=self.node_group)
        self._sync_device()
        if opts.emulate:
            _sleep_until(sync_start + self.plan.comm_s * opts.time_scale)
        sync_end = time.perf_counter()
        clock["idle"] += sync_start - wait_start
        clock["comm"] += sync_end - sync_start
        for g, chunk in zip(grads, torch.split(flat, [g.numel() for g in grads])):
            g.copy_(chunk.view_as(g))

    def _run_gradient_round(self, r: int, t0: float, bar=None) -> dict:
        """One round of synchronous data parallel: H steps, each ending in a global gradient average."""
        d = self.spec.diloco
        self._step = {"idle": 0.0, "comm": 0.0, "bytes": 0, "overruns": 0}
        peak_memory_reset(self.device)
        round_start = time.perf_counter()
        loss_sum = torch.zeros((), device=self.device)
        for _ in range(self.me.local_steps):
            self._step["step_start"] = time.perf_counter()
            for group in self.optimizer.param_groups:
                group["lr"] = inner_lr(self.inner_step, d, self.total_steps)
            start = self.data_position + self.local * self.batch
            batch = self.shard.batch(start, self.batch).to(self.device, non_blocking=True)
            loss_sum += train_step(self.model, self.optimizer, batch, self.spec.model.dtype, self.scaler,
                                   grad_sync=self._global_grad_sync)
            self.data_position += self.node_batch
            self.inner_step += 1
            if bar is not None:
                bar.update(1)
        if self.me.gpus > 1:
            _collective(dist.all_reduce, loss_sum, group=self.node_group)
            loss_sum /= self.me.gpus
        self.outer.capture()  # checkpoints and the resume check read θ_g
        self._sync_device()
        end = time.perf_counter()
        clock = self._step
        return {
            "strategy": self.plan.strategy, "node": self.me.node, "round": r,
            "compute_s": end - round_start - clock["idle"] - clock["comm"], "idle_s": clock["idle"],
            "comm_s": clock["comm"],
            "round_start_s": self.time_offset_s + round_start - t0, "round_end_s": self.time_offset_s + end - t0,
            "loss": float(loss_sum.item()) / self.me.local_steps, "tokens": self.tokens_per_round,
            "overrun_steps": clock["overruns"], "ckpt_s": 0.0,
            "local_steps": self.me.local_steps, "batch_size": self.batch, "bytes_sent": clock["bytes"],
            "peak_mem_bytes": self._peak_memory(),
        }

    # --- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The node's checkpoint (a sharded node's gathered whole: a collective of the node)."""
        if self.layout is not None:
            outer = {key: self.layout.gather(value) for key, value in self.outer.state_dict().items()}
            inner = self.layout.full_optimizer_state(self.optimizer)
        else:
            outer, inner = self.outer.state_dict(), self.optimizer.state_dict()
        return {
            "rounds_done": self.rounds_done, "node": self.me.node, "nodes": len(self.plan.nodes),
            "gpus": self.me.gpus, "local_steps": self.me.local_steps, "batch_size": self.batch,
            "run_config": self.config,
            "outer": outer, "inner_optimizer": inner,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "inner_step": self.inner_step, "data_position": self.data_position,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            "trace": self.trace, "time_offset_s": self.time_offset_s,
            "streaming": self.streaming.state_dict() if self.streaming is not None else None,
        }

    def load_state_dict(self, state: dict, source: str) -> None:
        for key, mine in (("nodes", len(self.plan.nodes)), ("node", self.me.node), ("gpus", self.me.gpus),
                          ("local_steps", self.me.local_steps), ("batch_size", self.batch)):
            if state[key] != mine:
                raise ValueError(f"{source}: {key}: checkpoint has {state[key]!r}, this run has {mine!r}; "
                                 f"resume with the same plan")
        saved = state["run_config"]
        for key, mine in self.config.items():
            if saved.get(key) != mine:
                raise ValueError(f"{source}: {key}: the checkpoints were made with {saved.get(key)!r}, this run "
                                 f"has {mine!r}; resume with the same settings (or start afresh in another --out)")
        outer = state["outer"]
        self._loaded_digest = checkpoint.weights_digest(outer["global_flat"], outer["momentum"])
        if self.layout is not None:
            self.outer.load_state_dict({key: self.layout.local_slice(value) for key, value in outer.items()})
            self.layout.load_optimizer_state(self.optimizer, state["inner_optimizer"])
        else:
            self.outer.load_state_dict(outer)
            self.optimizer.load_state_dict(state["inner_optimizer"])
        self.outer.load_into_model()
        if self.streaming is not None:  # the model's own weights, which streaming keeps apart from θ_g
            self.streaming.load_state_dict(state["streaming"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.rounds_done = int(state["rounds_done"])
        self.inner_step = int(state["inner_step"])
        self.data_position = int(state["data_position"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.trace = [dict(row) for row in state["trace"]] if self.is_leader else []
        self.time_offset_s = max((row["round_end_s"] + row["ckpt_s"] for row in state["trace"]), default=0.0)

    def _all_gather_ints(self, values: list[int]) -> list[list[int]]:
        mine = torch.tensor(values, dtype=torch.int64, device=self.device)  # nccl needs device tensors
        everyone = [torch.empty_like(mine) for _ in range(self.world)]
        _collective(dist.all_gather, everyone, mine)
        return [t.cpu().tolist() for t in everyone]

    def resume(self) -> None:
        """Load the latest round that every node holds intact (agreed by an all-gather of the
        rounds each node can load), then check that every node loaded the same global weights."""
        mine = checkpoint.load_node_candidates(self.opts.out_dir, self.index, report=self.is_leader)
        rounds = sorted(mine, reverse=True)[:2]
        everyone = self._all_gather_ints(rounds + [-1] * (2 - len(rounds)))
        per_node = [set(r for r in everyone[self.plan.first_rank(i)] if r >= 0) for i in range(len(self.plan.nodes))]
        common = set.intersection(*per_node)
        if not common:
            if any(per_node):
                raise ValueError(f"{checkpoint.node_path(self.opts.out_dir, self.index).parent}: the nodes' "
                                 f"checkpoints share no round ({[sorted(s) for s in per_node]}); cannot resume")
            return  # nothing saved yet: start from the beginning
        path = mine[max(common)]
        self.load_state_dict(checkpoint.load_node(path), str(path))
        digests = [d[0] for d in self._all_gather_ints([self._loaded_digest])]
        leaders = [digests[self.plan.first_rank(i)] for i in range(len(self.plan.nodes))]
        if len(set(digests)) != 1:
            odd = [self.plan.nodes[i].node for i, d in enumerate(leaders) if leaders.count(d) <= len(leaders) // 2]
            raise ValueError(f"{path.parent}: round {max(common)}: the nodes' checkpoints hold different global "
                             f"weights (node {', '.join(odd) or 'processes of one node'} differ{'s' if len(odd) == 1 else ''}); "
                             f"a checkpoint was altered or mixed from another run; refusing to resume")
        # Every node's offset becomes the latest, so the resumed timeline stays common.
        offset = torch.tensor([self.time_offset_s], dtype=torch.float64, device=self.device)
        _collective(dist.all_reduce, offset, op=dist.ReduceOp.MAX)
        self.time_offset_s = float(offset.item())

    # --- the loop ----------------------------------------------------------------------
    def train_inner_step(self, clock: dict, grad_sync=None) -> torch.Tensor:
        """One DiLoCo inner step (the loss); under --emulate padded to the plan's step time, with
        clock["deadline"] accumulating and clock["overruns"] counting steps that overran it."""
        opts = self.opts
        step_start = time.perf_counter()
        lr = inner_lr(self.inner_step, self.spec.diloco, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # Device j of the node reads samples j·b .. j·b + b − 1 of the node's next G·b.
        start = self.data_position + self.local * self.batch
        batch = self.shard.batch(start, self.batch).to(self.device, non_blocking=True)
        loss = train_step(self.model, self.optimizer, batch, self.spec.model.dtype, self.scaler, grad_sync=grad_sync)
        self.data_position += self.node_batch
        self.inner_step += 1
        if opts.emulate:
            step_target = self.me.step_s * opts.time_scale
            self._sync_device()
            if time.perf_counter() - step_start > step_target:
                clock["overruns"] += 1
            clock["deadline"] = max(clock["deadline"], step_start) + step_target
            _sleep_until(clock["deadline"])
        return loss

    def run_round(self, r: int, t0: float, bar=None) -> dict:
        if self.gradient_sync:
            return self._run_gradient_round(r, t0, bar)
        if self.streaming is not None:  # Streaming DiLoCo: fragments synced in the background
            return self.streaming.run_round(r, t0, bar)
        opts, d = self.opts, self.spec.diloco
        grad_sync = self._grad_sync if self.me.gpus > 1 and self.layout is None else None  # FSDP2 reduce-scatters
        peak_memory_reset(self.device)
        round_start = time.perf_counter()
        clock = {"deadline": round_start, "overruns": 0}
        loss_sum = torch.zeros((), device=self.device)
        for _ in range(self.me.local_steps):
            loss_sum += self.train_inner_step(clock, grad_sync)
            if bar is not None:
                bar.update(1)
        if self.me.gpus > 1:  # the node's loss: the mean over its devices
            _collective(dist.all_reduce, loss_sum, group=self.node_group)
            loss_sum /= self.me.gpus
        self._sync_device()
        compute_end = time.perf_counter()
        self.barrier()
        sync_start = time.perf_counter()
        sent = 0
        if self.layout is not None:  # every process its own shard (real/sharding.py)
            self.outer.params = self.layout.local_tensors()
            delta = self.outer.pseudo_gradient(self.coef)
            sent = _collective(sharded_average, self.layout, delta, self.cross, self.divisor, self.outer_device)
        else:
            if self.is_leader:
                delta = self.outer.pseudo_gradient(self.coef)
                average, sent = _collective(self.cross.average, delta, self.divisor)
                if average is not self.outer.delta:
                    self.outer.delta.copy_(average)
            self._node_broadcast(self.outer.delta)
        self.outer.outer_step(self.outer.delta, d.outer_lr, d.outer_momentum)
        self.outer.load_into_model()
        self._sync_device()
        if opts.emulate:
            _sleep_until(sync_start + self.plan.comm_s * opts.time_scale)
        sync_end = time.perf_counter()
        return {
            "strategy": self.plan.strategy, "node": self.me.node, "round": r,
            "compute_s": compute_end - round_start, "idle_s": sync_start - compute_end,
            "comm_s": sync_end - sync_start,
            "round_start_s": self.time_offset_s + round_start - t0,
            "round_end_s": self.time_offset_s + sync_end - t0,
            "loss": float(loss_sum.item()) / self.me.local_steps, "tokens": self.tokens_per_round,
            "overrun_steps": clock["overruns"], "ckpt_s": 0.0,
            "local_steps": self.me.local_steps, "batch_size": self.batch, "bytes_sent": sent,
            "peak_mem_bytes": self._peak_memory(),
        }

    def warm_up(self) -> None:
        """One forward/backward on a fixed batch, gradients discarded: the first step's one-off
        costs (allocations, kernel selection) stay out of round 0. Weights, optimizer state,
        data position and RNG are untouched (the model has no dropout)."""
        batch = torch.zeros((self.batch, self.spec.model.seq_len), dtype=torch.long, device=self.device)
        self.model(input_ids=batch, labels=batch).loss.backward()
        self.model.zero_grad(set_to_none=True)
        self._sync_device()

    def run(self) -> None:
        if self.is_leader:
            checkpoint.remove_stale_temps(self.opts.out_dir, self.index)
        if self.opts.resume:
            self.resume()
        self.warm_up()
        last = self.spec.rounds if self.opts.stop_after is None else min(self.spec.rounds, self.opts.stop_after)
        bar = None
        if self.rank == 0 and self.opts.progress:
            import threading

            from tqdm import tqdm

            # tqdm's default lock is a multiprocessing semaphore, which the os._exit at the end
            # would leak (a resource_tracker warning); one process needs only a thread lock.
            tqdm.set_lock(threading.RLock())
            bar = tqdm(total=self.spec.rounds * self.me.local_steps, initial=self.rounds_done * self.me.local_steps,
                       desc=f"DiLoCo ({self.me.node})", unit="step", file=sys.stderr, dynamic_ncols=True)
        self.barrier()
        t0 = time.perf_counter()
        try:
            for r in range(self.rounds_done, last):
                row = self.run_round(r, t0, bar)
                self.rounds_done = r + 1
                ckpt_start = time.perf_counter()
                # A sharded node's processes all take part in gathering its checkpoint.
                state = self.state_dict() if self.opts.checkpoint and (self.is_leader or self.layout) else None
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

    def _gather_tables(self, rows: list[dict], columns: list[str]) -> list[list[list[float]]]:
        """Leaders only: every leader's rows (the numeric columns, as float64) in plan order."""
        mine = torch.tensor([[float(row[c]) for c in columns] for row in rows],
                            dtype=torch.float64, device=self.device).reshape(-1, len(columns))
        n = len(self.plan.nodes)
        if n == 1:
            return [mine.cpu().tolist()]
        counts = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(n)]
        _collective(dist.all_gather, counts, torch.tensor([mine.shape[0]], device=self.device), group=self.leaders)
        longest = max(int(c) for c in counts)
        padded = torch.zeros(longest, len(columns), dtype=torch.float64, device=self.device)
        padded[:mine.shape[0]] = mine
        tables = [torch.empty_like(padded) for _ in range(n)]
        _collective(dist.all_gather, tables, padded, group=self.leaders)
        return [t[:int(c)].cpu().tolist() for t, c in zip(tables, counts)]

    def finish(self) -> None:
        """Gather the leaders' rows (float64 tensors) to rank 0, which writes trace.csv (and
        syncs.csv when streaming) and the model's final weights."""
        if self.streaming is not None:
            self.streaming.close()
        weights = None
        if self.index == 0:  # node 0's processes all take part when its weights are sharded
            weights = (self.layout.full_weights(self.model) if self.layout is not None else
                       {name: p.detach().cpu() for name, p in self.model.named_parameters()})
        if self.is_leader:
            tables = self._gather_tables(self.trace, NUMERIC_COLUMNS)
            fragment_tables = (self._gather_tables(self.streaming.rows, SYNC_NUMERIC)
                               if self.streaming is not None else None)
            if self.rank == 0:
                rows = []
                for node, table in zip(self.plan.nodes, tables):
                    for values in table:
                        row = {"strategy": self.plan.strategy, "node": node.node, **dict(zip(NUMERIC_COLUMNS, values))}
                        for c in INT_COLUMNS:
                            row[c] = int(row[c])
                        rows.append(row)
                if fragment_tables is not None:
                    write_syncs(self.plan, fragment_tables, os.path.join(self.opts.out_dir, "syncs.csv"))
                frame = write_trace(rows, [node.node for node in self.plan.nodes],
                                    os.path.join(self.opts.out_dir, "trace.csv"))
                tmp = os.path.join(self.opts.out_dir, f".final_weights.pt.tmp{os.getpid()}")
                torch.save(weights, tmp)
                os.replace(tmp, os.path.join(self.opts.out_dir, "final_weights.pt"))
                if self.opts.summary:
                    print(summary(frame), flush=True)
        # Nobody leaves before rank 0 has written: a peer closing its sockets early can abort
        # gloo's pending work in the others.
        self.barrier()
