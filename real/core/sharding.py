"""Sharding inside a node: FSDP2 over the node's G processes, activation checkpointing, and
DiLoCo's pseudo-gradient, cross-node average and outer step per shard.

What each plan value runs (a node of G > 1 devices; with G = 1 there is nothing to divide
and the node runs unsharded whatever the plan says):
- sharding "none": G full replicas, gradients all-reduced every step (real/rounds/rounds.py).
- "fsdp": `torch.distributed.fsdp.fully_shard` (FSDP2) on every decoder layer and on the
  root, over a DeviceMesh of the node's process group: weights, gradients and AdamW moments
  are DTensors sharded on dim 0 (1/G each); a layer's weights are all-gathered before its
  forward and freed after it (reshard_after_forward=True), gathered again for its backward,
  and gradients are reduce-scattered (averaged over the node) in backward.
- "zero2": the same FSDP2 with reshard_after_forward=False: a layer's gathered weights stay
  from its forward to its backward (one all-gather per step instead of two), gradients and
  optimizer state sharded: ZeRO-2's memory and traffic, except that FSDP2 frees the gathered
  weights after backward, so between steps only the shard is held.
- "zero1" runs exactly as "zero2". ZeRO-1 proper (optimizer state sharded, gradients whole)
  is torch's ZeroRedundancyOptimizer, whose state consolidation pickles tensors, which the
  executor never sends; zero2 holds strictly less than ZeRO-1 (gradients sharded too) for
  the same bytes on the node's link (reduce-scatter + all-gather = one all-reduce), so a
  plan's zero1 memory is an upper bound of what runs.
- activation_checkpointing "full": transformers' activation checkpointing on every decoder
  layer (torch.utils.checkpoint, use_reentrant=False): activations inside a layer are
  recomputed in backward. Recomputation repeats the same kernels on the same inputs, so on
  CPU the weights are bitwise those without it (tests/test_real_sharding.py).
- fp16 (loss scaling): torch's ShardedGradScaler over the node's group, so the processes agree
  on whether any shard's gradient overflowed (node_scaler).
- sync = gradients (sync-ddp) and Streaming DiLoCo fragments work on whole replicas: a sharded
  node with either is refused at launch (real/process/launch.py).

The outer step per shard. Every process keeps θ_g and the Nesterov momentum only for its own
shard (OuterState over the local shards, on the CPU or the device per the plan's
outer_state), forms Δ = c·(θ_g − θ_local) on it, and applies the outer step to it; the
model's shards are written in place. The cross-node average stays the leaders' (real/core/sync.py,
any payload dtype and collective): the node's processes gather their Δ shards to the leader
parameter by parameter into the canonical flat layout (the parameters' full tensors
concatenated, exactly an unsharded node's), the leader averages with the other nodes, and
scatters each process its shard back. Chosen over G parallel cross-node groups (one per shard
index) because geodt's nodes are heterogeneous: a sharded node of 8 devices must average
with an unsharded node of 1, and shard j of one node is no shard of the other. Bytes on the
node's uplink are those of an unsharded node (bytes_sent unchanged); the intra-node gather
and scatter move (G−1)/G·P values each over the node's link; the leader holds one transient
full-size fp32 Δ (on the CPU when outer_state is cpu) besides its shard.

Checkpoints hold the canonical (unsharded) form: θ_g, momentum and the inner AdamW moments
gathered to full tensors; on resume each process slices its own shard (no communication).
"""
from __future__ import annotations

import resource
from dataclasses import dataclass

import torch
import torch.distributed as dist

from formats.plan import NodePlan, Plan
from train.step import compile_blocks


@dataclass(frozen=True)
class ShardingSpec:
    """How one node trains: its sharding, its recomputation, where its outer state lives (the
    plan's resolved columns; formats/plan.py validates them)."""

    sharding: str = "none"
    activation_checkpointing: str = "none"
    outer_state: str = "cpu"

    @classmethod
    def of(cls, plan: Plan, node: NodePlan) -> ShardingSpec:
        """The spec of a plan's node (empty cells: none, none, cpu, as Plan.resolved())."""
        return cls(node.sharding or "none", node.activation_checkpointing or "none", plan.outer_state or "cpu")


def prepare_model(model: torch.nn.Module, spec: ShardingSpec, node_group, gpus: int,
                  device: torch.device, compiled: bool = False) -> ShardLayout | None:
    """Apply recomputation, the compiled blocks and sharding to a freshly built model, in
    torchtitan's order (same seed on every process, so every process starts from the same full
    weights); the shard layout, or None unsharded."""
    if spec.activation_checkpointing == "full":
        model.activation_checkpointing_enable({"use_reentrant": False})
    if compiled:
        compile_blocks(model)
    if spec.sharding == "none" or gpus == 1:
        return None
    # deferred: FSDP2 and DTensor (torch.distributed, newer than torch>=2.1) only on a sharded node
    from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    full_shapes = [p.shape for p in model.parameters()]
    mesh = DeviceMesh.from_group(node_group, device.type)
    reshard = spec.sharding == "fsdp"
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    # The root's weights (embedding, final norm, LM head) are needed again first in backward.
    fully_shard(model, mesh=mesh, reshard_after_forward=None if reshard else False)
    return ShardLayout(list(model.parameters()), full_shapes, node_group, gpus)


