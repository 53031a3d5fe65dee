"""DiLoCo's arithmetic: the inner learning-rate schedule, averaging weights, the outer step.

A round: every node starts from the global weights θ_g, runs H_i inner AdamW steps to θ_i,
forms the pseudo-gradient Δ_i = θ_g − θ_i, and the nodes average Δ (all-reduce SUM, then
divide: gloo has no AVG). The average is a gradient for an outer SGD step with Nesterov
momentum on θ_g, which every node applies identically and copies into its model. Inner
optimizer state stays local.

Averaging (each node multiplies its Δ_i by c_i before the SUM; the sum is divided by D):
- uniform:    c_i = 1,            D = N                   (OpenDiLoCo)
- tokens:     c_i = tokens_i,     D = Σ tokens
- normalized: c_i = p_i / H_i,    D = 1 / Σ p_i H_i       with p_i = tokens_i / Σ tokens
  (FedNova: each Δ_i is divided by its own step count, and the average is rescaled by the
  weighted mean step count, so nodes that ran more steps do not dominate the direction.)
The global weights live in one flat fp32 buffer so the sync is a single all-reduce.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch

from formats.scenario import DilocoConfig


def inner_lr(step: int, spec: DilocoConfig, total_steps: int) -> float:
    """Learning rate of inner step `step` (0-based): linear warm-up, then cosine to min ratio."""
    if step < spec.warmup_steps:
        return spec.inner_lr * (step + 1) / spec.warmup_steps
    span = max(1, total_steps - spec.warmup_steps)
    progress = min(1.0, (step - spec.warmup_steps) / span)
    ratio = spec.cosine_min_lr_ratio + (1 - spec.cosine_min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return spec.inner_lr * ratio


def averaging_weights(mode: str, tokens: Sequence[float], local_steps: Sequence[float]) -> tuple[list[float], float]:
    """(c_i for every node, divisor D) for an averaging mode; see the module docstring."""
    n = len(tokens)
    if mode == "uniform":
        return [1.0] * n, float(n)
    total = float(sum(tokens))
    if total <= 0:
        raise ValueError("averaging by tokens needs a positive token count per round")
    if mode == "tokens":
        return [float(t) for t in tokens], total
    if mode == "normalized":
        p = [t / total for t in tokens]
        mean_steps = sum(pi * h for pi, h in zip(p, local_steps))
        return [pi / h for pi, h in zip(p, local_steps)], 1.0 / mean_steps
    raise ValueError(f"unknown averaging mode {mode!r}")


class OuterState:
    """Global weights θ_g (flat), the outer momentum buffer, and the pseudo-gradient buffer."""

    def __init__(self, params: Sequence[torch.Tensor], device: torch.device | None = None):
        """`params`: the model's weights (or a sharded node's local shards, real/core/sharding.py);
        `device`: where the state lives (default: the weights' device)."""
        self.params = list(params)
        self.sizes = [p.numel() for p in self.params]
        with torch.no_grad():
            self.global_flat = torch.cat([p.detach().reshape(-1).float() for p in self.params]).to(device)
        self.momentum = torch.zeros_like(self.global_flat)
        self.delta = torch.empty_like(self.global_flat)

    def _chunks(self, flat: torch.Tensor):
        return zip(self.params, torch.split(flat, self.sizes))

    @torch.no_grad()
    def pseudo_gradient(self, coef: float) -> torch.Tensor:
        """delta = c · (θ_g − θ_local), in place in the flat buffer."""
        for p, chunk in self._chunks(self.delta):
            chunk.copy_(p.reshape(-1))
        torch.sub(self.global_flat, self.delta, out=self.delta)
        if coef != 1.0:
            self.delta.mul_(coef)
        return self.delta

    @torch.no_grad()
    def outer_step(self, grad: torch.Tensor, lr: float, momentum: float) -> None:
        """SGD with Nesterov momentum (torch.optim.SGD's formula, dampening 0) on θ_g.

        `grad` is overwritten (it is the sync's scratch buffer)."""
        if momentum > 0:
            self.momentum.mul_(momentum).add_(grad)
            grad.add_(self.momentum, alpha=momentum)  # in place: the sync's buffer, 1 copy less
        self.global_flat.add_(grad, alpha=-lr)

    @torch.no_grad()
    def capture(self) -> None:
        """θ_g ← the model's weights (synchronous data parallel keeps no separate global copy)."""
        for p, chunk in self._chunks(self.global_flat):
            chunk.copy_(p.reshape(-1))

    @torch.no_grad()
    def load_into_model(self) -> None:
        for p, chunk in self._chunks(self.global_flat):
            p.copy_(chunk.view_as(p))

    def state_dict(self) -> dict:
        return {"global_flat": self.global_flat.cpu(), "momentum": self.momentum.cpu()}

    def load_state_dict(self, state: dict) -> None:
        for key in ("global_flat", "momentum"):
            value = state[key]
            if value.shape != self.global_flat.shape:
                raise ValueError(f"checkpoint {key} has {value.numel()} values; "
                                 f"the model has {self.global_flat.numel()}")
            getattr(self, key).copy_(value)


class DelayedNesterov:
    """The outer step of asynchronous DiLoCo (real/rounds/round_async.py): Liu et al. 2024's delayed Nesterov
    momentum (arXiv 2401.09135, Algorithm 3; docs/PAPERS.md), applied by the server once per push.

    Each push g (a node's pseudo-gradient, weighted as the synchronous average weighs it) moves θ_g
    by −lr·g/N at once; every N-th push the momentum takes the mean of the N pushes since the last
    one, m ← β·m + Σg/N, and θ_g moves by a further −lr·β·m. Over N pushes that is Nesterov SGD on
    their mean (torch.optim.SGD with nesterov=True; tests/test_async_real.py holds them equal), and a
    stale push never compounds into the momentum on its own. N: the number of nodes."""

    def __init__(self, global_flat: torch.Tensor, period: int):
        self.global_flat, self.period = global_flat, period
        self.momentum = torch.zeros_like(global_flat)
        self.buffer = torch.zeros_like(global_flat)
        self.pushes = 0

    @torch.no_grad()
    def step(self, grad: torch.Tensor, lr: float, momentum: float) -> None:
        """One push's update of θ_g (`grad` is not changed)."""
        self.pushes += 1
        self.buffer.add_(grad)
        self.global_flat.add_(grad, alpha=-lr / self.period)
        if self.pushes % self.period == 0:
            self.momentum.mul_(momentum).add_(self.buffer, alpha=1.0 / self.period)
            self.global_flat.add_(self.momentum, alpha=-lr * momentum)
            self.buffer.zero_()


OUTER_TIMING_LAYER_PARAMS = 2_359_296  # one 1536 x 1536 projection: tensors of a realistic size, not one huge block


def timing_sizes(params: int) -> list[int]:
    """`params` as the tensor sizes a host timing uses: layers of OUTER_TIMING_LAYER_PARAMS, the rest last."""
    whole, rest = divmod(params, OUTER_TIMING_LAYER_PARAMS)
    return [OUTER_TIMING_LAYER_PARAMS] * whole + ([rest] if rest else [])


def time_outer_step(params: int, repeats: int, weights_device: str | torch.device = "cpu",
                    state_device: str | torch.device | None = None) -> list[float]:
    """Seconds of one outer step without the all-reduce (pseudo-gradient, divide, Nesterov, weights
    back into the model), one per repeat after a warm-up, on `params` fp32 weights on
    weights_device with the outer state on state_device (default: the weights'; the host's "cpu"
    copies the weights down and the new ones up, as outer_state = "cpu" does on a GPU). The
    benchmark (benchmarks/bench_outer_step.py) and `geodt calibrate device` time the host with it."""
    weights_device = torch.device(weights_device)
    sizes = timing_sizes(params)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(n, generator=gen).to(weights_device)) for n in sizes]
    state = OuterState(weights, device=state_device)

    def sync() -> None:
        if weights_device.type == "cuda":
            torch.cuda.synchronize(weights_device)

    times = []
    for i in range(repeats + 1):
        with torch.no_grad():
            for w in weights:
                w.add_(1e-3)  # local training moved the weights: a non-zero pseudo-gradient
        sync()
        start = time.perf_counter()
        delta = state.pseudo_gradient(1.0)
        delta.div_(4.0)  # the all-reduce (not timed) sums; outer_sync divides
        state.outer_step(delta, lr=0.7, momentum=0.9)
        state.load_into_model()
        sync()
        elapsed = time.perf_counter() - start
        if i:  # the first pass pays page faults on fresh buffers
            times.append(elapsed)
    return times


def outer_sync(state: OuterState, spec: DilocoConfig, coef: float, divisor: float,
               all_reduce: Callable[[torch.Tensor], None]) -> None:
    """One outer sync: pseudo-gradient, SUM all-reduce, divide, outer step, weights into the model."""
    delta = state.pseudo_gradient(coef)
    all_reduce(delta)
    delta.div_(divisor)
    state.outer_step(delta, spec.outer_lr, spec.outer_momentum)
    state.load_into_model()
