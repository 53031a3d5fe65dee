"""The catalog step-time estimate: one training step of a decoder-only transformer on one GPU.

Torch-free (the simulator uses it; `calibrate` imports neither the simulator nor torch here).
It replaces geodt's earlier fixed "40% of the dense peak" with what the achieved fraction
physically depends on, each term a count of work divided by the rate the GPU does that kind
of work at, and every rate a datasheet figure or a published measurement:

    t(b) = accum·(t_weights + t_launch + b·t_sample) + t_optimizer        (b sequences per micro-step)

    t_sample = s·[ F_mm/(P·η_mm) + F_attn/(P·η_attn) + B_act/BW ]            (s tokens per sequence)

- F_mm = 6·(matmul weights) FLOPs per token: forward, input-gradient and weight-gradient GEMMs
  of every linear layer and the LM head (Kaplan et al. 2020, sec. 2.1; the input embedding is
  a lookup). They run at η_mm of the dense peak P: the Maximum Achievable Matmul FLOPS that
  large bf16 GEMMs reach on the part (`MATMUL_EFFICIENCY`).
- F_attn: the attention score and value products. With flash attention (FlashAttention-2,
  Dao 2023, the kernel behind torch SDPA on GPUs) the causal half of the s×s scores is
  computed, forward 2·s·h FLOPs per token per layer and forward + backward 3.5× that (its
  backward recomputes the scores), at the kernel's own published efficiency η_attn
  (`ATTENTION_EFFICIENCY`). Eager attention computes all s×s scores as batched GEMMs
  (12·s·h per token per layer at η_mm) and moves the score matrix through memory.
- B_act: bytes per token that the memory-bound work streams at the peak bandwidth BW: the
  activations each GEMM reads and writes, the norms, rotary embedding, SwiGLU, residual adds,
  the flash-attention inputs/outputs (`ACT_BYTES_*`, counted op by op below), the loss over
  the vocabulary, and with eager attention the score matrix. This is what makes small hidden
  sizes slow: matmul FLOPs per token grow with h², these bytes with h.
- t_weights: per micro-step, the autocast casts fp32 weights to half precision once, the
  forward and input-gradient GEMMs read them, and the weight gradients accumulate in fp32
  (`WEIGHT_BYTES_PER_PARAM`). It does not grow with the batch: small per-GPU batches are
  memory-bound through it.
- t_launch: per micro-step, `KERNELS_PER_LAYER` kernels per layer at `LAUNCH_S` each, added
  (not overlapped: conservative; it matters only when kernels are short).
- t_optimizer: clipping, (fp16) unscaling and the foreach AdamW update, `OPTIMIZER_BYTES_PER_PARAM`
  bytes per parameter counted op by op on geodt's own step (benchmarks/count_optimizer_bytes.py),
  divided over the shards that hold the optimizer state (1 unless ZeRO/FSDP shards it).

Recomputation (`RECOMPUTE`): "full" adds one forward pass, t_sample × 4/3 (forward is one of
the three passes of every term above). "selective-op" is torchtitan's op-level selective
checkpointing: each block saves the outputs of its matmuls and attention except every second
matmul, so the recomputation is those matmuls' forward FLOPs (q, k, v, o, gate, up, down in
forward order: k, o and up) plus every non-matmul op's forward traffic (1/3 of B_act).

Collectives that run behind compute (`comm_s`, FSDP's all-gathers and reduce-scatter per
micro-step, `fsdp_collective_s`) are not free: while a collective runs, its kernels take SMs and
memory bandwidth from the compute kernels, which slow by `OVERLAP_SLOWDOWN` (the average
measured over GPT and LLaMA training on A100/H100/MI250/MI210, arXiv 2507.03114). A micro-step
takes `overlapped_s(compute, comm)`: the compute plus the part of the collective time that
slowed it, or the collective time where the link, not the GPU, is the bound.

A model given only by its parameter count (no shape) has F_mm = its FLOPs per token and no
activation traffic: the shape terms need the hidden size.

Two steps (`STEPS`, [training] compile): "lean" is all of the above, the step of the published,
optimised stacks and of geodt's compiled step (torch.compile'd blocks, fused AdamW: within 2.6%
and 5.6% of it on an H200, ../shared/gpu/README.md). "eager" is geodt's step without compile,
priced from its own counted work (benchmarks/count_activation_bytes.py on transformers' Llama
under autocast, torch 2.13): its activations move EAGER_ACT_BYTES_* per token (about 3× the lean
count: fp32 RMSNorm in several kernels, casts, rotary's cat/neg/mul, GQA's repeat_kv copies) and
LOSS the vocabulary's EAGER_LOSS_BYTES_PER_VOCAB; it launches EAGER_KERNELS_PER_LAYER kernels per
layer; and its many small kernels stream at EAGER_BANDWIDTH_FRACTION of the peak bandwidth.
Matmuls and attention are the same kernels in both (cuBLAS, SDPA's flash attention).
Other stacks (facts/stacks.py, [training] stack) are the lean step with their activation and loss
traffic B_act scaled by a factor fitted to that stack's published throughput (`act_bytes_scale`).

The host must dispatch every op of the eager step, HOST_S_PER_OP each, and the device runs an op
only once it is dispatched and the previous one is done: a two-stage pipeline over the step's own
ops in dispatch order (`DispatchPipeline`; facts/step_ops.csv, traced by
benchmarks/trace_step_ops.py). Op k (k = 1..N) is ready at k·h and ends at
f_k = max(f_{k−1}, k·h) + d_k; the step is f_N. d_k is the op's share of the same device estimate
above: each op costs max(FLOPs / rate, bytes / bandwidth) (a kernel is bound by the slower of its
arithmetic and its memory traffic; matmuls at η_mm, flash attention at η_attn on the causal half
of its scores), and the micro-step's ops are scaled to sum to the micro-step's device time, the
optimizer's ops to t_optimizer: the pipeline moves where the device idles, not how much it works.
So the step is >= both the device's total and the host's N·h, and where they meet (a run of small
ops the host cannot dispatch fast enough, then a big kernel the host waits behind) more than
either. Compiled steps dispatch a few fused kernels per block: no pipeline. A CPU runs each op as
its host dispatches it, nothing to overlap: no pipeline either.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from facts.catalog import GpuSpec, get_gpu, peak_tflops
from facts.step_ops import StepOps, step_ops
from formats.wire import ring_allreduce_s

# Maximum Achievable Matmul FLOPS / dense peak, bf16, measured with mamf-finder.py (S. Bekman,
# ml-engineering, compute/accelerator/README.md "Maximum Achievable Matmul FLOPS comparison
# table", commit 744d01e): A100 SXM 271.2/312, H100 SXM 794.5/989 ("H200 is the same").
# h100-hbm2e (the same GH100 at a 500 W limit, torchtitan's H100s) takes the H100 SXM's figures: an
# assumption; what its power limit costs is not priced (facts/stacks.py's fit absorbs it).
MATMUL_EFFICIENCY = {"a100-40gb": 0.869, "a100-80gb": 0.869, "h100-sxm": 0.803, "h100-hbm2e": 0.803, "h200": 0.803}
# Parts not measured there: the lowest NVIDIA figure of that table (H100 SXM). An assumption.
DEFAULT_MATMUL_EFFICIENCY = 0.803
# FlashAttention-2 forward + backward, fraction of the dense peak: on A100 the paper reports
# 50-73% of peak (Dao 2023, abstract; forward reaches the top, forward + backward the lower
# half), taken as 0.55; on H100 FlashAttention-2 reaches 35% (Shah et al. 2024,
# FlashAttention-3, abstract). Other parts: the A100 figure (an assumption).
ATTENTION_EFFICIENCY = {"h100-sxm": 0.35, "h100-pcie": 0.35, "h100-hbm2e": 0.35, "h200": 0.35}
DEFAULT_ATTENTION_EFFICIENCY = 0.55
# Forward bytes read + written per token per layer by the memory-bound work and the GEMMs'
# activation operands, LLaMA block, unfused ops, half-precision activations (2 bytes) and the
# fp32 residual stream that autocast over fp32 master weights keeps (4 bytes): attention norm
# reads x and writes its half output 6h; q/k/v GEMMs read it three times and write q, k, v
# 6h + 2h + 4kv; rotary reads and writes q, k 4h + 4kv; flash attention reads q, k, v and
# writes o 4h + 4kv; output GEMM 4h; residual add (read fp32 x and the half output, write fp32)
# 10h; MLP norm 6h; gate/up GEMMs read x twice and write 2f 4h + 4f; SiLU 4f and product 6f;
# down GEMM 2f + 2h; residual add 10h. Sum 58h + 12kv + 16f bytes (GELU MLP of GPT/MPT: up GEMM
# writes f, GELU reads and writes it, down GEMM reads it: 8f). Backward moves twice the forward
# (counted on geodt's own step by benchmarks/count_activation_bytes.py: 1.79x), so ×3 in all.
# In fp32 every activation is 4 bytes: ×2 (the residual stream's share is overcounted; small).
ACT_BYTES_H = 58
ACT_BYTES_KV = 12
ACT_BYTES_FFN_GATED = 16
ACT_BYTES_FFN_PLAIN = 8
PASSES = 3  # forward + backward (2x forward)
# The loss per token over the vocabulary: logits written (half), upcast to fp32, log-softmax
# read + written, its gradient written and read, cast back, read by the head's GEMMs: 32 bytes
# per vocabulary entry in half precision (48 in fp32), forward and backward together.
LOSS_BYTES_PER_VOCAB = {"bf16": 32, "fp16": 32, "fp32": 48}
# Eager attention: per score element, forward writes the scores, scales/masks (read + write),
# softmax (read + write), the value product reads them: 6 elements; ×3 with backward.
EAGER_SCORE_ELEMENTS = 18
# Per micro-step weight traffic per parameter: autocast cast fp32 → half (read 4, write 2),
# forward and input-gradient GEMMs read the half copy (2 + 2), fp32 gradient accumulation
# (read 4, write 4). In fp32 there is no cast: reads 4 + 4, gradient 8.
WEIGHT_BYTES_PER_PARAM = {"bf16": 18, "fp16": 18, "fp32": 16}
# FSDP, per micro-step and parameter: the forward and backward all-gathers write the gathered
# half-precision weights (2 + 2) and the reduce-scatter reads and writes the fp32 gradients (4 + 4).
# The collectives' link time is taken as overlapped with compute (FSDP prefetches the next layer).
FSDP_BYTES_PER_PARAM = 12
# Bytes of memory traffic per parameter after backward, counted op by op on train/step.py's step
# (benchmarks/count_optimizer_bytes.py, torch 2.13): foreach AdamW 80 (weight decay 8, lerp m 12, v·β2 8,
# addcmul v 12, sqrt 8, div 8, +eps 8, addcdiv θ 16), clip_grad_norm_ 12 (norm 4, scale 8), and under fp16
# the GradScaler's unscale 8; zero_grad(set_to_none) moves nothing.
OPTIMIZER_BYTES_PER_PARAM = {"fp16": 100, "bf16": 92, "fp32": 92}
# Kernel launches: a LLaMA layer in eager PyTorch runs about 40 kernels forward and twice that
# backward; each costs the CUDA launch latency, about 5 µs.
KERNELS_PER_LAYER = 120
LAUNCH_S = 5e-6
# A model given only by its parameter count: a fixed launch budget instead (geodt's earlier figure).
SHAPELESS_LAUNCH_S = 0.008
# FlashAttention-1-class kernels (FlashAttention 1, the Triton tutorial kernel llm-foundry's
# attn_impl "triton" uses) run at half FlashAttention-2's rate: FA2 "yield[s] around 2x speedup
# compared to FlashAttention", which reached "only 25-40% of the theoretical maximum" (Dao 2023, abstract).
FLASH1_SLOWDOWN = 2.0
ATTENTIONS = ("flash", "flash1", "eager")
STEPS = ("lean", "eager")
# geodt's eager step, counted by benchmarks/count_activation_bytes.py (torch 2.13, bf16 autocast):
# bytes per token per layer, forward + backward (577h + 130kv + 54f), per vocabulary entry (the
# fp32 upcast of the logits, cross-entropy, its gradient), and data-moving ops (each a kernel) per layer.
EAGER_ACT_BYTES_H = 577
EAGER_ACT_BYTES_KV = 130
EAGER_ACT_BYTES_FFN = 54
EAGER_LOSS_BYTES_PER_VOCAB = 54
EAGER_KERNELS_PER_LAYER = 144
# The eager step's memory-bound kernels stream at the fraction of the peak bandwidth a device-to-device
# copy reaches: 4,242 GB/s of the H200's 4,800 (measured on an H200, 2026-11-26, ../shared/gpu/README.md;
# other parts: the same fraction, an assumption).
EAGER_BANDWIDTH_FRACTION = 4242 / 4800
# The host's side of the eager step: each op it dispatches (facts/step_ops.csv: transformers' Llama,
# fused AdamW, clipping's foreach ops as on CUDA; llama-150m 3,101 ops, llama-1b 5,911 in bf16) costs
# it "~5–25 µs of CPU-side work per op" (Python, binding, autograd, dispatcher, launch: J. Lin, "From
# PyTorch op to kernel launch", jiahuanglin.xyz, lesson 18), taken at the middle, 15 µs. The H200
# host's host-bound rows (../shared/gpu): llama-150m at batch 1 took 49.8 ms (16.1 µs per op),
# llama-1b 89.9 ms (15.2 µs).
HOST_S_PER_OP = 15e-6
# Ops priced per chunk of this many batches at once (memory: chunk × ops floats).
PIPELINE_CHUNK = 64
RECOMPUTE = ("none", "full", "selective-op")
# Compute runs this much slower while a collective runs beside it: the average over GPT and LLaMA
# training workloads on 4 A100s, H100s, MI250s and MI210s ("Characterizing
# Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning", arXiv 2507.03114,
# abstract: "an average computational slowdown of 18.9%, with a maximum of 40.0%").
OVERLAP_SLOWDOWN = 0.189
# FSDP2's MixedPrecisionPolicy as geodt's executor and torchtitan use it: the parameters are
# gathered in the half-precision compute dtype (forward and again in backward), the gradients
# reduce-scattered in fp32.
FSDP_GATHER_BYTES = 2
FSDP_REDUCE_BYTES = 4


class EstimateError(ValueError):
    """An estimate asked for something it cannot describe (unknown attention, bad numbers)."""


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a decoder: sizes as in a LLaMA config; gated_mlp False for GELU MLPs."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    gated_mlp: bool = True

    @classmethod
    def of(cls, arch) -> Shape:
        """The shape of a `facts.presets.ModelArch`."""
        return cls(arch.hidden_size, arch.num_layers, arch.num_heads, arch.num_kv_heads, arch.ffn_size, arch.vocab_size)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    def forward_matmuls(self) -> tuple[int, ...]:
        """Weights of one block's matmuls in forward order: q, k, v, o, then gate, up, down
        (a gated MLP computes its gate before its up projection) or up, down."""
        h, kv, f = self.hidden, self.kv_dim, self.ffn
        mlp = (h * f, h * f, f * h) if self.gated_mlp else (h * f, f * h)
        return (h * h, h * kv, h * kv, h * h) + mlp

    @property
    def matmul_params(self) -> int:
        """Weights used in matrix multiplies per token: every layer's projections and the LM head."""
        h, f = self.hidden, self.ffn
        mlp = (3 if self.gated_mlp else 2) * h * f
        return self.layers * (2 * h * h + 2 * h * self.kv_dim + mlp) + self.vocab * h


