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
from formats.rounds import RoundKind
from real.core.config import RunSpec
from real.core.options import ExecOptions, run_kind
from real.rounds.rounds import NodeParts, Round


def _in_parts(path: str, doc: str, settable: bool = False) -> property:
    """A NodeState property reading (and, settable, setting) what its parts hold at `path` ("groups.me"):
    the worker rebuilds the parts at each bind, so the state holds none of them itself."""
    *owners, name = path.split(".")

    def owner(state):
        obj = state.parts
        for attr in owners:
            obj = getattr(obj, attr)
        return obj

    setter = (lambda self, value: setattr(owner(self), name, value)) if settable else None
    return property(lambda self: getattr(owner(self), name), setter, doc=doc)


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
    groups = _in_parts("groups", "The process's groups (real/core/groups.py).")
    index = _in_parts("groups.index", "The node's index in the plan.")
    me = _in_parts("groups.me", "The node's row of the plan (NodePlan).")
    is_leader = _in_parts("groups.is_leader", "Whether this process is its node's leader.")
    members = _in_parts("members", "The plan indices of the nodes in the run-wide group now.")
    batch = _in_parts("groups.me.batch_size", "The node's batch, per device.")
    model = _in_parts("model", "The node's model (torch.nn.Module).")
    layout = _in_parts("layout", "The node's sharding (real/core/sharding.py ShardLayout), or None.")
    outer = _in_parts("outer", "θ_g and the outer momentum (real/core/diloco.py OuterState).")
    optimizer = _in_parts("steps.optimizer", "The inner optimizer.")
    scaler = _in_parts("steps.scaler", "The AMP grad scaler, or None.")

    @property
    def kind(self) -> RoundKind:
        """The kind of round the node runs (real/core/options.py run_kind: the plan's, in fragments where the
        executor runs its streaming loop); what differs by kind asks it (formats/rounds.py)."""
        return run_kind(self.plan, self.opts)

    # The inner-step loop's position, which checkpoints save and restore.
    inner_step = _in_parts("steps.inner_step", "Inner steps done in the run (the learning-rate schedule's position).",
                           settable=True)
    data_position = _in_parts("steps.data_position", "Samples of the node's shard consumed (all its devices).",
                              settable=True)

    # --- the round's own state: in the bound round, or held between a continue run's epochs ---
    def round_state(self) -> dict | None:
        """The state the node's round keeps across rounds (Round.state_dict): the bound round's, else the
        one held for the next bind (None before any)."""
        if self.round is not None:
            return self.round.state_dict()
        return self.held_round[1] if self.held_round is not None else None

    def take_round_state(self, held: dict) -> None:
        """Give the round back a round_state(): to the bound round, else held for the next bind's round
        (real/process/worker.py Node.bind), the progress held with it kept."""
        if self.round is not None:
            self.round.load_state_dict(held)
        else:
            self.held_round = (self.held_round[0] if self.held_round is not None else None, held)

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
            # format 4 holds a "streaming" entry in every set (None but a streaming round's), and the
            # round's own state under its kind's key (formats/rounds.py state_key: streaming, async, quorum)
            "streaming": None,
            **({key: self.round_state()} if (key := self.kind.state_key) is not None else {}),
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
        if (key := self.kind.state_key) is not None:  # a streaming round's model weights, a cut's last pull
            self.take_round_state(state[key])
        if self.kind.checkpoints == "cut" and self.round.server is not None:  # node 0: the server as the cut had it
            self.round.server.load_state_dict(state["server"])
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
