"""The comparison of a prediction with a real run: `geodt validate`'s table, figure and printout.

predicted_timeline: the simulator's timeline for a plan (with per-step jitter, the mean over
VARIABILITY_SAMPLES seeds); validation_table: per node, predicted against measured idle, sync and
round time (validation.csv, docs/DESIGN.md); plot_validation: validation.png; report: write,
plot and print them. Shared by `geodt validate` (geodt/run_cmd.py), which runs the plan, and
`geodt validate --trace` (geodt/validate_trace.py), which reads a finished run.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from facts.bands import round_band_pct
from facts.fidelity import IDLE_WORST, ROUND_MEDIAN, judge, node_verdict
from formats.timeline import (
    HOST_VALIDATION_COLUMNS,
    LOSS_VALIDATION_COLUMNS,
    MODES,
    STALENESS_VALIDATION_COLUMNS,
    VALIDATION_COLUMNS,
)
from simulator.engines.engine import simulate
from simulator.models.convergence import time_to_target
from simulator.models.loss_prediction import format_time, measured, plan_rounds, predict
from simulator.models.network import outer_step_source
from simulator.models.provenance import band_sources, network_source, sources_text, step_sources
from simulator.models.wallclock import measured_wall_s, predicted_wall_clock
from simulator.models.workload import node_cvs
from simulator.outputs.outputs import save_figure, write_csv
from simulator.outputs.perfetto import validation_trace, write_trace_json
from train.hoststat import say

NO_LOSS_COMPARISON = ("loss: not compared (the loss model has no curve of this model on this run's corpus: "
                      "geodt calibrate convergence, --data)")

VARIABILITY_SAMPLES = 32


def predicted_timeline(scenario, plan, engine: str):
    """The simulator's timeline; with per-step jitter on, the mean over VARIABILITY_SAMPLES seeds.

    One measured run is one draw of the step times, but the prediction to compare it with is
    the expectation: with jitter the slowest node varies from round to round, which adds idle
    on average that a single seeded draw over or under-states."""
    timeline = simulate(scenario, plan, engine=engine)
    if not any(node_cvs(scenario, plan)):
        return timeline
    numeric = ["compute_s", "idle_s", "comm_s", "round_start_s", "round_end_s", "tokens",
               *[c for c in ("staleness", "stale_work") if c in timeline]]  # an async plan's vary with the draw
    timeline[numeric] = timeline[numeric].astype(float)  # an adaptive plan's tokens: the mean over the draws
    total = timeline[numeric].to_numpy(copy=True)
    for k in range(1, VARIABILITY_SAMPLES):
        total += simulate(replace(scenario, seed=scenario.seed + k), plan, engine=engine)[numeric].to_numpy()
    timeline[numeric] = total / VARIABILITY_SAMPLES
    return timeline


def validation_table(timeline, trace, time_scale: float, emulated: bool = False, network: str = "loopback",
                     wall=None):
    """Per node, totals over rounds: predicted (timeline) against measured (trace) idle and round time.

    Measured times are divided by time_scale so that both are in the scenario's seconds.
    error_pct_of_round = 100 × (measured idle − predicted idle) / predicted round time;
    comm_error_pct = 100 × (measured sync − predicted sync) / predicted sync (NaN where no sync
    is predicted). Both are signed, so a bias shows.
    network: what the run's processes talked over (real.wan.wan.network_note).
    wall: the predicted whole run (simulator.models.wallclock.WallClock), beside the measured one on every
    row (predicted_wall_s, measured_wall_s, wall_error_pct: the run's, the same for all nodes).
    """
    rounds = sorted(set(trace["round"]))
    pred = timeline[timeline["round"].isin(rounds)].copy()
    pred["round_s"] = pred["compute_s"] + pred["idle_s"] + pred["comm_s"]
    meas = trace.copy()
    for column in ("compute_s", "idle_s", "comm_s"):
        meas[column] = meas[column] / time_scale
    meas["round_s"] = meas["compute_s"] + meas["idle_s"] + meas["comm_s"]
    p = pred.groupby("node", sort=False)[["idle_s", "round_s", "compute_s", "comm_s", "tokens"]].sum()
    m = meas.groupby("node", sort=False)[["idle_s", "round_s", "compute_s", "comm_s", "overrun_steps", "tokens"]].sum()
    nodes = list(dict.fromkeys(timeline["node"]))
    measured_wall = measured_wall_s(trace, time_scale)
    predicted_wall = wall.wall_s if wall is not None else float("nan")
    rows = []
    for node in nodes:
        rows.append({
            "strategy": timeline["strategy"].iloc[0], "node": node,
            "predicted_idle_s": p.at[node, "idle_s"], "measured_idle_s": m.at[node, "idle_s"],
            "predicted_round_s": p.at[node, "round_s"], "measured_round_s": m.at[node, "round_s"],
            "error_pct_of_round": 100.0 * (m.at[node, "idle_s"] - p.at[node, "idle_s"]) / p.at[node, "round_s"],
            "predicted_comm_s": p.at[node, "comm_s"], "measured_comm_s": m.at[node, "comm_s"],
            "comm_error_pct": _pct(m.at[node, "comm_s"] - p.at[node, "comm_s"], p.at[node, "comm_s"]),
            "round_error_pct": _pct(m.at[node, "round_s"] - p.at[node, "round_s"], p.at[node, "round_s"]),
            "mode": MODES[emulated], "network": network,
            "predicted_compute_s": p.at[node, "compute_s"], "measured_compute_s": m.at[node, "compute_s"],
            "predicted_tokens": int(p.at[node, "tokens"]), "measured_tokens": int(m.at[node, "tokens"]),
            "predicted_wall_s": predicted_wall, "measured_wall_s": measured_wall,
            "wall_error_pct": (_pct(measured_wall - predicted_wall, predicted_wall) if wall is not None
                               else float("nan")),
            "overrun_steps": int(m.at[node, "overrun_steps"]),
        })
        row = rows[-1]
        row["verdict"] = node_verdict(row["round_error_pct"], row["error_pct_of_round"], row["comm_error_pct"],
                                      shaped_wan(network))
    # the loss model's columns, empty until report() compares the losses (loss_comparison)
    frame = pd.DataFrame(rows).assign(**{c: float("nan") for c in [*LOSS_VALIDATION_COLUMNS,
                                                                     *HOST_VALIDATION_COLUMNS]})
    if "staleness" in meas and "staleness" in pred:
        frame = frame.assign(**staleness_columns(pred, meas, nodes))
    return frame[VALIDATION_COLUMNS + [c for c in frame.columns if c not in VALIDATION_COLUMNS]]


def staleness_columns(pred, meas, nodes: list[str]) -> dict:
    """An async run's STALENESS_VALIDATION_COLUMNS: per node and over the run, the mean staleness of
    the merges, and the run's 90th percentile, predicted (timeline) and measured (trace)."""
    p, m = pred.groupby("node")["staleness"].mean(), meas.groupby("node")["staleness"].mean()
    return {"predicted_staleness_mean": [float(p[node]) for node in nodes],
            "measured_staleness_mean": [float(m[node]) for node in nodes],
            "predicted_run_staleness_mean": float(pred["staleness"].mean()),
            "measured_run_staleness_mean": float(meas["staleness"].mean()),
            "predicted_run_staleness_p90": float(pred["staleness"].quantile(0.9)),
            "measured_run_staleness_p90": float(meas["staleness"].quantile(0.9))}


def staleness_error_pct(table) -> float | None:
    """The run's mean-staleness error, % of the predicted mean; None without staleness (a barrier run)."""
    if "measured_run_staleness_mean" not in table:
        return None
    p, m = table["predicted_run_staleness_mean"].iloc[0], table["measured_run_staleness_mean"].iloc[0]
    return _pct(m - p, p)


def staleness_line(table) -> str:
    """Per node, predicted against measured mean staleness (global updates between pull and merge)."""
    nodes = ", ".join(f"{r.node} {r.predicted_staleness_mean:.2f}/{r.measured_staleness_mean:.2f}"
                      for r in table.itertuples())
    p, m = table["predicted_run_staleness_mean"].iloc[0], table["measured_run_staleness_mean"].iloc[0]
    p90 = f"{table['predicted_run_staleness_p90'].iloc[0]:.1f}/{table['measured_run_staleness_p90'].iloc[0]:.1f}"
    return (f"staleness (global updates applied between a node's pull and its merge), predicted/measured mean: "
            f"{nodes}; the run {p:.2f}/{m:.2f} ({_pct_text(m - p, p)}), p90 {p90}")


def wall_line(wall, measured_s: float, kind: str = MODES[False]) -> str:
    """The summary's wall-clock line: predicted (its parts) and the run's whole-run seconds, named by
    its kind (MODES: measured, or emulated: the padded schedule's)."""
    return (f"wall time: predicted {wall.wall_s:.2f} s (startup {wall.startup_s:.2f} s, rounds and checkpoints "
            f"between them {wall.rounds_s:.2f} s, last checkpoint {wall.last_checkpoint_s:.2f} s), {kind} "
            f"{measured_s:.2f} s ({_pct_text(measured_s - wall.wall_s, wall.wall_s)})"
            + (f"; {wall.note}" if wall.note else ""))


def shaped_wan(network: str) -> bool:
    """Whether the run's processes talked over a shaped WAN (real.wan.wan.network_note's words)."""
    return network.startswith("shaped")


def verdict_lines(table, emulated: bool, network: str) -> list[str]:
    """One line per fidelity goal (facts/fidelity.py): within, outside by how much, or not judged."""
    ttt = None
    if "measured_time_to_target_s" in table:
        p, m = table["predicted_time_to_target_s"].iloc[0], table["measured_time_to_target_s"].iloc[0]
        ttt = _pct(p - m, m) if np.isfinite(p) and np.isfinite(m) else None
    verdicts = judge(list(table["round_error_pct"]), list(table["error_pct_of_round"]),
                     list(table["comm_error_pct"]), shaped_wan(network), ttt, staleness_error_pct(table))
    kind = "schedule check (emulated)" if emulated else "measured run"
    return [f"verdict ({kind}): {v.line()}" for v in verdicts]


def compute_line(table) -> str | None:
    """The run's compute against its prediction, split into what every node shares (the median over nodes of
    measured over predicted compute: the machine's speed since the calibration) and each node apart from it
    (its profile against the others'), with what each says to do when it misses the goal it feeds: the round's
    for the shared part, the worst idle's for a node apart. None without compute on both sides."""
    ratio = (table["measured_compute_s"] / table["predicted_compute_s"]).where(table["predicted_compute_s"] > 0)
    ratio = ratio[np.isfinite(ratio) & (ratio > 0)]
    if ratio.empty:
        return None
    common = float(ratio.median())
    apart = ratio / common
    nodes = table["node"][ratio.index]
    far = (apart - 1).abs().idxmax()
    line = (f"compute, measured over predicted: {', '.join(f'{n} {r:.3f}' for n, r in zip(nodes, ratio))}; "
            f"median {common:.3f}× (what the nodes share), {nodes[far]} furthest from it ({apart[far]:.3f}×)")
    notes = []
    if abs(common - 1) * 100 > ROUND_MEDIAN.limit_pct:
        notes.append(f"the nodes ran {common:.2f}× their profiles (median): the profiles' speed, not the plan, is off; "
                     f"on a shared machine calibrate again right before the run (--passes 3; results/predict-the-run/)")
    if abs(apart[far] - 1) * 100 > IDLE_WORST.limit_pct:
        notes.append(f"{nodes[far]} ran {apart[far]:.3f}× the others against its profile: its idle error follows")
    return line + ("; " + "; ".join(notes) if notes else "")


def band_line(scenario, timeline, table) -> str:
    """The prediction's band (simulator/models/provenance.py: from the sources it was priced from) and
    whether the measured round of every node fell inside it."""
    sources, keys, network = step_sources(scenario), band_sources(scenario), network_source(scenario)
    per_node = timeline.groupby("node", sort=False)[["compute_s", "comm_s"]].sum()
    band = round_band_pct([(keys[n], r.compute_s, r.comm_s) for n, r in per_node.iterrows()], network)
    worst = float(table["round_error_pct"].abs().max())
    where = "inside" if worst <= band else f"outside by {worst - band:.1f} points"
    return (f"band: the prediction's round time ± {band:.1f}% ({sources_text(scenario, list(sources.values()))}); "
            f"measured round off by at most {worst:.1f}%: {where}")


def _pct(difference: float, reference: float) -> float:
    return 100.0 * difference / reference if reference > 0 else float("nan")


def _pct_text(difference: float, reference: float) -> str:
    """The signed error as printed: `+3.2%`, or why there is none (a predicted 0 has no percentage:
    a quorum run's predicted staleness printed `+nan%`)."""
    value = _pct(difference, reference)
    if np.isfinite(value):
        return f"{value:+.1f}%"
    return "no % of a predicted 0" if reference == 0 else "–"


def _pct_label(value: float) -> str:
    """A figure's per-node error label: the value, or a dash where there is none (NaN)."""
    return f"{value:+.1f}%" if np.isfinite(value) else "–"


def device_kind(scenario) -> str:
    """What the nodes' devices are, for labels: CPU, GPU, or device when the scenario mixes them."""
    kinds = {"CPU" if key == "cpu" else "GPU" for node in scenario.nodes for key in node.gpus}
    return kinds.pop() if len(kinds) == 1 else "device"


def plot_validation(table, path: Path, title: str, device: str = "GPU") -> None:
    """Three panels per node: idle and sync (predicted vs measured, signed errors under the
    nodes), and the round split into its parts.

    `device` names what idles (device_kind: CPU, GPU or device); the run's side is labelled by the
    table's mode (an emulated run's bars say "emulated", never "measured")."""
    # deferred: matplotlib (~0.5 s) only when a figure is drawn; run --help reads validation without it
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    # deferred: matplotlib (~0.5 s) only when a figure is drawn; run --help reads validation without it
    import matplotlib.pyplot as plt  # noqa: PLC0415

    nodes = list(table["node"])
    kind = run_kind(table)
    x = np.arange(len(nodes))
    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(17, 4.8), constrained_layout=True)
    w = 0.38
    _paired_bars(ax1, x, w, table["predicted_idle_s"], table["measured_idle_s"],
                 [f"{n}\n{_pct_label(e)}" for n, e in zip(nodes, table["error_pct_of_round"])], kind)
    ax1.set_xlabel(f"node  (idle error: {kind} − predicted, % of round time)")
    ax1.set_ylabel("idle time, summed over rounds (s)")
    ax1.set_title(f"{device} idle time per node")
    _paired_bars(ax3, x, w, table["predicted_comm_s"], table["measured_comm_s"],
                 [f"{n}\n{_pct_label(e)}" for n, e in zip(nodes, table["comm_error_pct"])], kind)
    ax3.set_xlabel(f"node  (sync error: {kind} − predicted, % of predicted sync)")
    ax3.set_ylabel("sync time, summed over rounds (s)")
    ax3.set_title("sync (outer all-reduce + step) per node")
    parts = [("compute_s", "compute", "#74c476"), ("idle_s", "idle", "#fd8d3c"), ("comm_s", "sync", "#9e9ac8")]
    for offset, side, hatch in ((-w / 2, "predicted", ""), (w / 2, "measured", "//")):  # the CSV's prefixes
        bottom = np.zeros(len(nodes))
        for col, label, color in parts:
            values = table[f"{side}_{col}"].to_numpy(float)
            ax2.bar(x + offset, values, w, bottom=bottom, color=color, hatch=hatch, edgecolor="white",
                    label=f"{label}" if side == "predicted" else None)
            bottom += values
    ax2.set_xticks(x, nodes)
    ax2.set_ylabel("time, summed over rounds (s)")
    ax2.set_title(f"round time: predicted (plain) | {kind} (hatched)")
    ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3, frameon=False)
    fig.suptitle(title)
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def run_kind(table) -> str:
    """What the run's side of a validation table is called: its mode column (MODES), one value."""
    return str(table["mode"].iloc[0])