def pipeline_block(device_s: np.ndarray, host_s_per_op: float) -> tuple[np.ndarray, np.ndarray]:
    """Ops dispatched at h, 2h, .., N·h after a block starts (device_s (..., N), run in order): the
    device's busy seconds Σd_k, and when the last op ends if the device starts idle,
    max_j (j·h + Σ_{k>=j} d_k), the unrolled f_k = max(f_{k−1}, k·h) + d_k, f_0 = 0. A block that
    starts with the device busy until `f` and the host at `t` ends at max(f + busy, t + lead)."""
    after = np.cumsum(device_s[..., ::-1], axis=-1)[..., ::-1]  # Σ_{k>=j} d_k
    ready = host_s_per_op * np.arange(1, device_s.shape[-1] + 1)
    return device_s.sum(axis=-1), (ready + after).max(axis=-1)


def pipeline_s(device_s, host_s_per_op: float) -> np.ndarray:
    """f_N of one sequence of ops (device_s (..., N)) dispatched from an idle host to an idle device."""
    return pipeline_block(np.asarray(device_s, dtype=float), host_s_per_op)[1]


@dataclass(frozen=True)
class DispatchPipeline:
    """The eager step's ops as the host dispatches them and the device runs them (module docstring)."""

    ops: StepOps
    flops_per_s: np.ndarray  # (N,) the rate of each op's FLOPs
    bytes_per_s: float
    host_s_per_op: float = HOST_S_PER_OP

    def op_seconds(self, batch: np.ndarray) -> np.ndarray:
        """(B, N) each op's roofline seconds at each batch (before scaling to the device estimate)."""
        b = batch[:, None]
        flops = self.ops.flops[0] + b * self.ops.flops[1]
        moved = self.ops.bytes[0] + b * self.ops.bytes[1]
        return np.maximum(flops / self.flops_per_s, moved / self.bytes_per_s)

    @cached_property
    def optimizer_op_seconds(self) -> np.ndarray:
        """The optimizer's ops' roofline seconds (they do not depend on the batch)."""
        return self.op_seconds(np.zeros(1))[0, self.ops.micro_ops:]

    def step_s(self, batch, micro_s, optimizer_s: float, accum: int = 1):
        """One step: `accum` micro-steps of `batch` sequences (micro_s device seconds each, like batch
        a number or an array) then the optimizer (optimizer_s), through the pipeline."""
        shape = np.shape(batch)
        flat = np.asarray(batch, dtype=float).reshape(-1)
        uniq, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
        micro = np.broadcast_to(np.asarray(micro_s, dtype=float), shape).reshape(-1)[first]
        n = self.ops.micro_ops
        opt = self.optimizer_op_seconds
        opt_busy, opt_lead = pipeline_block(opt * (optimizer_s / opt.sum()), self.host_s_per_op)
        out = np.empty(len(uniq))
        for lo in range(0, len(uniq), PIPELINE_CHUNK):
            part = slice(lo, lo + PIPELINE_CHUNK)
            raw = self.op_seconds(uniq[part])[:, :n]
            busy, lead = pipeline_block(raw * (micro[part] / raw.sum(axis=1))[:, None], self.host_s_per_op)
            end, host = np.zeros(len(busy)), 0.0
            for _ in range(accum):
                end, host = np.maximum(end + busy, host + lead), host + n * self.host_s_per_op
            out[part] = np.maximum(end + opt_busy, host + opt_lead)
        out = out[inverse].reshape(shape)
        return float(out) if not shape else out


