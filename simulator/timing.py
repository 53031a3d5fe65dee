"""Per-node step-time models t_i(b) and memory limits: catalog estimate, given constant, profile.

Catalog estimate (affine, per GPU type g, per-GPU batch b):

    t_g(b) = t0_g + c_g · b
    t0_g   = LAUNCH_OVERHEAD_S + OPTIMIZER_BYTES_PER_PARAM[dtype] · N / mem_bandwidth_g
    c_g    = flops_per_token · seq_len / (peak_tflops_g(dtype) · 1e12 · MFU)

t0 is the per-step cost that does not grow with the batch: unscaling (fp16), gradient clipping
and the foreach AdamW update stream every parameter's fp32 weight, gradient and two moments
through memory in several passes (OPTIMIZER_BYTES_PER_PARAM, counted), plus kernel launches. c is the per-sample cost:
training FLOPs of one sequence at a model FLOPs utilisation MFU of the correct dense peak
(`calibrate.catalog.peak_tflops`: FP16 with FP32 accumulate on GeForce cards, not the
datasheet headline).

A node with several GPUs runs data-parallel inside: each step waits for its slowest GPU and
then all-reduces fp32 gradients over the intra-node link (ring, not overlapped with backward:
a conservative choice):

    t_node(b) = max_g t_g(b) + 2(k−1)/k · 4N bytes / intra_node_bandwidth      (k GPUs)

The intra-node link is the node's `intra_node_gbps` if given, else the slowest of its GPUs'
catalog `intra_node_gbps` (NVLink for SXM parts, PCIe for the rest).

Precedence (docs/DESIGN.md): a node's `step_time_s` is its time at the scenario's baseline batch;
other batches follow the catalog estimate's shape scaled to it,
t(b) = step_time_s · est(b) / est(b_base). A `profile` replaces the per-GPU estimate with
measured t(b) (exact at measured batches, interpolated between, fitted beyond).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from calibrate.catalog import get_gpu, peak_tflops
from formats.errors import FieldError
from simulator.memory import GIB, memory_need_bytes
from simulator.scenario import NodeConfig, Scenario

MFU = 0.40
LAUNCH_OVERHEAD_S = 0.008
# Bytes of memory traffic per parameter after backward, counted op by op on calibrate/step.py's step
# (benchmarks/count_optimizer_bytes.py, torch 2.13): foreach AdamW 80 (weight decay 8, lerp m 12, v·β2 8,
# addcmul v 12, sqrt 8, div 8, +eps 8, addcdiv θ 16), clip_grad_norm_ 12 (norm 4, scale 8), and under fp16
# the GradScaler's unscale 8; zero_grad(set_to_none) moves nothing. Was 36 (one fused pass).
OPTIMIZER_BYTES_PER_PARAM = {"fp16": 100, "bf16": 92, "fp32": 92}
GRAD_BYTES_PER_PARAM = 4
DEFAULT_INTRA_NODE_GBPS = 100.0  # PCIe 3.0 x16 through the host, effective (the catalog's PCIe figure)
# The largest batch any search tries: far above what a GPU holds of any preset, and it keeps
# every search bounded when nothing (no OOM row, no memory figure) bounds the batch.
MAX_SEARCH_BATCH = 1 << 16


def gpu_step_coefficients(scenario: Scenario, gpu_key: str) -> tuple[float, float]:
    """(t0, c) of the catalog estimate t_g(b) = t0 + c·b of one GPU of type gpu_key."""
    spec = get_gpu(gpu_key)
    n = scenario.model.param_count
    t0 = LAUNCH_OVERHEAD_S + OPTIMIZER_BYTES_PER_PARAM[scenario.model.dtype] * n / (spec.memory_bandwidth_gbs * 1e9)
    flops_per_sample = scenario.model.train_flops_per_token * scenario.model.seq_len
    c = flops_per_sample / (peak_tflops(spec, scenario.model.dtype) * 1e12 * MFU)
    return t0, c


def gpu_step_s(scenario: Scenario, gpu_key: str, batch):
    """Catalog estimate t_g(b) of one GPU of type gpu_key (formula in the module docstring).

    batch may be a numpy array: the same float operations, elementwise (the sweep uses that)."""
    t0, c = gpu_step_coefficients(scenario, gpu_key)
    return t0 + c * batch


def node_intra_gbps(node: NodeConfig) -> float:
    """The node's intra-node link: its own `intra_node_gbps`, else its slowest GPU's catalog link."""
    if node.intra_node_gbps:
        return node.intra_node_gbps
    return min(get_gpu(key).intra_node_gbps for key in node.gpus)


def signature(node: NodeConfig) -> tuple:
    """What t_i(b) and the memory limit depend on: nodes alike in it share one timing's memo."""
    return (tuple(sorted(node.gpus.items())), node.step_time_s, node.profile, node.intra_node_gbps)