def _paired_bars(ax, x, width: float, predicted, measured, ticks: list[str], kind: str) -> None:
    b1 = ax.bar(x - width / 2, predicted, width, label="predicted", color="#9ecae1", edgecolor="#3182bd")
    b2 = ax.bar(x + width / 2, measured, width, label=kind, color="#fdae6b", edgecolor="#e6550d")
    ax.bar_label(b1, fmt="%.2f", fontsize=8)
    ax.bar_label(b2, fmt="%.2f", fontsize=8)
    ax.set_xticks(x, ticks)
    ax.legend()


# Printed by default (the CSV holds every column; --wide prints them all): ≤ 120 characters.
SHOWN = {"node": "node", "predicted_idle_s": "idle_pred_s", "measured_idle_s": "idle_meas_s",
         "error_pct_of_round": "idle_err_%round", "predicted_comm_s": "sync_pred_s", "measured_comm_s": "sync_meas_s",
         "comm_error_pct": "sync_err_%", "predicted_round_s": "round_pred_s", "measured_round_s": "round_meas_s"}
TABLE_WIDTH = 120


def validation_text(table, wide: bool = False) -> str:
    """validate's table: the idle, sync and round columns under short names (≤ TABLE_WIDTH wide;
    an emulated run's _emul_, not _meas_), or with --wide every column of validation.csv plus
    overrun_steps (the file's names; its mode column says which the run was)."""
    if wide:
        shown = table[VALIDATION_COLUMNS + ["overrun_steps"]]
    else:
        short = {k: v.replace("_meas_", "_emul_") if run_kind(table) == MODES[True] else v for k, v in SHOWN.items()}
        shown = table[list(short)].rename(columns=short)
    return shown.to_string(index=False, float_format=lambda v: f"{v:.3f}", line_width=None if wide else TABLE_WIDTH)