@dataclass(frozen=True)
class StepEstimate:
    """The parts of one GPU's step time, in seconds (module docstring)."""

    sample_s: float     # per sequence of the micro-batch
    weights_s: float    # per micro-step, independent of the batch
    launch_s: float     # per micro-step
    optimizer_s: float  # per optimizer step
    comm_s: float = 0.0  # per micro-step: collectives that run behind the compute (FSDP)
    pipeline: DispatchPipeline | None = field(default=None, compare=False, repr=False)  # eager GPU steps

    @property
    def host_s(self) -> float:
        """Per micro-step, the host's seconds dispatching the eager step's ops (0: not counted)."""
        return 0.0 if self.pipeline is None else self.pipeline.ops.micro_ops * self.pipeline.host_s_per_op

    @property
    def fixed_s(self) -> float:
        """The per-step cost that does not grow with the batch (one micro-step per step, no collectives)."""
        return self.weights_s + self.launch_s + self.optimizer_s

    def step_s(self, batch, accum: int = 1):
        """Seconds of one optimizer step of `accum` micro-steps of `batch` sequences (batch may be an
        array when there are no collectives): the device's time, or an eager GPU step's pipeline."""
        if self.pipeline is None and not self.comm_s and accum == 1:
            return self.fixed_s + self.sample_s * batch  # t0 + c·b: the floats the sweep and plans always had
        compute_s = self.weights_s + self.launch_s + self.sample_s * batch
        micro_s = overlapped_s(compute_s, self.comm_s) if self.comm_s else compute_s
        if self.pipeline is None:
            return accum * micro_s + self.optimizer_s
        return self.pipeline.step_s(batch, micro_s, self.optimizer_s, accum)

    def tokens_per_s(self, batch: int, seq_len: int, accum: int = 1) -> float:
        return accum * batch * seq_len / self.step_s(batch, accum)


