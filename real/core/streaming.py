"""Streaming DiLoCo (arXiv 2501.18512) as torchft's `DiLoCo` runs it: fragments, delay, merge.

The model's parameters are cut into P fragments (`fragment_layout`): the transformer layers
in P groups, `sequential` (contiguous blocks, as a pipeline split) or `strided` (layer l in
fragment l mod P); what comes before the first layer (the embedding) joins fragment 0 and
what comes after the last (final norm, output head) joins fragment P−1. Each round of H
inner steps syncs every fragment once, one at a time, in order: fragment k's sync point is
after s_k = ⌊(k+1)·H/P⌋ inner steps of the round (torchft: one fragment every H/P steps,
fragment = sync count mod P). τ = sync_delay_steps steps before it, at s_k − τ, the node
forms the fragment's pseudo-gradient Δ = θ_g − θ_local and starts its cross-node average in
the background; inner steps continue. At s_k it waits for the average, applies the outer
step (Nesterov SGD) to the fragment's slice of θ_g and of the momentum (so each fragment has
its own outer optimizer state), and sets the fragment's weights to
    θ = (1 − α)·θ_g + α·θ_local       (α = fragment_alpha; torch.lerp(θ_g, θ_local, α))
where θ_local is the weights at s_k, τ steps past the pseudo-gradient. This is exactly
torchft 0.2.0's `_StreamingDiLoCoFragment.prepare_sync` / `perform_sync`: α = 0 drops the
fragment's τ local steps, α = 1 keeps the local weights. P = 1, τ = 0, α = 0 is classic DiLoCo,
bit for bit (tests/test_streaming.py). Since τ < ⌊H/P⌋, at most one fragment is in flight, and
none at a round's end: checkpoints at round ends hold no in-flight state, only the model's
own weights beside θ_g (they differ from θ_g for fragments synced earlier in the round, or
when α > 0).

Timing: syncs.csv, one row per node and fragment sync, the simulator's columns (docs/DESIGN.md)
on the node leader's clock plus bytes_sent:
- compute_start_s: the start of the inner steps before the sync (the round's start, or the
  previous fragment's resume);
- sync_point_s: the node reached the fragment's sync point (then forms its pseudo-gradient and
  hands it to the communication thread);
- start_s, end_s: the average itself, from the moment every node had started it (a
  one-element all-reduce of the leaders marks it) to its end (broadcast in the node included);
- merge_point_s: the node reached the fragment's merge point and began to wait;
- idle_s, exposed_s: that wait, split as the simulator splits it (formats/timeline.py): idle
  until the average started (the wait for slower nodes), exposed while it ran;
- outer_s: the main thread's own sync work (pseudo-gradient, outer step, merge).
The round's trace row (trace.csv) keeps docs/DESIGN.md's accounting: idle_s = Σ idle_s,
comm_s = Σ (exposed_s + outer_s), and compute_s the rest of the round, hidden comm included.
Under --emulate each fragment's average is padded to the plan's comm_s (one fragment sync).

This module holds the settings (StreamingSpec), the fragments (fragment_layout,
FragmentedOuter) and syncs.csv (write_syncs); the round that runs them, with its
communication thread, is real/rounds/round_streaming.py.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from formats.plan import FRAGMENT_PATTERNS, fragment_problem, merge_steps
from formats.rounds import runs_in_fragments
from formats.timeline import SYNC_COLUMNS as SIM_SYNC_COLUMNS
from real.core.diloco import OuterState

SYNC_COLUMNS = SIM_SYNC_COLUMNS + ["bytes_sent"]  # what a real run adds to the simulator's
SYNC_NUMERIC = SYNC_COLUMNS[2:]
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class StreamingSpec:
    """P, τ, α and the layout; the defaults are classic DiLoCo."""

    fragments: int = 1
    sync_delay_steps: int = 0
    fragment_alpha: float = 0.0
    fragment_pattern: str = "sequential"

    def __post_init__(self) -> None:
        p, tau, alpha = self.fragments, self.sync_delay_steps, self.fragment_alpha
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ValueError(f"fragments: expected an integer >= 1, got {p!r}")
        if isinstance(tau, bool) or not isinstance(tau, int) or tau < 0:
            raise ValueError(f"sync_delay_steps: expected an integer >= 0, got {tau!r}")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
            raise ValueError(f"fragment_alpha: expected a number in [0, 1], got {alpha!r}")
        if self.fragment_pattern not in FRAGMENT_PATTERNS:
            raise ValueError(f"fragment_pattern: expected one of {', '.join(FRAGMENT_PATTERNS)}, "
                             f"got {self.fragment_pattern!r}")
        object.__setattr__(self, "fragment_alpha", float(alpha))

    @classmethod
    def from_plan(cls, plan) -> StreamingSpec:
        """The plan's streaming settings; a plan without them (or with empty ones) is classic."""
        values = {k: getattr(plan, k, None) for k in ("fragments", "sync_delay_steps", "fragment_alpha",
                                                      "fragment_pattern")}
        return cls(**{k: v for k, v in values.items() if v is not None})

    @property
    def classic(self) -> bool:
        """Whether these settings are classic DiLoCo's (P = 1, τ = 0, α = 0: formats/rounds.py runs_in_fragments)."""
        return not runs_in_fragments(self)

    def check(self, nodes, layers: int) -> None:
        """Every node can hold the schedule (formats.plan.fragment_problem: P ≤ H_i and
        τ < ⌊H_i/P⌋, one fragment in flight), and every fragment holds one of the model's layers."""
        if self.fragments > layers:
            raise ValueError(f"fragments: expected at most the model's {layers} layers, got {self.fragments}")
        problem = fragment_problem([n.local_steps for n in nodes], self.fragments, self.sync_delay_steps)
        if problem is not None:
            key, i, expected = problem
            raise ValueError(f"{key}: node {nodes[i].node} (local_steps {nodes[i].local_steps}): {expected}")

    def schedule(self, local_steps: int) -> list[tuple[int, int]]:
        """(prepare, merge) per fragment: inner steps of the round done when the fragment's average
        starts and when it is applied (formats.plan.merge_steps)."""
        return [(m - self.sync_delay_steps, m) for m in merge_steps(local_steps, self.fragments)]

    def config(self) -> dict:
        """The settings a resumed run must share (real/options.run_config)."""
        return {f"streaming.{k}": v for k, v in asdict(self).items()}