def loss_comparison(scenario, plan, timeline, trace, scale: float, setup) -> tuple[dict, list[str]]:
    """The loss model against the run: validation.csv's loss columns and the lines to print (per round,
    predicted and measured loss; the time to the target both ways)."""
    pred = predict(setup, scenario, plan, plan_rounds(plan, timeline))
    seen = plan_rounds(plan, trace.assign(round_end_s=trace["round_end_s"] / scale))
    got = measured(seen, setup.target)
    both = pred["curve"].drop(columns="end_s").merge(seen[["round", "loss", "end_s"]], on="round",
                                                    suffixes=("_predicted", "_measured"))
    lines = ["loss by round (predicted / measured, the nodes' inner-step mean weighted by tokens): " + ", ".join(
        f"{a:.3f}/{b:.3f}" for a, b in zip(both["loss_predicted"], both["loss_measured"]))]
    lines.append(f"loss at the end (mean of the last rounds): predicted {pred['loss_end']:.3f}, measured "
                 f"{got['loss_end']:.3f} ({100 * (got['loss_end'] - pred['loss_end']) / pred['loss_end']:+.1f}%)")
    own_clock = float("nan")
    if setup.target is not None:
        # the predicted losses at the run's own round ends: the loss model's part of the error, the clock's out
        own_clock = time_to_target(both["end_s"].to_numpy(), both["loss_predicted"].to_numpy(), setup.target)
        p, m = pred["time_to_target_s"], got["time_to_target_s"]
        err = f" ({100 * (p - m) / m:+.1f}%)" if np.isfinite(p) and np.isfinite(m) else ""
        lines.append(f"time to loss {setup.target:g}: predicted {format_time(p)} s, measured {format_time(m)} s{err}; "
                     f"the predicted losses on the run's own round ends: {format_time(own_clock)} s")
    columns = {"predicted_loss_end": pred["loss_end"], "measured_loss_end": got["loss_end"],
               "predicted_time_to_target_s": pred["time_to_target_s"],
               "measured_time_to_target_s": got["time_to_target_s"], "loss_model_time_to_target_s": own_clock}
    return columns, lines