def dispatch_pipeline(shape: Shape, spec: GpuSpec, dtype: str, seq_len: int, attention: str) -> DispatchPipeline:
    """The eager step of `shape` on `spec` as a pipeline: its traced ops (facts/step_ops.csv) at the
    estimate's rates: matmuls at η_mm, attention at η_attn over the causal half of the full-square
    FLOPs the trace counts (×FLASH1_SLOWDOWN slower for flash1), bytes at the eager bandwidth.
    The ops are a Llama's (geodt's models): another shape (a GELU MLP) is priced with them."""
    ops = step_ops(shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.ffn, shape.vocab, seq_len, dtype)
    peak = peak_tflops(spec, dtype) * 1e12
    eta_mm, eta_attn = efficiencies(spec)
    attn_rate = 2.0 * peak * eta_attn / (FLASH1_SLOWDOWN if attention == "flash1" else 1.0)
    rates = np.where(ops.attention, attn_rate, peak * eta_mm)
    return DispatchPipeline(ops, rates, spec.memory_bandwidth_gbs * 1e9 * EAGER_BANDWIDTH_FRACTION)


def overlapped_s(compute_s: float, comm_s: float) -> float:
    """Seconds of compute_s of work with comm_s of collectives running beside it: compute slowed by
    OVERLAP_SLOWDOWN while the collective runs, or the collective's own time if the link is the bound."""
    slowed = 1.0 + OVERLAP_SLOWDOWN
    if comm_s >= compute_s * slowed:
        return comm_s
    return compute_s + comm_s * (1.0 - 1.0 / slowed)


