"""The process groups of a run and the collectives a node's processes take part in.

A node with G devices runs G processes, data parallel inside the node. Ranks go to nodes in
plan order, G_i consecutive ranks each (formats.plan.Plan.first_rank); the first is the
node's leader. Two kinds of group: each node's own (its G processes: the per-step gradient
all-reduce, the broadcast of the cross-node average, the node's mean loss) and the leaders'
(one process per node: the cross-node average, real/core/sync.py, and the trace gathering). Every
process creates every group, in the same order, as torch.distributed requires.

Under --on-node-loss continue the run-wide group is the current membership epoch's
(real/membership/members.py): `members` names the plan's nodes in it, ranks go to those nodes in plan
order, and `position` is this node's place among them (its rank in the leaders' group); `index`
is always the node's place in the plan (its data shard, its checkpoint folder, its trace row).
`SoloGroups` stands in before a continue process has entered its first epoch.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from formats.plan import Plan
from real.core.options import run_collective


class Groups:
    """This process's place in the run: its node, its node's group and the leaders' group."""

    def __init__(self, plan: Plan, rank: int, world: int, device: torch.device, timeout_s: float,
                 leaders_backend: str | None = None, members: Sequence[int] | None = None):
        """leaders_backend: "gloo" when the outer state lives in host memory on GPUs (the WAN
        average then runs through gloo, as OpenDiLoCo), else the default group's backend.
        members: the plan indices of the nodes in the run-wide group (all of them unless given)."""
        self.plan, self.rank, self.world, self.device = plan, rank, world, device
        self.members = tuple(range(len(plan.nodes)) if members is None else members)
        # the ranks of the run-wide group: the members' processes, in plan order
        ranked = self.ranked = plan if members is None else replace(plan, nodes=[plan.nodes[i] for i in self.members])
        self.position = ranked.node_of_rank(rank)
        self.index = self.members[self.position]
        self.me = plan.nodes[self.index]
        self.leader_rank = ranked.first_rank(self.position)
        self.local = rank - self.leader_rank
        self.is_leader = self.local == 0
        # Each with --timeout-s: new_group's own default is 30 minutes, not the default group's.
        timeout = timedelta(seconds=timeout_s)
        node_groups = [dist.new_group(list(ranked.ranks(i)), timeout=timeout) for i in range(len(ranked.nodes))]
        self.node = node_groups[self.position]
        leaders = dist.new_group([ranked.first_rank(i) for i in range(len(ranked.nodes))], timeout=timeout,
                                 backend=leaders_backend)
        self.leaders = leaders if self.is_leader else None
        self._flag = torch.zeros(1, device=device)

    def sync_device(self) -> None:
        """Wait for the device's queued work (CUDA), so that clocks read after it are true."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        """Every process of the run: a one-element all-reduce (the wait for the slowest node)."""
        run_collective(dist.all_reduce, self._flag)
        self.sync_device()

    def node_sum(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` in place over the node's devices (nothing to do for one device)."""
        if self.me.gpus > 1:
            run_collective(dist.all_reduce, tensor, group=self.node)

    def node_mean(self, tensor: torch.Tensor) -> None:
        """Average `tensor` in place over the node's devices."""
        if self.me.gpus > 1:
            run_collective(dist.all_reduce, tensor, group=self.node)
            tensor /= self.me.gpus

    def broadcast_in_node(self, tensor: torch.Tensor) -> None:
        """The leader's `tensor` to the node's other devices (staged through the device when it
        lives elsewhere, the outer state on the CPU with an nccl node group)."""
        if self.me.gpus == 1:
            return
        staged = tensor if tensor.device == self.device else tensor.to(self.device)
        run_collective(dist.broadcast, staged, src=self.leader_rank, group=self.node)
        if staged is not tensor:
            tensor.copy_(staged)

    def node_max(self, value: int) -> int:
        """The largest `value` over the node's devices."""
        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        if self.me.gpus > 1:
            run_collective(dist.all_reduce, tensor, op=dist.ReduceOp.MAX, group=self.node)
        return int(tensor.item())

    def average_gradients(self, model: torch.nn.Module) -> None:
        """DDP's gradient average over the node's devices, as one flat all-reduce."""
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        run_collective(dist.all_reduce, flat, group=self.node)
        flat.div_(self.me.gpus)
        for g, chunk in zip(grads, torch.split(flat, [g.numel() for g in grads])):
            g.copy_(chunk.view_as(g))

    def all_gather_ints(self, values: list[int]) -> list[list[int]]:
        """Every process's `values` (the same length everywhere), in rank order."""
        mine = torch.tensor(values, dtype=torch.int64, device=self.device)  # nccl needs device tensors
        everyone = [torch.empty_like(mine) for _ in range(self.world)]
        run_collective(dist.all_gather, everyone, mine)
        return [t.cpu().tolist() for t in everyone]

    def max_float(self, value: float) -> float:
        """The largest `value` over every process."""
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        run_collective(dist.all_reduce, tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())


class SoloGroups:
    """Groups for a process before it is in a run-wide group (a continue run's process until it enters
    its first epoch, and between epochs: real/membership/members.py): what building its parts asks of
    it. It holds no group, so nothing is averaged over the node's processes meanwhile."""

    def __init__(self, plan: Plan, rank: int):
        self.plan, self.rank, self.world, self.device = plan, rank, plan.world_size, torch.device("cpu")
        self.index = plan.node_of_rank(rank)
        self.position, self.members = self.index, tuple(range(len(plan.nodes)))
        self.me = plan.nodes[self.index]
        self.leader_rank = plan.first_rank(self.index)
        self.local = rank - self.leader_rank
        self.is_leader = self.local == 0
        self.node = self.leaders = None

    def sync_device(self) -> None:
        pass

    def node_mean(self, tensor: torch.Tensor) -> None:
        pass

    def node_sum(self, tensor: torch.Tensor) -> None:
        pass

    def node_max(self, value: int) -> int:
        return value
