"""One DiLoCo node: its process's training loop, clocks and WAN emulation.

Per round, with this process's clock only:
- compute_s: the H_i inner steps (synchronised on CUDA). Under --emulate each step is padded
  by sleeping to step_s × time_scale from the plan; deadlines accumulate, so sleep overshoot
  does not pile up, and a step whose real compute overran its target is counted.
- idle_s: time blocked in a one-element all-reduce (the barrier) before the sync: the wait
  for the slowest node.
- comm_s: the pseudo-gradient all-reduce plus the outer step; under --emulate padded to the
  plan's comm_s × time_scale.
Times are relative to a common start (a barrier right before round 0).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from calibrate.models import build_model
from calibrate.presets import load_arch
from calibrate.step import make_optimizer, make_scaler, train_step
from real import checkpoint
from real.config import Plan, RunSpec
from real.data import make_chain, make_shard
from real.diloco import OuterState, averaging_weights, inner_lr, outer_sync
from real.trace import write_trace


@dataclass(frozen=True)
class ExecOptions:
    """How to execute a plan (not what to train: that is RunSpec + Plan)."""

    out_dir: str
    emulate: bool = False
    time_scale: float = 1.0
    resume: bool = False
    data_path: str | None = None
    replicate_data: bool = False   # every node reads shard 0 (to check the arithmetic)
    timeout_s: float = 300.0       # process-group timeout: how long a lost peer can stall us
    backend: str = "auto"          # auto | gloo | nccl
    stop_after: int | None = None  # stop cleanly after this many rounds (resumable)
    threads: int = 0               # torch threads per process; 0 = cores / local processes
    progress: bool = True
    checkpoint: bool = True

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ValueError(f"--time-scale: expected a positive number, got {self.time_scale}")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout-s: expected a positive number, got {self.timeout_s}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"--backend: expected auto, gloo or nccl, got {self.backend!r}")
        if self.stop_after is not None and self.stop_after <= 0:
            raise ValueError(f"--stop-after: expected a positive number of rounds, got {self.stop_after}")


class PeerLost(RuntimeError):
    """A collective failed: a peer died or the network broke."""


def resolve_backend(backend: str, local_world: int) -> str:
    if backend != "auto":
        return backend
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    return "nccl" if cuda else "gloo"


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


class Node:
    """State and loop of one node (rank) of the DiLoCo run."""

    def __init__(self, rank: int, world: int, local_rank: int, spec: RunSpec, plan: Plan,
                 opts: ExecOptions, backend: str, data_tokens=None):
        self.rank, self.world, self.spec, self.plan, self.opts = rank, world, spec, plan, opts
        self.me = plan.nodes[rank]
        self.device = torch.device(f"cuda:{local_rank}" if backend == "nccl" else "cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        arch = load_arch(spec.model.preset)
        seq_len = spec.model.seq_len
        self.model = build_model(arch, seq_len, seed=spec.seed).to(self.device)
        self.model.train()
        d = spec.diloco
        self.optimizer = make_optimizer(self.model, lr=d.inner_lr, weight_decay=d.weight_decay, betas=d.betas)
        self.scaler = make_scaler(self.device, spec.model.dtype)
        self.outer = OuterState(list(self.model.parameters()))
        # A node with several GPUs is emulated as one process over their combined batch:
        # data-parallel replicas averaging gradients compute the same update.
        self.step_batch = self.me.batch_size * self.me.gpus
        self.tokens_per_round = self.me.local_steps * self.step_batch * seq_len
        tokens = [n.local_steps * n.batch_size * n.gpus * seq_len for n in plan.nodes]
        coefs, self.divisor = averaging_weights(d.averaging, tokens, [n.local_steps for n in plan.nodes])
        self.coef = coefs[rank]
        self.total_steps = spec.rounds * self.me.local_steps
        shard, shards = (0, 1) if opts.replicate_data else (rank, world)
        self.shard = make_shard(opts.data_path, seed=spec.seed, vocab_size=arch.vocab_size, seq_len=seq_len,
                                shard=shard, shards=shards, tokens=data_tokens)
        self.vocab_size = arch.vocab_size
        self.rounds_done = 0
        self.inner_step = 0
        self.data_position = 0
        self.time_offset_s = 0.0
        self.trace: list[dict] = []
        self._flag = torch.zeros(1, device=self.device)

    # --- collectives -------------------------------------------------------------------
    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> None:
        try:
            dist.all_reduce(tensor, op=op)
            self._sync_device()
        except (RuntimeError, dist.DistError) as exc:  # gloo/nccl report a lost peer as these
            raise PeerLost(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from exc

    def barrier(self) -> None:
        self._all_reduce(self._flag)

    # --- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "rounds_done": self.rounds_done, "rank": self.rank, "world": self.world,
            "node": self.me.node, "local_steps": self.me.local_steps, "batch_size": self.step_batch,
            "outer": self.outer.state_dict(), "inner_optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "inner_step": self.inner_step, "data_position": self.data_position,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            "trace": self.trace, "time_offset_s": self.time_offset_s,
        }

    def load_state_dict(self, state: dict, source: str) -> None:
        for key, mine in (("world", self.world), ("node", self.me.node), ("local_steps", self.me.local_steps),
                          ("batch_size", self.step_batch)):
            if state[key] != mine:
                raise ValueError(f"{source}: {key}: checkpoint has {state[key]!r}, this run has {mine!r}; "
                                 f"resume with the same plan")
        self.outer.load_state_dict(state["outer"])
        self.outer.load_into_model()
        self.optimizer.load_state_dict(state["inner_optimizer"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.rounds_done = int(state["rounds_done"])
        self.inner_step = int(state["inner_step"])
        self.data_position = int(state["data_position"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.trace = list(state["trace"])
        self.time_offset_s = max((row["round_end_s"] + row["ckpt_s"] for row in self.trace), default=0.0)

    def resume(self) -> None:
        """Load the latest round that every node holds a checkpoint of (agreed by all_gather)."""
        mine = checkpoint.load_node_candidates(self.opts.out_dir, self.rank)
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, sorted(mine))
        common = set.intersection(*(set(rounds) for rounds in everyone))
        if not common:
            if any(everyone):
                raise ValueError(f"{checkpoint.node_path(self.opts.out_dir, self.rank).parent}: the nodes' "
                                 f"checkpoints share no round ({everyone}); cannot resume")
            return  # nothing saved yet: start from the beginning
        path = mine[max(common)]
        self.load_state_dict(checkpoint.load_node(path), str(path))
        # Every node's offset becomes the latest, so the resumed timeline stays common.
        offset = torch.tensor([self.time_offset_s], dtype=torch.float64)
        dist.all_reduce(offset, op=dist.ReduceOp.MAX)
        self.time_offset_s = float(offset.item())

    # --- the loop ----------------------------------------------------------------------
    def run_round(self, r: int, t0: float, bar=None) -> dict:
        opts, d = self.opts, self.spec.diloco
        step_target = self.me.step_s * opts.time_scale
        round_start = time.perf_counter()
        deadline = round_start
        overruns = 0
        loss_sum = torch.zeros((), device=self.device)
        for _ in range(self.me.local_steps):
            step_start = time.perf_counter()
            lr = inner_lr(self.inner_step, d, self.total_steps)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            batch = self.shard.batch(self.data_position, self.step_batch).to(self.device, non_blocking=True)
            loss_sum += train_step(self.model, self.optimizer, batch, self.spec.model.dtype, self.scaler)
            self.data_position += self.step_batch
            self.inner_step += 1
            if opts.emulate:
                self._sync_device()
                now = time.perf_counter()
                if now - step_start > step_target:
                    overruns += 1
                deadline = max(deadline, step_start) + step_target
                _sleep_until(deadline)
            if bar is not None:
                bar.update(1)
        self._sync_device()
        compute_end = time.perf_counter()
        self.barrier()
        sync_start = time.perf_counter()
        outer_sync(self.outer, d, self.coef, self.divisor, self._all_reduce)
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
            "overrun_steps": overruns, "ckpt_s": 0.0,
            "local_steps": self.me.local_steps, "batch_size": self.step_batch,
        }

    def warm_up(self) -> None:
        """One forward/backward on a fixed batch, gradients discarded: the first step's one-off
        costs (allocations, kernel selection) stay out of round 0. Weights, optimizer state,
        data position and RNG are untouched (the model has no dropout)."""
        batch = torch.zeros((self.step_batch, self.spec.model.seq_len), dtype=torch.long, device=self.device)
        self.model(input_ids=batch, labels=batch).loss.backward()
        self.model.zero_grad(set_to_none=True)
        self._sync_device()

    def run(self) -> None:
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
                self.trace.append(row)
                if self.opts.checkpoint:
                    ckpt_start = time.perf_counter()
                    checkpoint.save_node(self.opts.out_dir, self.rank, self.state_dict())
                    row["ckpt_s"] = time.perf_counter() - ckpt_start
                if bar is not None:
                    bar.set_postfix(round=r, loss=f"{row['loss']:.3f}")
        finally:
            if bar is not None:
                bar.close()
        self.finish()

    def finish(self) -> None:
        """Gather every node's rows to rank 0, which writes trace.csv and the global weights."""
        rows: list = [None] * self.world
        try:
            dist.all_gather_object(rows, self.trace)
        except (RuntimeError, dist.DistError) as exc:
            raise PeerLost(str(exc).strip().splitlines()[0]) from exc
        if self.rank == 0:
            all_rows = [row for node_rows in rows for row in node_rows]
            write_trace(all_rows, [n.node for n in self.plan.nodes], os.path.join(self.opts.out_dir, "trace.csv"))
            tmp = os.path.join(self.opts.out_dir, f".final_weights.pt.tmp{os.getpid()}")
            torch.save({name: p.detach().cpu() for name, p in self.model.named_parameters()}, tmp)
            os.replace(tmp, os.path.join(self.opts.out_dir, "final_weights.pt"))
        # Nobody leaves before rank 0 has written: a peer closing its sockets early can abort
        # gloo's pending work in the others.
        self.barrier()