def fsdp_payload_bytes(params: float, gather_bytes: int = FSDP_GATHER_BYTES, gathers: int = 2) -> float:
    """FSDP's collectives of `params` parameters written as one ring all-reduce's payload: `gathers`
    all-gathers (gather_bytes each) and a reduce-scatter (FSDP_REDUCE_BYTES), each (k−1)/k of its
    bytes per device, where a ring all-reduce moves 2(k−1)/k of its payload."""
    return params * (gathers * gather_bytes + FSDP_REDUCE_BYTES) / 2


def fsdp_collective_s(params: float, devices: int, link_gbps: float, gather_bytes: int = FSDP_GATHER_BYTES) -> float:
    """Per micro-step seconds of FSDP's two all-gathers and reduce-scatter among `devices` over a
    link of link_gbps each way (`fsdp_payload_bytes`). Across nodes, each node's uplink carries
    the same volume (a ring enters and leaves every node once), so link_gbps is the slower of
    the device's own link and its node's uplink."""
    return ring_allreduce_s(devices, 0.0, fsdp_payload_bytes(params, gather_bytes), link_gbps)


def efficiencies(spec: GpuSpec) -> tuple[float, float]:
    """(η_mm, η_attn) of a catalog GPU."""
    return (MATMUL_EFFICIENCY.get(spec.key, DEFAULT_MATMUL_EFFICIENCY),
            ATTENTION_EFFICIENCY.get(spec.key, DEFAULT_ATTENTION_EFFICIENCY))