def node_scaler(scaler, layout: ShardLayout | None, device: torch.device):
    """fp16's loss scaler for the node: a sharded node's processes each see only their shards'
    gradients, so whether any is inf/nan is agreed over the node (ShardedGradScaler all-reduces
    it) and every process skips or takes the same steps with the same scale."""
    if scaler is None or layout is None:
        return scaler
    # deferred: FSDP2 and DTensor (torch.distributed, newer than torch>=2.1) only on a sharded node
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler  # noqa: PLC0415

    return ShardedGradScaler(device.type, process_group=layout.group)


def _rows(dim0: int, gpus: int, j: int) -> tuple[int, int]:
    """Rows of a dim-0 sharded tensor that process j holds (torch.chunk's split, as FSDP2)."""
    chunk = -(-dim0 // gpus)
    return min(j * chunk, dim0), min((j + 1) * chunk, dim0)


class ShardLayout:
    """Where each process's shards sit in the canonical flat layout, and the node's gather
    (shards → leader's full vector) and scatter (full vector → shards), one parameter at a time
    so the transient on the device stays one parameter's size."""

    def __init__(self, params: list, full_shapes: list[torch.Size], group, gpus: int):
        self.params, self.group, self.gpus = params, group, gpus
        self.me = dist.get_rank(group)
        self.leader = dist.get_global_rank(group, 0)
        self.comm_device = params[0].to_local().device
        self.pieces = []  # per parameter: (full offset, row length, dim0, rows of every process)
        offset = 0
        for p, shape in zip(params, full_shapes):
            dim0 = shape[0] if len(shape) else 1
            row = shape.numel() // dim0 if dim0 else 0
            rows = [_rows(dim0, gpus, j) for j in range(gpus)]
            r0, r1 = rows[self.me]
            if p.to_local().numel() != (r1 - r0) * row:
                raise RuntimeError(f"FSDP2 shard of a {tuple(shape)} weight holds {p.to_local().numel()} values "
                                   f"on process {self.me}; expected rows {r0}..{r1}")
            self.pieces.append((offset, row, dim0, rows))
            offset += shape.numel()
        self.full_numel = offset
        self.local_numel = sum((rows[self.me][1] - rows[self.me][0]) * row for _, row, _, rows in self.pieces)

    def local_tensors(self) -> list[torch.Tensor]:
        """The processes's shards as plain tensors aliasing the model's storage."""
        return [p.to_local() for p in self.params]

    def _local_chunks(self, local_flat: torch.Tensor):
        start = 0
        for offset, row, dim0, rows in self.pieces:
            r0, r1 = rows[self.me]
            yield offset, row, dim0, rows, local_flat[start:start + (r1 - r0) * row]
            start += (r1 - r0) * row

    @torch.no_grad()
    def gather(self, local_flat: torch.Tensor) -> torch.Tensor | None:
        """Every process's shards into the canonical flat vector on the leader (on local_flat's
        device); None on the other processes. A collective of the node."""
        out = torch.empty(self.full_numel, dtype=local_flat.dtype, device=local_flat.device) \
            if self.me == 0 else None
        for offset, row, dim0, rows, mine in self._local_chunks(local_flat):
            padded = -(-dim0 // self.gpus) * row
            send = torch.zeros(padded, dtype=local_flat.dtype, device=self.comm_device)
            send[:mine.numel()] = mine
            bufs = [torch.empty_like(send) for _ in range(self.gpus)] if self.me == 0 else None
            dist.gather(send, bufs, group_dst=0, group=self.group)
            if self.me == 0:
                for (r0, r1), buf in zip(rows, bufs):
                    out[offset + r0 * row:offset + r1 * row] = buf[:(r1 - r0) * row]
        return out

    @torch.no_grad()
    def scatter(self, full: torch.Tensor | None, local_flat: torch.Tensor) -> None:
        """The leader's canonical flat vector `full` cut into every process's `local_flat`."""
        for offset, row, dim0, rows, mine in self._local_chunks(local_flat):
            padded = -(-dim0 // self.gpus) * row
            recv = torch.empty(padded, dtype=local_flat.dtype, device=self.comm_device)
            bufs = None
            if self.me == 0:
                bufs = [torch.zeros_like(recv) for _ in range(self.gpus)]
                for (r0, r1), buf in zip(rows, bufs):
                    buf[:(r1 - r0) * row] = full[offset + r0 * row:offset + r1 * row]
            dist.scatter(recv, bufs, group_src=0, group=self.group)
            mine.copy_(recv[:mine.numel()])

    def local_slice(self, full: torch.Tensor) -> torch.Tensor:
        """This process's shards of a canonical flat vector (no communication)."""
        parts = []
        for offset, row, _, rows in self.pieces:
            r0, r1 = rows[self.me]
            parts.append(full[offset + r0 * row:offset + r1 * row])
        return torch.cat(parts)

    # --- checkpoints and final weights -------------------------------------------------
    def full_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """optimizer.state_dict() with every sharded tensor gathered whole, on the CPU (a
        collective of the node: every process must call it)."""
        # deferred: FSDP2 and DTensor (torch.distributed, newer than torch>=2.1) only on a sharded node
        from torch.distributed.tensor import DTensor  # noqa: PLC0415

        state = optimizer.state_dict()  # its per-parameter dicts are the optimizer's own: copy
        state["state"] = {index: {key: value.full_tensor().cpu() if isinstance(value, DTensor) else value
                                  for key, value in values.items()}
                          for index, values in state["state"].items()}
        return state

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load a canonical optimizer state, each full tensor cut to this process's shard."""
        # deferred: FSDP2 and DTensor (torch.distributed, newer than torch>=2.1) only on a sharded node
        from torch.distributed.tensor import DTensor, distribute_tensor  # noqa: PLC0415

        params = [p for group in optimizer.param_groups for p in group["params"]]

        def shard(param, value):
            if isinstance(param, DTensor) and torch.is_tensor(value) and value.dim() > 0 and value.shape == param.shape:
                return distribute_tensor(value.to(param.device), param.device_mesh, param.placements,
                                         src_data_rank=None)
            return value

        optimizer.load_state_dict({**state, "state": {
            index: {key: shard(params[int(index)], value) for key, value in values.items()}
            for index, values in state["state"].items()}})

    def full_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """{name: full CPU tensor} of the model (a collective of the node)."""
        return {name: p.full_tensor().detach().cpu() for name, p in model.named_parameters()}


@torch.no_grad()
def local_shard(value: torch.Tensor, like) -> torch.Tensor:
    """This process's shard of `value` as DTensor `like` lays it out: `value`'s own local tensor when it
    is a DTensor of the same node over an earlier mesh (the node's processes keep their places, so the
    shards match), else its rows of the whole tensor. No communication."""
    # deferred: FSDP2 and DTensor (torch.distributed, newer than torch>=2.1) only on a sharded node
    from torch.distributed.tensor import DTensor, distribute_tensor  # noqa: PLC0415

    if isinstance(value, DTensor):
        return value.to_local()
    return distribute_tensor(value.detach().to(like.device), like.device_mesh, like.placements,
                             src_data_rank=None).to_local()


def move_shards(params: list, old: list, optimizer: torch.optim.Optimizer, old_state: dict) -> None:
    """A sharded model built over a new mesh takes the state of the same model before it (`old`: its
    parameters, sharded over the node's earlier mesh or whole; `old_state`: its inner optimizer's
    state_dict): the weights, and the optimizer's per-parameter tensors as DTensors over the new mesh."""
    # deferred: FSDP2 and DTensor (torch.distributed, newer than torch>=2.1) only on a sharded node
    from torch.distributed.tensor import DTensor  # noqa: PLC0415

    with torch.no_grad():
        for new, value in zip(params, old):
            new.to_local().copy_(local_shard(value, new))
    ordered = [p for group in optimizer.param_groups for p in group["params"]]

    def move(param, value):
        if not (torch.is_tensor(value) and value.dim() > 0 and value.shape == param.shape):
            return value
        return DTensor.from_local(local_shard(value, param), param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())

    optimizer.load_state_dict({**old_state, "state": {
        index: {key: move(ordered[int(index)], value) for key, value in values.items()}
        for index, values in old_state["state"].items()}})


@torch.no_grad()
def sharded_average(layout: ShardLayout, delta_local: torch.Tensor, cross, divisor: float,
                    staging: torch.device) -> int:
    """The cross-node average of a sharded node's pseudo-gradient, in place in `delta_local`:
    gather to the leader (on `staging`), the leaders' average (real/core/sync.py), scatter back.
    Returns the bytes the leader sent (0 elsewhere). A collective of the node."""
    full = layout.gather(delta_local.to(staging))
    sent = 0
    if full is not None:
        average, sent = cross.average(full, divisor)
        full = average
    target = delta_local if delta_local.device == staging else torch.empty_like(delta_local, device=staging)
    layout.scatter(full, target)
    if target is not delta_local:
        delta_local.copy_(target)
    return sent


def peak_memory_reset(device: torch.device) -> None:
    """Start a new peak-memory window (see peak_memory_bytes)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: "5" resets the process's peak resident set size (VmHWM)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass  # then the peak is the process's lifetime peak (ru_maxrss)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process since peak_memory_reset: on CUDA the bytes torch allocated
    (torch.cuda.max_memory_allocated); on the CPU the peak resident set size (VmHWM, the whole
    process: interpreter and libraries included)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