def fragment_layout(names: Sequence[str], fragments: int, pattern: str) -> list[list[int]]:
    """Indices into `names` (parameters in model order) of each fragment; see the module doc."""
    layers = [int(m.group(1)) if (m := _LAYER.search(n)) else None for n in names]
    ids = sorted({layer for layer in layers if layer is not None})
    if len(ids) < fragments:
        raise ValueError(f"fragments: expected at most the model's {len(ids)} layers, got {fragments}")
    rank = {layer: i for i, layer in enumerate(ids)}
    if pattern == "sequential":
        of_layer = {layer: rank[layer] * fragments // len(ids) for layer in ids}
    elif pattern == "strided":
        of_layer = {layer: rank[layer] % fragments for layer in ids}
    else:
        raise ValueError(f"fragment_pattern: expected one of {', '.join(FRAGMENT_PATTERNS)}, got {pattern!r}")
    first = next(i for i, layer in enumerate(layers) if layer is not None)
    out: list[list[int]] = [[] for _ in range(fragments)]
    for i, layer in enumerate(layers):
        out[of_layer[layer] if layer is not None else (0 if i < first else fragments - 1)].append(i)
    return out


class FragmentedOuter:
    """Per-fragment views of an OuterState: pseudo-gradient, outer step and merge of one fragment.

    A fragment is a set of parameters, i.e. a few ranges of the flat θ_g / momentum / delta
    buffers (adjacent parameters merged), so the checkpointed OuterState holds every fragment's
    outer state and nothing else is needed for it."""

    def __init__(self, outer: OuterState, layout: Sequence[Sequence[int]]):
        self.outer = outer
        offsets = [0]
        for size in outer.sizes:
            offsets.append(offsets[-1] + size)
        self.members = [list(idx) for idx in layout]
        self.ranges: list[list[tuple[int, int]]] = []
        for idx in self.members:
            spans: list[tuple[int, int]] = []
            for i in sorted(idx):
                if spans and spans[-1][1] == offsets[i]:
                    spans[-1] = (spans[-1][0], offsets[i + 1])
                else:
                    spans.append((offsets[i], offsets[i + 1]))
            self.ranges.append(spans)
        self.offsets = offsets

    def numel(self, k: int) -> int:
        return sum(b - a for a, b in self.ranges[k])

    def _gather(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        spans = self.ranges[k]
        if len(spans) == 1:
            return flat[spans[0][0]:spans[0][1]]  # a view: no copy
        return torch.cat([flat[a:b] for a, b in spans])

    @torch.no_grad()
    def pseudo_gradient(self, k: int, coef: float) -> torch.Tensor:
        """c·(θ_g − θ_local) of fragment k, contiguous (a view of the delta buffer when it can be)."""
        o = self.outer
        for i in self.members[k]:
            o.delta[self.offsets[i]:self.offsets[i + 1]].copy_(o.params[i].reshape(-1))
        for a, b in self.ranges[k]:
            torch.sub(o.global_flat[a:b], o.delta[a:b], out=o.delta[a:b])
            if coef != 1.0:
                o.delta[a:b].mul_(coef)
        return self._gather(o.delta, k)

    def buffer(self, k: int) -> torch.Tensor:
        """A contiguous fragment-sized buffer to receive an average into (processes that do not send)."""
        return self._gather(self.outer.delta, k)

    @torch.no_grad()
    def apply(self, k: int, average: torch.Tensor, lr: float, momentum: float, alpha: float) -> None:
        """Outer step on fragment k's θ_g and momentum with the averaged pseudo-gradient (overwritten),
        then the fragment's weights ← lerp(θ_g, θ_local, α)."""
        o = self.outer
        for (a, b), grad in zip(self.ranges[k], torch.split(average, [b - a for a, b in self.ranges[k]])):
            if momentum > 0:  # OuterState.outer_step's formula, on the fragment's slices
                o.momentum[a:b].mul_(momentum).add_(grad)
                grad.add_(o.momentum[a:b], alpha=momentum)
            o.global_flat[a:b].add_(grad, alpha=-lr)
        for i in self.members[k]:
            p, g = o.params[i], o.global_flat[self.offsets[i]:self.offsets[i + 1]].view_as(o.params[i])
            if alpha == 0.0:
                p.copy_(g)  # lerp with weight 0 would turn a −0.0 into +0.0: classic bits need a copy
            else:
                p.copy_(torch.lerp(g.to(p.device), p.detach(), alpha))

    def model_flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.outer.params]).cpu()

    @torch.no_grad()
    def load_model_flat(self, flat: torch.Tensor) -> None:
        if flat.numel() != self.offsets[-1]:
            raise ValueError(f"checkpoint model_flat has {flat.numel()} values; the model has {self.offsets[-1]}")
        for p, chunk in zip(self.outer.params, torch.split(flat, self.outer.sizes)):
            p.copy_(chunk.view_as(p))


def threads_for_comm() -> None:
    """The communication thread's torch ops (encode, decode, sums) on one core: they are small,
    and the inner steps keep the process's other threads."""
    torch.set_num_threads(1)


def write_syncs(plan, tables: list[list[list[float]]], path) -> None:
    """syncs.csv from every leader's rows (SYNC_NUMERIC values, plan order), whole or not at all."""
    rows = []
    for node, table in zip(plan.nodes, tables):
        for values in table:
            row = {"strategy": plan.strategy, "node": node.node, **dict(zip(SYNC_NUMERIC, values))}
            for c in ("round", "fragment", "bytes_sent"):
                row[c] = int(row[c])
            rows.append(row)
    order = {node.node: i for i, node in enumerate(plan.nodes)}
    frame = pd.DataFrame(rows, columns=SYNC_COLUMNS)
    frame = frame.sort_values(["round", "fragment", "node"],
                              key=lambda col: col.map(order) if col.name == "node" else col).reset_index(drop=True)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    frame.to_csv(tmp, index=False)
    os.replace(tmp, path)