def report(prog: str, scenario, plan, timeline, trace, out: Path, emulated: bool, time_scale: float,
           network: str, caveat: str, wide: bool = False, loss=None, host=None) -> None:
    """Write validation.csv, trace.json and validation.png into out; print the table and the verdict
    (loss: the loss model's setup, simulator/models/loss_prediction.py, when the run's corpus is the profile's;
    host: the machine's CPU shares over the run, train/hoststat.py HostShare, when it ran just now)."""
    scale = time_scale if emulated else 1.0
    wall = predicted_wall_clock(scenario, timeline)
    table = validation_table(timeline, trace, scale, emulated=emulated, network=network, wall=wall)
    loss_columns, loss_lines = (loss_comparison(scenario, plan, timeline, trace, scale, loss) if loss is not None
                                else ({}, [NO_LOSS_COMPARISON]))
    table = table.assign(**loss_columns)
    if host is not None:
        table = table.assign(host_steal_pct=host.steal_pct, host_busy_pct=host.busy_pct)
    write_csv(table[VALIDATION_COLUMNS + [c for c in STALENESS_VALIDATION_COLUMNS if c in table]],
              out / "validation.csv")
    write_trace_json(validation_trace(timeline, trace, scale, plan.to_frame(scenario), emulated), out / "trace.json")
    mode = (f"schedule check (emulated, time scale {time_scale:g})" if emulated
            else "measured, not emulated") + f"; {network}"
    plot_validation(table, out / "validation.png",
                    f"{scenario.name}: strategy {plan.strategy}, {len(set(trace['round']))} rounds ({mode})",
                    device_kind(scenario))
    print(validation_text(table, wide))
    losses = trace.groupby("round")["loss"].mean()
    print("mean loss by round: " + ", ".join(f"{v:.3f}" for v in losses))
    for line in loss_lines:
        print(line)
    if "measured_staleness_mean" in table:
        print(staleness_line(table))
    worst = table["error_pct_of_round"].abs().max()
    label = "schedule check (emulated): " if emulated else "measured: "
    sync_errors = table["comm_error_pct"].dropna()
    sync = f", sync error {sync_errors.min():+.1f}% to {sync_errors.max():+.1f}%" if len(sync_errors) else ""
    print(f"{label}largest idle error: {worst:.2f}% of round time{sync}{caveat}; network: {network}")
    print(wall_line(wall, table["measured_wall_s"].iloc[0], MODES[emulated]))
    print(outer_step_source(scenario))
    for line in verdict_lines(table, emulated, network):
        print(line)
    if not emulated:  # an emulated run's steps are the prediction's own: no band to land in, nothing to split
        print(band_line(scenario, timeline, table))
        if (line := compute_line(table)) is not None:
            print(line)
    # a run slower than its calibration on a host that was taken from it is the host's
    say(host, "the run", "a round error here is the host's, not the prediction's")
    print(f"wrote {out}/: validation.csv, validation.png, trace.json, timeline.csv")
    overruns = int(table["overrun_steps"].sum())
    if emulated and overruns:
        print(f"warning: {overruns} inner steps took longer in real compute than their emulated step time; "
              f"measured compute exceeds the prediction there (raise step_time_s or lower the load)",
              file=sys.stderr)