_PROFILE_CACHE: dict = {}


def _load_profile(path, seq_len, dtype, model):
    """A ProfileModel read once per file version (10,000 nodes may share one profile)."""
    from calibrate.profiles import ProfileModel

    try:
        st = os.stat(path)
        key = (str(path), st.st_mtime_ns, st.st_size, seq_len, dtype, model)
    except OSError:
        key = None
    if key is not None and key in _PROFILE_CACHE:
        return _PROFILE_CACHE[key]
    profile = ProfileModel.from_csv(path, seq_len=seq_len, dtype=dtype, model=model)
    if key is not None:
        if len(_PROFILE_CACHE) > 256:
            _PROFILE_CACHE.clear()
        _PROFILE_CACHE[key] = profile
    return profile


def intra_node_allreduce_s(scenario: Scenario, node: NodeConfig) -> float:
    k = node.gpu_count
    if k == 1:
        return 0.0
    grad_bytes = GRAD_BYTES_PER_PARAM * scenario.model.param_count
    measured = scenario.network_model.ring if scenario.network_model is not None else None
    if measured is not None and set(node.gpus) == {"cpu"}:
        # CPU devices are processes of one machine: their gradient all-reduce is the one measured.
        return measured.all_reduce_s(k, grad_bytes)
    gbps = node_intra_gbps(node)
    return 2 * (k - 1) / k * grad_bytes * 8 / (gbps * 1e9)


