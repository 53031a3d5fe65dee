"""How a sweep's node kinds are laid out in memory, and the refusal when a GPU type fits no layout.

A sweep node is planned as `geodt plan` plans it: one `NodeTiming` over the node (its layout
chosen by simulator/models/layout_choice.py from the base scenario's [training] sharding and
recomputation, "auto" included), so the sweep shards exactly the nodes plan shards. Kinds with
the same GPU types (and so the same GPU count) share one timing: the layout, largest batch and
intra-node collectives depend on nothing else.
"""
from __future__ import annotations

from dataclasses import replace

from formats.errors import InputError
from simulator.models.timing import NodeTiming
from simulator.scenario import NodeConfig, Scenario

MAX_SUGGESTED_GPUS = 64  # sweep_cli's MAX_GPUS_PER_NODE: a suggestion must be one the sweep accepts


def kind_node(kind, name: str) -> NodeConfig:
    """A sweep node of this kind ((gpu key, count), ...): its layout left to [training], as plan leaves it."""
    return NodeConfig(name=name, gpus=dict(kind))


def kind_timing(base: Scenario, kind) -> NodeTiming:
    node = kind_node(kind, "x")
    return NodeTiming(replace(base, nodes=(node,)), node, 0)


def unfit_types(base: Scenario, types, gpus: int) -> dict[str, str]:
    """{GPU type: why} for the types whose node of `gpus` such GPUs cannot hold the base batch under any layout."""
    b = base.training.batch_size
    problems = {key: kind_timing(base, ((key, gpus),)).memory_problem(b) for key in types}
    return {key: why for key, why in problems.items() if why is not None}


def check_kinds_fit(base: Scenario, types, gpus: int) -> None:
    """Refuse, in one line naming every failing type, a sweep some of whose GPU types hold no batch-b node."""
    bad = unfit_types(base, types, gpus)
    if not bad:
        return
    b = base.training.batch_size
    fixes = []
    kept = [key for key in types if key not in bad]
    if kept:
        fixes.append(f"leave them out (--gpu-types {','.join(kept)})")
    more = next((g for g in _more_gpus(gpus) if not unfit_types(base, bad, g)), None)
    if more is not None:
        fixes.append(f"shard over more GPUs per node (--gpus-per-node {more})")
    smaller = _largest_batch(base, types, gpus)
    if smaller:
        fixes.append(f"a smaller batch (--set training.batch_size={smaller})")
    first = next(iter(bad.values()))
    raise InputError(f"--gpu-types {','.join(bad)}: {len(bad)} of {len(types)} GPU types cannot hold the base "
                     f"scenario's batch {b} in any memory layout over {gpus} GPU{'s' if gpus > 1 else ''} (e.g. "
                     f"{first}); expected types that hold it: " + ("; or ".join(fixes) or "a smaller model"))


def _more_gpus(gpus: int):
    g = gpus * 2
    while g <= MAX_SUGGESTED_GPUS:
        yield g
        g *= 2


def _largest_batch(base: Scenario, types, gpus: int) -> int:
    """The largest batch below the base's that every type's node holds (its layout chosen for that batch); 0 if none."""
    def fits(batch: int) -> bool:
        return not unfit_types(replace(base, training=replace(base.training, batch_size=batch)), types, gpus)

    lo, hi = 0, base.training.batch_size
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