def init_process_group(backend: str, rank: int, world: int, timeout_s: float, store_spec: tuple | None) -> None:
    """Join the group: ("file", path) or ("tcp", host, port) from the local launcher, or
    env:// (torchrun's MASTER_ADDR/MASTER_PORT) when store_spec is None."""
    timeout = timedelta(seconds=timeout_s)
    if store_spec is None:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout)
        return
    if store_spec[0] == "file":
        store = dist.FileStore(store_spec[1], world)
    else:
        _, host, port = store_spec
        store = dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def worker_main(rank: int, world: int, local_rank: int, local_world: int, spec: RunSpec, plan: Plan,
                opts: ExecOptions, store_spec: tuple | None) -> None:
    """Entry of one node process; never returns: exits 0 when done, 1 for a lost peer, 2 for bad input."""
    name = plan.nodes[rank].node if rank < len(plan.nodes) else f"rank {rank}"
    threads = opts.threads or max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)
    backend = resolve_backend(opts.backend, local_world)
    try:
        init_process_group(backend, rank, world, opts.timeout_s, store_spec)
        node = Node(rank, world, local_rank, spec, plan, opts, backend)
        if rank == 0 and opts.data_path is None:
            chain = make_chain(spec.seed, node.vocab_size)
            print(f"real: synthetic Markov corpus over {chain.states} tokens: entropy rate "
                  f"{chain.entropy_rate():.4f} nats/token (the best achievable loss)", file=sys.stderr, flush=True)
        node.run()
    except PeerLost as exc:
        print(f"real: node {name} (rank {rank}): lost contact with its peers ({exc}); a peer process "
              f"died or the network failed; stopping", file=sys.stderr, flush=True)
        os._exit(1)  # destroy_process_group could block on the dead peer
    except ValueError as exc:
        print(f"real: node {name} (rank {rank}): {exc}", file=sys.stderr, flush=True)
        os._exit(2)
    if dist.is_initialized():
        dist.destroy_process_group()
    # Leave without running C++ static destructors: at interpreter teardown gloo/TCPStore
    # threads can still be joinable and abort the process ("terminate called without an
    # active exception") after all outputs were written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
