"""Per-node step-time models t_i(b) and memory limits: catalog estimate, given constant, profile.

Catalog estimate (affine, per GPU type g, per-GPU batch b, floored by the host's dispatch of an
eager step's ops: host_g is 0 for a compiled step), `simulator.models.estimate`:

    t_g(b) = max(t0_g + c_g · b, host_g)

t0 is the per-step cost that does not grow with the batch: the optimizer's memory traffic
(unscaling, clipping and the foreach AdamW update, OPTIMIZER_BYTES_PER_PARAM, counted), the
weights' per-step traffic (autocast cast, GEMM reads, fp32 gradient accumulation) and kernel
launches. c is the per-sample cost: the matmul FLOPs at the GPU's measured maximum achievable
matmul rate, attention at FlashAttention-2's published efficiency, and the activations' memory
traffic at the GPU's bandwidth (`simulator.models.estimate`'s docstring has the terms and sources; the
peak is `facts.catalog.peak_tflops`: FP16 with FP32 accumulate on GeForce cards, not the
datasheet headline).

A node with several GPUs runs data-parallel inside: each step waits for its slowest GPU and
then all-reduces fp32 gradients over the intra-node link (ring, not overlapped with backward:
a conservative choice):

    t_node(b) = max_g t_g(b) + 2(k−1)/k · 4N bytes / intra_node_bandwidth      (k GPUs)

The intra-node link is the node's `intra_node_gbps` if given, else the slowest of its GPUs'
catalog `intra_node_gbps` (NVLink for SXM parts, PCIe for the rest).

That is the unsharded node. Under a sharded layout or recomputation (simulator/models/memory.py's
Layout, chosen per node by `NodeTiming.layout`) t0's optimizer work is per shard (N/G), c grows
by a third (one more forward, `simulator.models.estimate`) under full recomputation, and the collectives
are `intra_node_comm_s`'s: the all-reduce's volume after backward for zero1/zero2, and for fsdp two
all-gathers and a reduce-scatter run behind the compute, which they slow
(`simulator.models.estimate.overlapped_s`), except the first unit's gather and the last's reduce-scatter:
t_opt + overlapped(t_w + c·b, comm) + exposed.

Precedence (docs/DESIGN.md): a node's `step_time_s` is its time at the scenario's baseline batch;
other batches follow the catalog estimate's shape scaled to it,
t(b) = step_time_s · est(b) / est(b_base). A `profile` replaces the per-GPU estimate with
measured t(b) (exact at measured batches, interpolated between, fitted beyond).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from facts.catalog import get_gpu
from facts.stacks import FITTED_STACKS, GEODT, act_bytes_scale
from formats.errors import FieldError
from formats.scenario import compiled_step
from formats.wire import ring_allreduce_s
from simulator.models.estimate import OPTIMIZER_BYTES_PER_PARAM, Shape, StepEstimate, estimate_step, fsdp_payload_bytes  # noqa: F401  (re-exported)
from simulator.models.layout_choice import choose_layout, memory_problem
from simulator.models.memory import GIB, UNSHARDED, Layout, fsdp_unit_params
from simulator.scenario import NodeConfig, Scenario

GRAD_BYTES_PER_PARAM = 4
DEFAULT_INTRA_NODE_GBPS = 100.0  # PCIe 3.0 x16 through the host, effective (the catalog's PCIe figure)
# The largest batch any search tries: far above what a GPU holds of any preset, and it keeps
# every search bounded when nothing (no OOM row, no memory figure) bounds the batch.
MAX_SEARCH_BATCH = 1 << 16
# Training FLOPs are forward + backward = 1 + 2 forwards; full recomputation adds one forward.


def compiled(scenario: Scenario, gpu_key: str) -> bool:
    """Whether the step runs compiled on a device of type gpu_key ([training] compile; "auto" = on
    for GPUs, off for the catalog's `cpu`): the estimate prices the lean step if so, else the eager."""
    return compiled_step(scenario.training.compile, gpu_key != "cpu")


def priced_stack(scenario: Scenario, gpu_key: str) -> str:
    """The stack the catalog prices on a device of type gpu_key ([training] stack, facts/stacks.py):
    a fitted stack on GPUs; geodt's own step otherwise, "geodt-compiled" or "geodt-eager" (`compiled`)."""
    stack = scenario.training.stack
    if stack != GEODT and gpu_key != "cpu":
        return stack
    return "geodt-compiled" if compiled(scenario, gpu_key) else "geodt-eager"


def gpu_estimate(scenario: Scenario, gpu_key: str, layout: Layout = UNSHARDED, comm_s: float = 0.0) -> StepEstimate:
    """The catalog estimate of one GPU of type gpu_key under a layout (`simulator.models.estimate`), of the
    stack priced there (`priced_stack`): geodt's lean step when compiled, else its eager step; a
    fitted stack (facts/stacks.py) as the lean step with its act_bytes_scale.

    A preset or config.json gives the model's shape; a bare `params` model has none (its work is
    `flops_per_token`, else 6·params, at the matmul rate). A given `flops_per_token` replaces the
    shape's matmul and attention FLOPs. Sharded (zero1/zero2/fsdp): each device clips and steps
    AdamW on its 1/G of the parameters. Full recomputation: one more forward. comm_s: the
    collectives that run behind the compute (fsdp)."""
    model = scenario.model
    shape = Shape.of(model.arch) if model.arch is not None else None
    stack = priced_stack(scenario, gpu_key)
    return estimate_step(gpu_key, model.dtype, model.seq_len, shape=shape, params=model.param_count,
                         flops_per_token=model.flops_per_token, recompute=layout.checkpointing,
                         optimizer_shards=layout.devices if layout.sharded else 1,
                         fsdp=layout.sharding == "fsdp", comm_s=comm_s,
                         step="eager" if stack == "geodt-eager" else "lean",
                         act_bytes_scale=act_bytes_scale(stack) if stack in FITTED_STACKS else 1.0)


def gpu_step_s(scenario: Scenario, gpu_key: str, batch, layout: Layout = UNSHARDED):
    """Catalog estimate t_g(b) of one GPU of type gpu_key (formula in the module docstring).

    batch may be a numpy array: the same float operations, elementwise (the sweep uses that)."""
    return gpu_estimate(scenario, gpu_key, layout).step_s(batch)


def node_intra_gbps(node: NodeConfig) -> float:
    """The node's intra-node link: its own `intra_node_gbps`, else its slowest GPU's catalog link."""
    if node.intra_node_gbps:
        return node.intra_node_gbps
    return min(get_gpu(key).intra_node_gbps for key in node.gpus)


def catalog_signature(node: NodeConfig) -> tuple:
    """What the catalog estimate, layout, profiles and memory limit depend on: nodes alike in it share
    them, whatever step_time_s they were given (20,000 nodes of distinct measured step times estimate once)."""
    return (tuple(sorted(node.gpus.items())), node.profile, node.intra_node_gbps, node.sharding,
            node.activation_checkpointing)


def signature(node: NodeConfig) -> tuple:
    """What t_i(b) and the memory limit depend on: nodes alike in it share one timing's memo."""
    return (*catalog_signature(node), node.step_time_s)


_PROFILE_CACHE: dict = {}


def _load_profile(path, seq_len, dtype, model, compiled=None):
    """A ProfileModel read once per file version (10,000 nodes may share one profile)."""
    # deferred: a profile's fit (pandas) only when a node names a profile
    from simulator.models.profile_fit import ProfileModel  # noqa: PLC0415

    try:
        st = os.stat(path)
        key = (str(path), st.st_mtime_ns, st.st_size, seq_len, dtype, model, compiled)
    except OSError:
        key = None
    if key is not None and key in _PROFILE_CACHE:
        return _PROFILE_CACHE[key]
    profile = ProfileModel.from_csv(path, seq_len=seq_len, dtype=dtype, model=model, compiled=compiled)
    if key is not None:
        if len(_PROFILE_CACHE) > 256:
            _PROFILE_CACHE.clear()
        _PROFILE_CACHE[key] = profile
    return profile


def intra_node_allreduce_s(scenario: Scenario, node: NodeConfig) -> float:
    """The unsharded node's per-step all-reduce of fp32 gradients."""
    return intra_node_ring_s(scenario, node, GRAD_BYTES_PER_PARAM * scenario.model.param_count)


def intra_node_ring_s(scenario: Scenario, node: NodeConfig, payload_bytes: float) -> float:
    """A ring all-reduce of payload_bytes among the node's devices (a reduce-scatter plus an
    all-gather, each (k−1)/k of the payload per device): measured for CPU devices, else over the link."""
    k = node.gpu_count
    if k == 1:
        return 0.0
    measured = scenario.network_model.ring if scenario.network_model is not None else None
    if measured is not None and set(node.gpus) == {"cpu"}:
        # CPU devices are processes of one machine: their collectives are the ones measured.
        return measured.all_reduce_s(k, payload_bytes)
    return ring_allreduce_s(k, 0.0, payload_bytes, node_intra_gbps(node))


def fsdp_gather_bytes(scenario: Scenario) -> int:
    """Bytes per parameter FSDP2 gathers: the compute dtype (MixedPrecisionPolicy, memory.py)."""
    return 2 if scenario.model.dtype in ("bf16", "fp16") else 4


def intra_node_comm_s(scenario: Scenario, node: NodeConfig, layout: Layout) -> tuple[float, float]:
    """(collective seconds per step, the part of it no compute hides) of a node's layout.

    none: the fp32 gradient all-reduce, after backward (not overlapped: a conservative choice
    kept from before sharding). zero1/zero2: a reduce-scatter of fp32 gradients and an all-gather
    of the updated fp32 parameters, the all-reduce's volume (ZeRO §7: Pos and Pos+g move what
    DDP moves), likewise not overlapped. fsdp: all-gather of the parameters in forward and again
    in backward (p bytes each) and a reduce-scatter of fp32 gradients (`fsdp_payload_bytes`);
    FSDP2 prefetches the next unit's gather during this unit's compute and reduce-scatters
    behind the backward, so only the first unit's gather and the last unit's reduce-scatter are
    exposed: the node takes overlapped(compute, collectives) + exposed (`NodeTiming.estimate_s`)."""
    n = scenario.model.param_count
    if layout.sharding != "fsdp":
        return intra_node_allreduce_s(scenario, node), 0.0
    p = fsdp_gather_bytes(scenario)
    total = intra_node_ring_s(scenario, node, fsdp_payload_bytes(n, p))
    arch = scenario.model.arch
    if arch is None:
        return total, 0.0
    exposed = intra_node_ring_s(scenario, node, fsdp_payload_bytes(fsdp_unit_params(arch), p, 1))
    return total, exposed


def read_profiles(scenario: Scenario, node: NodeConfig, index: int) -> tuple:
    """The node's measured profiles, each checked against the scenario (model, GPU, compile)."""
    # deferred: a profile's fit (pandas) only when a node names a profile
    from formats.profile import ProfileError  # noqa: PLC0415

    models = []
    preset = scenario.model.preset
    for path in node.profile or ():
        try:
            profile = _load_profile(
                scenario.resolve_path(path), seq_len=scenario.model.seq_len,
                dtype=scenario.model.dtype,
                model=None if preset is None or preset.endswith(".json") else preset)
        except ProfileError as exc:
            raise FieldError(f"nodes[{index}].profile", str(exc)) from None
        if profile.gpu_key and profile.gpu_key not in node.gpus:
            raise FieldError(f"nodes[{index}].profile", f"{path}: measured on {profile.gpu_key!r}; "
                             f"expected one of this node's GPUs ({', '.join(node.gpus)})")
        # An explicit training.compile must match what the profile measured; "auto" takes the
        # profile's step (profiles from before the option are eager: set compile = "off" to run so).
        want = compiled(scenario, profile.gpu_key or next(iter(node.gpus)))
        if profile.compiled != want and scenario.training.compile != "auto":
            raise FieldError(f"nodes[{index}].profile", f"{path}: column 'compiled': measured "
                             f"{'with' if profile.compiled else 'without'} torch.compile; training.compile = "
                             f"{scenario.training.compile!r} runs it {'compiled' if want else 'eager'} here "
                             f"(expected training.compile = {'on' if profile.compiled else 'off'}, or recalibrate)")
        models.append(profile)
    return tuple(models)


@dataclass(frozen=True)
class NodeTiming:
    """t_i(b) and the memory limit of one node, from its scenario entry."""

    scenario: Scenario
    node: NodeConfig
    index: int | None = None  # the node's position (errors name nodes[index]); found if not given
    # Memo of step times, shared by the nodes of one `signature`.
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    # Memo of what a given step_time_s does not change (estimates, layout, fits, profiles), shared by the
    # nodes of one `catalog_signature`: 20,000 nodes of distinct measured step times estimate once.
    shared: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def position(self) -> int:
        if self.index is None:
            object.__setattr__(self, "index", next(i for i, n in enumerate(self.scenario.nodes) if n is self.node))
        return self.index

    @property
    def profiles(self) -> tuple:
        if "profiles" not in self.shared:
            self.shared["profiles"] = read_profiles(self.scenario, self.node, self.position)
        return self.shared["profiles"]

    @property
    def startup_s(self) -> float:
        """The node's one-time startup (simulator/models/wallclock.py): its profiles' largest measured
        warm-up cost beyond steady steps; 0 without profiles."""
        return max((p.startup_s for p in self.profiles), default=0.0)

    @property
    def startup_measured(self) -> bool:
        """Whether every profile of the node measured its warm-up (and the node has profiles)."""
        return bool(self.profiles) and all(p.warmup_measured for p in self.profiles)

    @property
    def source(self) -> str:
        """Where t_i(b) comes from (facts/bands.py STEP_SOURCES): a given step_time_s is measured."""
        if self.node.step_time_s is not None:
            return "measured"
        return "profile" if self.node.profile else "catalog"

    @property
    def layout(self) -> Layout:
        """The node's memory layout: its own or [training]'s sharding and recomputation, "auto"
        resolved to the first of memory.LAYOUT_ORDER that holds the baseline batch (else batch 1;
        else the last candidate, whose problem check_batch_one reports)."""
        if "layout" not in self.shared:
            self.shared["layout"] = choose_layout(self.scenario, self.node, self.position, bool(self.profiles))
        return self.shared["layout"]

    def estimate_s(self, batch: int) -> float:
        """Catalog estimate for the whole node under its layout: slowest GPU, intra-node collectives."""
        layout = self.layout
        comm_s, exposed_s = intra_node_comm_s(self.scenario, self.node, layout)
        if layout.sharding != "fsdp":
            slowest = max(gpu_step_s(self.scenario, key, batch, layout) for key in self.node.gpus)
            return slowest + comm_s
        slowest = max(gpu_estimate(self.scenario, key, layout, comm_s).step_s(batch) for key in self.node.gpus)
        return slowest + exposed_s

    @property
    def intra_s(self) -> float:
        """Per-step seconds of the node's collectives not hidden behind compute (workload's jitter)."""
        comm_s, exposed_s = intra_node_comm_s(self.scenario, self.node, self.layout)
        return exposed_s if self.layout.sharding == "fsdp" else comm_s

    def _estimate_at(self, batch: int) -> float:
        """estimate_s(batch) of a whole batch, computed once per `catalog_signature`."""
        estimates = self.shared.setdefault("estimate_s", {})
        if batch not in estimates:
            estimates[batch] = self.estimate_s(batch)
        return estimates[batch]

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
            return self.node.step_time_s * self._estimate_at(batch) / self._estimate_at(base)
        if self.profiles:
            measured = max(p.step_s(batch) for p in self.profiles)
            return measured + intra_node_allreduce_s(self.scenario, self.node)
        return self._estimate_at(batch)

    def fits(self, batch: int) -> bool:
        """Whether batch b fits on every GPU of the node: profiles where measured, else the memory model."""
        fits = self.shared.setdefault("fits", {})
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
        return memory_problem(self.scenario, self.node, batch, self.layout)

    def max_batch(self, limit: int = MAX_SEARCH_BATCH) -> int:
        """The largest batch that fits (searched up to `limit`); 0 if not even batch 1 fits."""
        key = ("max_batch", limit)
        if key not in self.shared:
            self.shared[key] = self._max_batch(limit)
        return self.shared[key]

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
    """One NodeTiming per node, in order; nodes of one `signature` share a memo, of one `catalog_signature`
    its estimates (linear in nodes)."""
    memos: dict = {}
    shares: dict = {}
    timings = []
    for i, node in enumerate(scenario.nodes):
        alike = catalog_signature(node)
        timings.append(NodeTiming(scenario, node, i, memos.setdefault((*alike, node.step_time_s), {}),
                                  shares.setdefault(alike, {})))
    return timings
