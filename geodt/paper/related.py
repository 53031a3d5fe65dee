"""Models of the two companion papers (docs/PAPERS.md 001 and 002), built from geodt's own parts.

002 (ResNet-18, CIFAR-10, Horovod on 4x T4): a run of S samples per GPU at per-GPU batch b
takes S/b synchronous steps of t(b) = t0 + a + c·b, where t0 is the fixed per-step compute
cost, a the per-step ring all-reduce of the gradients and c the per-sample cost. So

    T(b) = α / b + β,     α = S·(t0 + a),     β = S·c

which is linear in (α, β). We fit it by least squares on RELATIVE error, Σ((T̂ − T)/T)²: the
times span 7×, and plain least squares would spend the fit on the b = 8 point. The paper does
not give its epoch count, so S is unknown and only α/β = (t0 + a)/c (the batch at which the
fixed and per-sample costs are equal) is identified by the fit alone. With the catalog's c for
a T4 (fp32, CNN_MFU of its dense peak) and the network model's a, S and t0 follow: reported as
implied values, not as facts.

001 (minGPT `gpt-mini` on TinyShakespeare, node A = 2x A30, node B = 4x Titan Xp): we model
one epoch with minGPT's defaults (6 layers, 6 heads, width 192, 65 characters, context 128,
batch 64 per process, fp32: its trainer uses no autocast) and the catalog estimate of t(b)
(simulator.models.timing). A share s of every global step's samples goes to node A, split evenly over
its GPUs, the rest to node B. Two readings of the paper's set-up are drawn:
  - one DDP job across both nodes: per step max(t_A, t_B) plus a ring all-reduce of fp32
    gradients among the 6 ranks over an assumed 1 Gbit/s, 1 ms link between the nodes;
  - each node trains on its own share as a separate job: time = max(T_A, T_B).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from facts.catalog import get_gpu, peak_tflops
from formats.wire import ring_allreduce_s
from geodt.paper import facts
from simulator.models.timing import DEFAULT_INTRA_NODE_GBPS, NodeTiming
from simulator.scenario import ModelConfig, NetworkConfig, NodeConfig, Scenario

# ResNet-18 for 32x32 CIFAR images (the common CIFAR variant: 3x3 stem, no max-pool).
RESNET18_CIFAR_PARAMS = 11_173_962
RESNET18_CIFAR_FWD_FLOPS = 1.11e9      # 0.556 G multiply-adds per image, forward
CIFAR10_TRAIN_SAMPLES = 50_000
# A CNN's achieved fraction of the dense FP32 peak: geodt's earlier fixed catalog assumption, kept for
# this one ResNet (simulator.models.estimate models decoder transformers, not convolutions).
CNN_MFU = 0.40

# minGPT chargpt defaults (projects/chargpt/chargpt.py, mingpt/model.py, mingpt/trainer.py).
MINGPT_LAYERS, MINGPT_WIDTH, MINGPT_VOCAB, MINGPT_CONTEXT = 6, 192, 65, 128
MINGPT_BATCH_PER_PROCESS = 64
TINYSHAKESPEARE_CHARS = 1_115_394
P001_LINK_GBPS, P001_LINK_LATENCY_MS = 1.0, 1.0


@dataclass(frozen=True)
class BatchFit:
    alpha_s: float                     # S·(t0 + a), seconds × samples
    beta_s: float                      # S·c, seconds
    fitted_s: tuple[float, ...]
    error_pct: tuple[float, ...]       # (fit − paper) / paper × 100, per batch
    allreduce_s: float                 # a: per-step all-reduce, network model
    catalog_c_s: float                 # c: per-sample cost, catalog estimate
    implied_samples_per_gpu: float     # S = β / c
    implied_epochs: float              # S × GPUs / CIFAR-10 training samples
    implied_t0_s: float                # α / S − a

    @property
    def break_even_batch(self) -> float:
        return self.alpha_s / self.beta_s


def fit_batch_time(batch=facts.P002_BATCH, time_s=facts.P002_TIME_S) -> BatchFit:
    """Relative least-squares fit of T(b) = α/b + β to paper 002 (module docstring)."""
    b, t = np.asarray(batch, float), np.asarray(time_s, float)
    design = np.column_stack([1 / (b * t), 1 / t])
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    fitted = alpha / b + beta
    spec = get_gpu(facts.P002_GPU)
    a = ring_allreduce_s(facts.P002_GPUS, 0.0, 4 * RESNET18_CIFAR_PARAMS, DEFAULT_INTRA_NODE_GBPS)
    c = 3 * RESNET18_CIFAR_FWD_FLOPS / (peak_tflops(spec, "fp32") * 1e12 * CNN_MFU)
    samples = beta / c
    return BatchFit(alpha_s=float(alpha), beta_s=float(beta), fitted_s=tuple(map(float, fitted)),
                    error_pct=tuple(map(float, (fitted - t) / t * 100)), allreduce_s=a, catalog_c_s=c,
                    implied_samples_per_gpu=float(samples),
                    implied_epochs=float(samples * facts.P002_GPUS / CIFAR10_TRAIN_SAMPLES),
                    implied_t0_s=float(alpha / samples - a))


def mingpt_params() -> int:
    """minGPT GPT parameter count: blocks (12d² + 13d each), token and position embeddings, final norm, head."""
    d = MINGPT_WIDTH
    return MINGPT_LAYERS * (12 * d * d + 13 * d) + MINGPT_VOCAB * d + MINGPT_CONTEXT * d + 2 * d + MINGPT_VOCAB * d


def mingpt_flops_per_token() -> float:
    """6·N_matmul + 6·L·seq·d (the presets' convention): embeddings are lookups, the head is a matmul."""
    n_matmul = mingpt_params() - MINGPT_VOCAB * MINGPT_WIDTH - MINGPT_CONTEXT * MINGPT_WIDTH
    return 6.0 * n_matmul + 6.0 * MINGPT_LAYERS * MINGPT_CONTEXT * MINGPT_WIDTH


def p001_scenario() -> Scenario:
    model = ModelConfig(params=float(mingpt_params()), flops_per_token=mingpt_flops_per_token(),
                        seq_len=MINGPT_CONTEXT, dtype="fp32")
    nodes = (NodeConfig(name="nodeA", gpus={facts.P001_NODE_A[0]: facts.P001_NODE_A[1]}),
             NodeConfig(name="nodeB", gpus={facts.P001_NODE_B[0]: facts.P001_NODE_B[1]}))
    return Scenario(name="paper001", nodes=nodes, model=model,
                    network=NetworkConfig(bandwidth_gbps=P001_LINK_GBPS, latency_ms=P001_LINK_LATENCY_MS))


@dataclass(frozen=True)
class ShareCurves:
    share: np.ndarray            # fraction of samples given to node A
    ddp_s: np.ndarray            # one DDP job across both nodes, seconds per epoch
    separate_s: np.ndarray       # two separate jobs, makespan
    node_a_s: np.ndarray         # node A's compute for its share (separate jobs)
    node_b_s: np.ndarray
    uniform_share: float         # DistributedSampler's even split over all GPUs
    allreduce_s: float           # per step, across nodes

    def best(self, curve: np.ndarray) -> tuple[float, float]:
        i = int(np.argmin(curve))
        return float(self.share[i]), float(curve[i])


def share_curves(points: int = 401) -> ShareCurves:
    """Epoch time against node A's share of the data (module docstring's two readings)."""
    scenario = p001_scenario()
    timing_a, timing_b = (NodeTiming(scenario, node) for node in scenario.nodes)
    gpus_a, gpus_b = facts.P001_NODE_A[1], facts.P001_NODE_B[1]
    ranks = gpus_a + gpus_b
    global_batch = MINGPT_BATCH_PER_PROCESS * ranks
    samples = TINYSHAKESPEARE_CHARS - MINGPT_CONTEXT  # minGPT CharDataset.__len__
    steps = samples / global_batch
    share = np.linspace(0.0, 1.0, points)
    t_a = np.array([timing_a.estimate_s(s * global_batch / gpus_a) if s > 0 else 0.0 for s in share])
    t_b = np.array([timing_b.estimate_s((1 - s) * global_batch / gpus_b) if s < 1 else 0.0 for s in share])
    allreduce = ring_allreduce_s(ranks, P001_LINK_LATENCY_MS, 4 * mingpt_params(), P001_LINK_GBPS)
    ddp = steps * (np.maximum(t_a, t_b) + allreduce)
    # Separate jobs: each node runs its share at the same per-process batch.
    per_a = np.array(timing_a.estimate_s(MINGPT_BATCH_PER_PROCESS)) / (MINGPT_BATCH_PER_PROCESS * gpus_a)
    per_b = np.array(timing_b.estimate_s(MINGPT_BATCH_PER_PROCESS)) / (MINGPT_BATCH_PER_PROCESS * gpus_b)
    node_a, node_b = samples * share * per_a, samples * (1 - share) * per_b
    return ShareCurves(share=share, ddp_s=ddp, separate_s=np.maximum(node_a, node_b), node_a_s=node_a,
                       node_b_s=node_b, uniform_share=gpus_a / ranks, allreduce_s=allreduce)
