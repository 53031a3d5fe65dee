"""Where a simulation's figures come from and how far off they may be: per node its step source,
the network's source, and each strategy's error band (facts/bands.py, from geodt's validation record).

summary.csv gains `step_source` (measured | profile | catalog, simulator/models/timing.py's precedence),
`network_source` (calibrated: a network profile with measured all-reduces; assumed: the
scenario's typed links) and `error_band_pct` (the strategy's band, the same on each of its rows:
its round time, tokens/s and time to a target may be off by that much, going by the record).
"""
from __future__ import annotations

import pandas as pd

from facts.bands import describe, load_bands, round_band_pct
from facts.stacks import FITTED_STACKS, STACK_LABELS, band_source
from formats.timeline import PROVENANCE_COLUMNS
from simulator.models.timing import node_timings, priced_stack
from simulator.scenario import Scenario


def step_sources(scenario: Scenario) -> dict[str, str]:
    """Node name -> where its step time comes from."""
    return {t.node.name: t.source for t in node_timings(scenario)}


def network_source(scenario: Scenario) -> str:
    """calibrated if a network profile measured the all-reduce (loopback ring or shaped links), else assumed."""
    model = scenario.network_model
    return "calibrated" if model is not None and (model.ring is not None or model.shaped) else "assumed"


# facts/error_bands.csv's source of each priced stack (simulator/models/timing.py priced_stack).
_GEODT_BANDS = {"geodt-compiled": "catalog-compiled", "geodt-eager": "catalog-eager"}


def _band_of(stack: str) -> str:
    return _GEODT_BANDS.get(stack) or band_source(stack)


def band_sources(scenario: Scenario) -> dict[str, str]:
    """Node name -> the source its band is looked up by: a catalog node's is that of the stack it
    prices (the widest where its devices' stacks differ)."""
    bands, out = load_bands(), {}
    for t in node_timings(scenario):
        if t.source != "catalog":
            out[t.node.name] = t.source
            continue
        sources = {_band_of(priced_stack(scenario, key)) for key in t.node.gpus}
        out[t.node.name] = max(sorted(sources), key=lambda s: bands["step", s].band_pct)
    return out


def catalog_stack(scenario: Scenario) -> str:
    """The stacks the catalog estimate prices on the scenario's catalog nodes ([training] stack and
    compile: simulator/models/timing.py priced_stack): geodt's eager step, its compiled one, or both, and
    a fitted stack by its name (facts/stacks.py STACK_LABELS)."""
    kinds = {priced_stack(scenario, key)
             for t in node_timings(scenario) if t.source == "catalog" for key in t.node.gpus}
    geodt = [name for name in ("eager", "compiled") if f"geodt-{name}" in kinds]
    names = [f"geodt's {' and '.join(geodt)} step{'s' if len(geodt) > 1 else ''}"] if geodt else []
    return " and ".join(names + [STACK_LABELS[s] for s in FITTED_STACKS if s in kinds])


def sources_text(scenario: Scenario, step_sources_of_nodes: list[str]) -> str:
    """The sources of one prediction in words (facts/bands.py describe), naming the catalog's stack."""
    return describe(step_sources_of_nodes, network_source(scenario), catalog_stack(scenario))


def with_provenance(summ: pd.DataFrame, scenario: Scenario) -> pd.DataFrame:
    """summary.csv's rows of one strategy with step_source, network_source and error_band_pct."""
    steps = summ["node"].map(step_sources(scenario))
    network = network_source(scenario)
    band = round_band_pct(list(zip(summ["node"].map(band_sources(scenario)), summ["compute_s"], summ["comm_s"])),
                          network)
    return summ.assign(**dict(zip(PROVENANCE_COLUMNS, (steps, network, round(band, 1)))))


def band_note(scenario: Scenario, summaries: list[pd.DataFrame]) -> str:
    """The printed line that says what the answer's bands rest on."""
    frame = pd.concat(summaries, ignore_index=True)
    return (f"band: ± the largest error geodt's own record shows for these sources "
            f"({sources_text(scenario, list(frame['step_source']))}; facts/error_bands.csv, "
            "benchmarks/bench_bands.py)")
