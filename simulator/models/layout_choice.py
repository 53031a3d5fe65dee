"""Which memory layout a node runs under, and why a batch does not fit under one.

A node's layout (simulator/models/memory.py's Layout: sharding and recomputation) is its own or
[training]'s choice; "auto" resolves to the first of memory.LAYOUT_ORDER that holds the baseline
batch. A profiled node was measured unsharded without recomputation, so that is its only layout.
"""
from __future__ import annotations

from facts.catalog import get_gpu
from formats.errors import FieldError
from simulator.models.memory import GIB, LAYOUT_ORDER, Layout, memory_need_bytes, reserve_bytes
from simulator.scenario import NodeConfig, Scenario


def describe(layout: Layout) -> str:
    """' (fsdp over 4 devices, recomputation)' for an error message; '' unsharded, no recomputation."""
    parts = ([f"{layout.sharding} over {layout.devices} device{'s' if layout.devices > 1 else ''}"]
             if layout.sharded else []) + (["full recomputation"] if layout.checkpointing == "full" else [])
    return f" ({', '.join(parts)})" if parts else ""


def memory_problem(scenario: Scenario, node: NodeConfig, batch: int, layout: Layout) -> str | None:
    """None if `batch` fits every GPU of the node under `layout` (the memory model); else why not."""
    need = memory_need_bytes(scenario, batch, layout)
    for key in node.gpus:
        memory = get_gpu(key).memory_bytes
        have = memory - reserve_bytes(memory)
        if need > have:
            return (f"{key}: batch {batch} needs {need / GIB:.1f} GiB{describe(layout)}, "
                    f"the GPU gives a step {have / GIB:.1f} GiB of its {memory / GIB:.1f}")
    return None


def candidate_layouts(scenario: Scenario, node: NodeConfig, position: int, profiled: bool) -> list[Layout]:
    """The layouts the node's configuration allows, in LAYOUT_ORDER."""
    training = scenario.training
    sharding = node.sharding or training.sharding
    checkpointing = node.activation_checkpointing or training.activation_checkpointing
    outer = scenario.diloco.outer_state
    g = node.gpu_count
    if profiled:  # measured unsharded, without recomputation: nothing else to plan from
        for key, value in (("sharding", sharding), ("activation_checkpointing", checkpointing)):
            if value not in ("auto", "none"):
                raise FieldError(f"nodes[{position}].{key}", f"{value}: this node's profiles were measured "
                                 "with none; expected none or auto (or no profile)")
        return [Layout("none", "none", g, outer)]
    return [Layout(s, c, g, outer) for s, c in LAYOUT_ORDER
            if sharding in ("auto", s) and checkpointing in ("auto", c)
            and not (sharding == "auto" and g == 1 and s != "none")]  # one device: nothing to shard over


def choose_layout(scenario: Scenario, node: NodeConfig, position: int, profiled: bool) -> Layout:
    """The first candidate that holds the baseline batch; if none does, the one that holds the most
    (so that the refusal names the largest batch this node can take), else the last candidate."""
    candidates = candidate_layouts(scenario, node, position, profiled)
    if len(candidates) == 1:  # nothing to choose (and a profiled node's memory is its profiles')
        return candidates[0]
    baseline = scenario.training.batch_size
    for layout in candidates:
        if memory_problem(scenario, node, baseline, layout) is None:
            return layout
    largest = [largest_fitting(scenario, node, layout, baseline) for layout in candidates]
    return candidates[largest.index(max(largest))] if max(largest) else candidates[-1]


def largest_fitting(scenario: Scenario, node: NodeConfig, layout: Layout, above: int) -> int:
    """The largest batch below `above` (which does not fit) that `layout` holds; 0 if none."""
    lo, hi = 0, above
    while hi - lo > 1:
        mid = (lo + hi) // 2
        fits = memory_problem(scenario, node, mid, layout) is None
        lo, hi = (mid, hi) if fits else (lo, mid)
    return lo