def _block_act_bytes(shape: Shape, dtype: str) -> float:
    """B_act's blocks: bytes per token of every layer's memory-bound work, forward and backward."""
    scale = 2 if dtype == "fp32" else 1
    ffn_bytes = ACT_BYTES_FFN_GATED if shape.gated_mlp else ACT_BYTES_FFN_PLAIN
    return scale * shape.layers * PASSES * (ACT_BYTES_H * shape.hidden + ACT_BYTES_KV * shape.kv_dim
                                            + ffn_bytes * shape.ffn)


def _selective_op_s(shape: Shape, spec: GpuSpec, dtype: str, seq_len: int, act_bytes_scale: float = 1.0) -> float:
    """Per sequence, what "selective-op" recomputes: every second matmul's forward, every
    non-matmul op's forward traffic (module docstring; act_bytes_scale as in `estimate_step`)."""
    eta_mm, _ = efficiencies(spec)
    flops = 2.0 * shape.layers * sum(shape.forward_matmuls()[1::2])
    return seq_len * (flops / (peak_tflops(spec, dtype) * 1e12 * eta_mm)
                      + act_bytes_scale * _block_act_bytes(shape, dtype) / PASSES / (spec.memory_bandwidth_gbs * 1e9))


def _eager_act_bytes(shape: Shape, dtype: str) -> float:
    """The eager step's counted activation and loss bytes per token (STEPS; fp32: every activation
    4 bytes, ×2 as for the lean count)."""
    scale = 2 if dtype == "fp32" else 1
    return scale * (shape.layers * (EAGER_ACT_BYTES_H * shape.hidden + EAGER_ACT_BYTES_KV * shape.kv_dim
                                    + EAGER_ACT_BYTES_FFN * shape.ffn) + EAGER_LOSS_BYTES_PER_VOCAB * shape.vocab)


