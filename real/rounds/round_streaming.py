"""A Streaming DiLoCo round (real/core/streaming.py says what it computes): fragments synced in the
background between inner steps, each merged at its merge point.

Fragment k's pseudo-gradient is handed to a communication thread after its prepare step, and
its average applied after its merge step (StreamingSpec.schedule). Per fragment sync the
leader keeps a syncs.csv row (real/core/streaming.py's columns, on the run's time axis); the
round's trace.csv row has idle_s = Σ idle_s, comm_s = Σ (exposed_s + outer_s), and compute_s
the rest of the round, hidden comm included. Under --emulate each fragment's average is
padded to the plan's comm_s (one fragment sync).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from real.core.options import run_collective
from real.core.sharding import peak_memory_reset
from real.core.streaming import FragmentedOuter, StreamingSpec, fragment_layout, threads_for_comm
from real.core.sync import CrossNodeSync
from real.rounds.rounds import NodeParts, Origin, Progress, Round, RoundClock, node_grad_sync, round_row


@dataclass
class InFlight:
    fragment: int
    future: object
    compute_start: float  # perf_counter seconds
    sync_point: float
    prepare_s: float


class BackgroundSync:
    """One fragment's cross-node average at a time, on a communication thread with its own
    process groups (so it never interleaves with the main thread's collectives): the leaders
    mark the moment all have started (one-element all-reduce), average by the plan's collective
    and payload (real/core/sync.py), and broadcast in the node; other processes receive the
    broadcast. On CUDA the thread runs on its own stream."""

    def __init__(self, parts: NodeParts, crosses: list | None, leaders_group, node_group):
        self.parts = parts
        self.crosses, self.leaders_group, self.node_group = crosses, leaders_group, node_group
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="geodt-comm", initializer=threads_for_comm)
        self.stream = torch.cuda.Stream(parts.device) if parts.device.type == "cuda" else None
        self.flag = torch.zeros(1, device=parts.outer_device)

    def start(self, k: int, delta: torch.Tensor) -> object:
        event = None
        if self.stream is not None:  # the pseudo-gradient is ready on the main stream first
            event = torch.cuda.Event()
            event.record()
        return self.pool.submit(self._run, k, delta, event)

    def _run(self, k: int, delta: torch.Tensor, event):
        p, opts = self.parts, self.parts.opts
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()
        with ctx:
            if event is not None:
                self.stream.wait_event(event)
            sent = 0
            if p.groups.is_leader:
                dist.all_reduce(self.flag, group=self.leaders_group)
                if self.stream is not None:
                    self.stream.synchronize()
                ready = time.perf_counter()
                average, sent = self.crosses[k].average(delta, p.divisor)
            else:
                ready = time.perf_counter()
                average = delta
            if p.me.gpus > 1:  # staged through the device when the outer state is on the CPU
                staged = average if average.device == p.device else average.to(p.device)
                dist.broadcast(staged, src=p.groups.leader_rank, group=self.node_group)
                if staged is not average:
                    average.copy_(staged)
            if self.stream is not None:
                self.stream.synchronize()
            if opts.emulate:  # the plan's comm_s is one fragment sync
                remaining = ready + p.plan.comm_s * opts.time_scale - time.perf_counter()
                if remaining > 0:
                    time.sleep(remaining)
            return average, sent, ready, time.perf_counter()

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def background_sync(parts: NodeParts, fragmented: FragmentedOuter, fragments: int) -> BackgroundSync:
    """The communication thread and its own process groups (created by every process in the
    same order), with, on leaders, one cross-node average per fragment."""
    plan, groups = parts.plan, parts.groups
    ranked = groups.ranked  # the run's nodes (a continue run's current members), ranks in their order
    n = len(ranked.nodes)
    timeout = timedelta(seconds=parts.opts.collective_timeout_s())  # new_group's own default is 30 minutes
    node_groups = [dist.new_group(list(ranked.ranks(i)), timeout=timeout) for i in range(n)]
    # outer_state cpu on GPUs: the WAN average runs through gloo from host memory (real/process/worker.py)
    leaders = dist.new_group([ranked.first_rank(i) for i in range(n)], timeout=timeout,
                             backend="gloo" if parts.outer_device != parts.device else None)
    crosses = None
    if groups.is_leader:
        links = [nd.link_gbps for nd in ranked.nodes]
        crosses = [CrossNodeSync(leaders, n, groups.position, fragmented.numel(k), plan.payload_dtype,
                                 plan.collective, links) for k in range(fragments)]
    return BackgroundSync(parts, crosses, leaders if groups.is_leader else None, node_groups[groups.position])


class StreamingRound(Round):
    """A node's rounds under Streaming DiLoCo (the module doc)."""

    @classmethod
    def for_node(cls, parts: NodeParts, streaming: StreamingSpec, rounds: int) -> StreamingRound:
        return cls(parts, streaming)

    def __init__(self, parts: NodeParts, spec: StreamingSpec):
        self.parts, self.spec = parts, spec
        names = [name for name, _ in parts.model.named_parameters()]
        self.fragmented = FragmentedOuter(parts.outer, fragment_layout(names, spec.fragments, spec.fragment_pattern))
        self.schedule = spec.schedule(parts.me.local_steps)
        self.background = background_sync(parts, self.fragmented, spec.fragments)
        self.rows: list[dict] = []  # the leader's per-fragment rows (syncs.csv)

    def _sync(self, k: int, flight: InFlight, origin: Origin) -> tuple[dict, float]:
        """Wait for fragment k's average and apply it: (the syncs.csv row, the resume time)."""
        p, d = self.parts, self.parts.diloco
        merge = time.perf_counter()
        average, sent, start, end = run_collective(flight.future.result)
        waited = time.perf_counter()
        self.fragmented.apply(k, average, d.outer_lr, d.outer_momentum, self.spec.fragment_alpha)
        p.groups.sync_device()
        resume = time.perf_counter()
        wait = waited - merge
        idle = min(wait, max(start - merge, 0.0))
        at = origin.at
        row = {"fragment": k, "compute_start_s": at(flight.compute_start), "sync_point_s": at(flight.sync_point),
               "start_s": at(start), "end_s": at(end), "merge_point_s": at(merge), "idle_s": idle,
               "exposed_s": wait - idle, "outer_s": flight.prepare_s + resume - waited, "bytes_sent": sent}
        return row, resume

    def run(self, r: int, origin: Origin, bar=None) -> dict:
        """Round r: the inner steps, fragment k's pseudo-gradient handed to the communication
        thread after its prepare step, its average applied after its merge step."""
        p = self.parts
        prepare_at = {prep: k for k, (prep, _) in enumerate(self.schedule)}
        sync_at = {s: k for k, (_, s) in enumerate(self.schedule)}
        peak_memory_reset(p.device)
        round_start = time.perf_counter()
        clock = RoundClock(deadline=round_start)
        self.progress = Progress(round_start, clock)
        rows, resume, flight = [], round_start, None

        def after_step(step: int) -> None:
            nonlocal resume, flight
            if step in prepare_at:
                k = prepare_at[step]
                p.groups.sync_device()
                begin = time.perf_counter()
                delta = (self.fragmented.pseudo_gradient(k, p.coef) if p.groups.is_leader
                         else self.fragmented.buffer(k))
                future = self.background.start(k, delta)
                handed = time.perf_counter()
                flight = InFlight(k, future, resume, begin, handed - begin)
            if step in sync_at:
                row, resume = self._sync(sync_at[step], flight, origin)
                rows.append({"strategy": p.plan.strategy, "node": p.me.node, "round": r, **row})
                flight = None

        loss_sum = p.steps.run(clock, node_grad_sync(p), bar, after_step)
        p.groups.sync_device()
        end = self.progress.compute_end = time.perf_counter()
        if p.groups.is_leader:
            self.rows.extend(rows)
        idle = sum(row["idle_s"] for row in rows)
        comm = sum(row["exposed_s"] + row["outer_s"] for row in rows)
        return round_row(p, r, origin, loss_sum, clock, compute_s=end - round_start - idle - comm, idle_s=idle,
                         comm_s=comm, start=round_start, end=end, bytes_sent=sum(row["bytes_sent"] for row in rows))

    # --- checkpoints: the model's own weights (they differ from θ_g) and the fragment rows ---
    def state_dict(self) -> dict:
        return {"model_flat": self.fragmented.model_flat(), "rows": [dict(row) for row in self.rows]}

    def load_state_dict(self, state: dict) -> None:
        self.fragmented.load_model_flat(state["model_flat"])
        self.rows = [dict(row) for row in state["rows"]] if self.parts.groups.is_leader else []

    def close(self) -> None:
        self.background.close()
