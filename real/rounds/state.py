"""A node process's state in one object: who it is in the run, the parts its rounds train, how far
the run got; what its checkpoints hold (`state_dict`, `load_state_dict`) and membership agrees on.

real/process/worker.py's `Node` owns one `NodeState` and hands it, never itself, to its checkpointer
(real/checkpoint/checkpoint.py `Checkpointer`) and to the membership policy (real/membership/members.py);
only the worker binds it to a process group (its `parts` and `round` change at each bind). As
torchtitan's trainer is Stateful: `state_dict()` is the node's part of a checkpoint (node.pt, and
global.pt's outer state; real/checkpoint/ckpt_set.py lays them on disk; the checkpointer adds the
format), and `load_state_dict()` takes one back. A sharded node's state_dict is gathered whole (a
collective of its processes), and its tensors may be the live ones: a checkpoint's snapshot copies.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from formats.plan import Plan
from real.core.config import RunSpec
from real.core.options import ExecOptions
from real.rounds.round_streaming import StreamingRound
from real.rounds.rounds import NodeParts, Round


@dataclass(eq=False)
class NodeState:
    """A node process's state (module doc). The process's place (`index`, `me`, `is_leader`) and the
    model's handles are read through `parts`, which the worker rebuilds at each bind."""

    rank: int
    plan: Plan
    spec: RunSpec
    opts: ExecOptions
    config: dict  # run_config: the settings a resumed run must share (real/core/options.py)
    device: torch.device
    parts: NodeParts
    round: Round | None = None  # the plan's kind of round; None between a continue run's epochs
    rounds_done: int = 0
    time_offset_s: float = 0.0  # where a resumed run's time axis continues from
    trace: list[dict] = field(default_factory=list)  # the leader's trace rows
    # between a continue run's epochs: the round's (progress, state), taken back at the next bind
    held_round: tuple | None = None

    # --- the process's place and the model's handles, as the parts hold them ---------------
    @property
    def groups(self):
        return self.parts.groups

    @property
    def index(self) -> int:
        return self.parts.groups.index

    @property
    def me(self):
        return self.parts.groups.me

    @property
    def is_leader(self) -> bool:
        return self.parts.groups.is_leader

    @property
    def members(self) -> tuple[int, ...]:
        """The plan indices of the nodes in the run-wide group now."""
        return self.parts.members

    @property
    def batch(self) -> int:
        return self.me.batch_size  # per device

    @property
    def model(self) -> torch.nn.Module:
        return self.parts.model

    @property
    def layout(self):
        return self.parts.layout

    @property
    def outer(self):
        return self.parts.outer

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.parts.steps.optimizer

    @property
    def scaler(self):
        return self.parts.steps.scaler

    @property
    def streaming(self) -> StreamingRound | None:
        """The round when it is Streaming DiLoCo's (its state is checkpointed), else None."""
        return self.round if isinstance(self.round, StreamingRound) else None

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

    # --- Stateful ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What the node's checkpoint holds, in the order its files hold it (real/checkpoint/ckpt_set.py:
        "outer" goes to global.pt, the rest to node.pt)."""
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
            # a cut's round ("async" or "quorum")
            **({self.plan.sync: self.round.state_dict()} if self.plan.round_kind.checkpoints == "cut" else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        """Take a `state_dict` back (checked by the checkpointer first: same plan and settings) into the
        model, the optimizers, the position, the RNG and the trace; the time axis continues after the
        trace's last round (its checkpoint's blocking part included)."""
        outer = state["outer"]
        if self.layout is not None:
            self.outer.load_state_dict({key: self.layout.local_slice(value) for key, value in outer.items()})
            self.layout.load_optimizer_state(self.optimizer, state["inner_optimizer"])
        else:
            self.outer.load_state_dict(outer)
            self.optimizer.load_state_dict(state["inner_optimizer"])
        self.outer.load_into_model()
        if self.plan.round_kind.checkpoints == "cut":  # its last pull; on node 0 the server as the cut recorded it
            self.round.load_state_dict(state[self.plan.sync])
            if self.round.server is not None:
                self.round.server.load_state_dict(state["server"])
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
        trace = [dict(row) for row in state["trace"]]
        self.trace = trace if self.is_leader else []
        self.time_offset_s = max((row["round_end_s"] + row["ckpt_block_s"] for row in trace), default=0.0)