def _sample_s(shape: Shape, spec: GpuSpec, dtype: str, seq_len: int, attention: str, flops_per_token,
              step: str = "lean", act_bytes_scale: float = 1.0) -> float:
    peak = peak_tflops(spec, dtype) * 1e12
    bandwidth = spec.memory_bandwidth_gbs * 1e9
    eta_mm, eta_attn = efficiencies(spec)
    h, layers = shape.hidden, shape.layers
    elem = 4 if dtype == "fp32" else 2
    f_mm = 6.0 * shape.matmul_params if flops_per_token is None else float(flops_per_token)
    if step == "eager":
        act_bytes = _eager_act_bytes(shape, dtype)
        bandwidth *= EAGER_BANDWIDTH_FRACTION
    else:
        act_bytes = act_bytes_scale * (_block_act_bytes(shape, dtype) + LOSS_BYTES_PER_VOCAB[dtype] * shape.vocab)
    if attention in ("flash", "flash1"):
        attn_s = 3.5 * 2.0 * layers * seq_len * h / (peak * eta_attn)
        if attention == "flash1":
            attn_s *= FLASH1_SLOWDOWN
    else:
        attn_s = 12.0 * layers * seq_len * h / (peak * eta_mm)
        act_bytes += layers * EAGER_SCORE_ELEMENTS * shape.heads * seq_len * elem
    if flops_per_token is not None:
        attn_s = 0.0  # a given FLOP count already holds attention's
    return seq_len * (f_mm / (peak * eta_mm) + attn_s + act_bytes / bandwidth)