@dataclass(frozen=True)
class NodeTiming:
    """t_i(b) and the memory limit of one node, from its scenario entry."""

    scenario: Scenario
    node: NodeConfig
    index: int | None = None  # the node's position (errors name nodes[index]); found if not given
    # Memo of step times, fits and profiles, shared by the nodes of one `signature`.
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def position(self) -> int:
        if self.index is None:
            object.__setattr__(self, "index", next(i for i, n in enumerate(self.scenario.nodes) if n is self.node))
        return self.index

    @property
    def profiles(self) -> tuple:
        if "profiles" not in self.memo:
            self.memo["profiles"] = self._read_profiles()
        return self.memo["profiles"]

    def _read_profiles(self) -> tuple:
        from formats.profile import ProfileError  # pandas: only when profiles are used

        models = []
        index = self.position
        preset = self.scenario.model.preset
        for path in self.node.profile or ():
            try:
                profile = _load_profile(
                    self.scenario.resolve_path(path), seq_len=self.scenario.model.seq_len,
                    dtype=self.scenario.model.dtype,
                    model=None if preset is None or preset.endswith(".json") else preset)
            except ProfileError as exc:
                raise FieldError(f"nodes[{index}].profile", str(exc)) from None
            if profile.gpu_key and profile.gpu_key not in self.node.gpus:
                raise FieldError(f"nodes[{index}].profile", f"{path}: measured on {profile.gpu_key!r}; "
                                 f"expected one of this node's GPUs ({', '.join(self.node.gpus)})")
            models.append(profile)
        return tuple(models)

    @property
    def source(self) -> str:
        if self.node.step_time_s is not None:
            return "given"
        return "profile" if self.node.profile else "catalog"

    def estimate_s(self, batch: int) -> float:
        """Catalog estimate for the whole node: slowest GPU plus the intra-node all-reduce."""
        slowest = max(gpu_step_s(self.scenario, key, batch) for key in self.node.gpus)
        return slowest + intra_node_allreduce_s(self.scenario, self.node)

    @property
    def _base_estimate_s(self) -> float:
        """The estimate at the baseline batch, which anchors a given step_time_s (asked for every batch)."""
        if "base_estimate" not in self.memo:
            self.memo["base_estimate"] = self.estimate_s(self.scenario.training.batch_size)
        return self.memo["base_estimate"]

    def step_s(self, batch: int) -> float:
        """t_i(b) in seconds, by docs/DESIGN.md's precedence: given constant, profile, catalog."""
        steps = self.memo.setdefault("step_s", {})
        if batch not in steps:
            steps[batch] = self._step_s(batch)
        return steps[batch]

    def _step_s(self, batch: int) -> float:
        if self.node.step_time_s is not None:
            base = self.scenario.training.batch_size
            if batch == base:  # exactly as given, not through a ratio that rounds
                return self.node.step_time_s
            return self.node.step_time_s * self.estimate_s(batch) / self._base_estimate_s
        if self.profiles:
            measured = max(p.step_s(batch) for p in self.profiles)
            return measured + intra_node_allreduce_s(self.scenario, self.node)
        return self.estimate_s(batch)

    def fits(self, batch: int) -> bool:
        """Whether batch b fits on every GPU of the node: profiles where measured, else the memory model."""
        fits = self.memo.setdefault("fits", {})
        if batch not in fits:
            fits[batch] = self.memory_problem(batch) is None
        return fits[batch]

    def memory_problem(self, batch: int) -> str | None:
        """None if batch b fits; else why not, naming the GPU and the memory needed and available."""
        if self.profiles:
            for p in self.profiles:
                if p.fits(batch):
                    continue
                what = p.gpu_key or p.device_name
                if p.oom_batches and batch >= p.oom_batches[0]:
                    return (f"{what}: batch {batch} does not fit (profile {p.source} ran out of memory "
                            f"at batch {p.oom_batches[0]})")
                return (f"{what}: batch {batch} needs {p.peak_mem_bytes(batch) / GIB:.1f} GiB, "
                        f"the device has {p.mem_total_bytes / GIB:.1f} GiB (profile {p.source})")
            return None
        need = memory_need_bytes(self.scenario, batch)
        for key in self.node.gpus:
            have = get_gpu(key).memory_bytes
            if need > have:
                return f"{key}: batch {batch} needs {need / GIB:.1f} GiB, the GPU has {have / GIB:.1f} GiB"
        return None

    def max_batch(self, limit: int = MAX_SEARCH_BATCH) -> int:
        """The largest batch that fits (searched up to `limit`); 0 if not even batch 1 fits."""
        key = ("max_batch", limit)
        if key not in self.memo:
            self.memo[key] = self._max_batch(limit)
        return self.memo[key]

    def _max_batch(self, limit: int) -> int:
        lo, hi = 0, 1
        while hi <= limit and self.fits(hi):
            lo, hi = hi, hi * 2
        if hi > limit:
            if self.fits(limit):
                return limit
            hi = limit
        while hi - lo > 1:  # fits(lo) and not fits(hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.fits(mid) else (lo, mid)
        return lo


def node_timings(scenario: Scenario) -> list[NodeTiming]:
    """One NodeTiming per node, in order; nodes of one `signature` share a memo (linear in nodes)."""
    memos: dict = {}
    return [NodeTiming(scenario, node, i, memos.setdefault(signature(node), {}))
            for i, node in enumerate(scenario.nodes)]