def estimate_step(gpu_key: str, dtype: str, seq_len: int, *, shape: Shape | None = None,
                  params: float | None = None, flops_per_token: float | None = None,
                  attention: str = "flash", recompute: str = "none", optimizer_shards: int = 1,
                  fsdp: bool = False, comm_s: float = 0.0, step: str = "lean",
                  act_bytes_scale: float = 1.0) -> StepEstimate:
    """The estimate of one GPU of type gpu_key (module docstring).

    shape: the model's sizes (None: only `params` is known, and then `flops_per_token` or 6·params
    gives the work). params: the parameter count (default: the shape's, embeddings included).
    flops_per_token: a given training FLOP count per token, used instead of the shape's matmul
    and attention FLOPs. optimizer_shards: how many devices share the optimizer update.
    recompute: one of RECOMPUTE. fsdp: the weights are gathered and the gradients reduce-scattered
    every micro-step (their memory traffic); comm_s: those collectives' seconds per micro-step
    (`fsdp_collective_s`), run behind the compute (`overlapped_s`). step: "lean" (compiled) or
    "eager" (STEPS, module docstring). act_bytes_scale: the lean step's activation and loss bytes
    (B_act) times this, another stack's fitted traffic (facts/stacks.py; 1: the lean count)."""
    if step not in STEPS:
        raise EstimateError(f"unknown step {step!r}; expected one of {', '.join(STEPS)}")
    if attention not in ATTENTIONS:
        raise EstimateError(f"unknown attention {attention!r}; expected one of {', '.join(ATTENTIONS)}")
    if recompute not in RECOMPUTE:
        raise EstimateError(f"unknown recompute {recompute!r}; expected one of {', '.join(RECOMPUTE)}")
    if recompute == "selective-op" and (shape is None or flops_per_token is not None):
        raise EstimateError("selective-op recomputation needs the model's shape (and no given flops_per_token)")
    if not act_bytes_scale > 0 or (step == "eager" and act_bytes_scale != 1.0):
        raise EstimateError(f"act_bytes_scale {act_bytes_scale!r}: expected > 0, and 1 for the eager step (counted)")
    if not (seq_len > 0 and optimizer_shards >= 1):
        raise EstimateError(f"expected seq_len > 0 and optimizer_shards >= 1, got {seq_len}, {optimizer_shards}")
    spec = get_gpu(gpu_key)
    peak_tflops(spec, dtype)  # validates the dtype
    bandwidth = spec.memory_bandwidth_gbs * 1e9 * (EAGER_BANDWIDTH_FRACTION if step == "eager" else 1.0)
    if shape is None:
        if params is None:
            raise EstimateError("expected a model shape or a parameter count")
        eta_mm, _ = efficiencies(spec)
        work = 6.0 * params if flops_per_token is None else float(flops_per_token)
        sample_s = seq_len * work / (peak_tflops(spec, dtype) * 1e12 * eta_mm)
        launch_s = SHAPELESS_LAUNCH_S
    else:
        if params is None:
            params = shape.matmul_params + shape.vocab * shape.hidden  # + the input embedding (norms are negligible)
        sample_s = _sample_s(shape, spec, dtype, seq_len, attention, flops_per_token, step, act_bytes_scale)
        launch_s = shape.layers * (EAGER_KERNELS_PER_LAYER if step == "eager" else KERNELS_PER_LAYER) * LAUNCH_S
    if recompute == "full":
        sample_s *= 4.0 / 3.0
    elif recompute == "selective-op":
        sample_s += _selective_op_s(shape, spec, dtype, seq_len, act_bytes_scale)
    # A CPU runs each op as its host dispatches it, nothing to overlap: no pipeline (the nominal rate holds it).
    pipeline = (dispatch_pipeline(shape, spec, dtype, seq_len, attention)
                if step == "eager" and shape is not None and gpu_key != "cpu" else None)
    return StepEstimate(sample_s=sample_s, comm_s=comm_s, pipeline=pipeline,
                        weights_s=((WEIGHT_BYTES_PER_PARAM[dtype] + (FSDP_BYTES_PER_PARAM if fsdp else 0))
                                   * params / bandwidth),
                        launch_s=launch_s,
                        optimizer_s=OPTIMIZER_BYTES_PER_PARAM[dtype] * params / optimizer_shards / bandwidth)
