"""idle.png of `geodt simulate` and `geodt plan` (issue 42): written whole beside the other outputs,
a PNG, named in the command's listing of what it wrote, and an owned output (removed as stale)."""
from __future__ import annotations

import io

import numpy as np
import pandas as pd

from simulator.cli import plan_main, simulate_main
from simulator.outputs.outputs import OWNED
from simulator.outputs.run_figure import idle_figure

SMALL = ["hetero-cpu", "--set", "training.rounds=3"]


def _wrote(printed: str) -> list[str]:
    line = next(line for line in printed.splitlines() if line.startswith("wrote "))
    return line.split(": ", 1)[1].split(" (removed")[0].split(", ")


def test_simulate_writes_idle_png_and_lists_it(tmp_path, capsys):
    out = tmp_path / "o"
    assert simulate_main([*SMALL, "--strategy", "baseline", "C", "--out", str(out)]) == 0
    written = _wrote(capsys.readouterr().out)
    assert "idle.png" in written and sorted(written) == sorted(p.name for p in out.iterdir())
    assert (out / "idle.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_writes_idle_png_for_its_plan(tmp_path, capsys):
    out = tmp_path / "p"
    assert plan_main([*SMALL, "--strategy", "C", "--out", str(out)]) == 0
    written = _wrote(capsys.readouterr().out)
    assert sorted(written) == ["idle.png", "plan.csv", "scenario.toml"] == sorted(p.name for p in out.iterdir())
    assert (out / "idle.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "idle.png" in OWNED


def test_idle_figure_draws_the_given_numbers():
    """A readable PNG, and the same inputs give the same bytes (no timestamp)."""
    import matplotlib

    matplotlib.use("Agg")
    timeline = pd.DataFrame({"node": ["a", "b"] * 4, "round": np.repeat(range(4), 2),
                             "compute_s": [1.0, 2.0] * 4, "idle_s": [1.0, 0.0] * 4, "comm_s": [0.5] * 8,
                             "round_start_s": np.repeat(np.arange(4) * 2.5, 2)})
    runs = [("baseline", ["a", "b"], np.array([4.0, 0.0]), timeline),
            ("C", ["a", "b"], np.array([1.0, 0.5]), timeline)]
    first = idle_figure(runs)
    assert first == idle_figure(runs) and first[:4] == b"\x89PNG"
    import matplotlib.image as mpimg

    assert mpimg.imread(io.BytesIO(first)).shape[2] in (3, 4)


def _fleet_runs(nodes: int, rounds: int = 3):
    """Runs of `nodes` nodes whose node k computes k + 1 s a round (the last the slowest)."""
    names = [f"n{k}" for k in range(nodes)]
    compute = np.arange(1, nodes + 1, dtype=float)
    idle = compute.max() - compute
    timeline = pd.DataFrame({"node": np.tile(names, rounds), "round": np.repeat(range(rounds), nodes),
                             "compute_s": np.tile(compute, rounds), "idle_s": np.tile(idle, rounds),
                             "comm_s": 0.5, "round_start_s": np.repeat(np.arange(rounds) * (nodes + 0.5), nodes)})
    return [("baseline", names, idle * rounds, timeline), ("C", names, idle * rounds / 2, timeline)]


def test_idle_figure_at_fleet_size_shows_the_edges_and_says_so():
    """Issue 58: 1024 nodes drew 3,072 barh calls (150 s). Above SHOWN_NODES_MAX nodes the figure
    holds the EDGE_NODES slowest and fastest, a distribution of all, one collection per Gantt colour,
    and its size does not grow with the nodes."""
    from matplotlib.collections import PolyCollection

    from simulator.outputs.run_figure import EDGE_NODES, SHOWN_NODES_MAX, idle_figure_axes

    small = idle_figure_axes(_fleet_runs(SHOWN_NODES_MAX))
    fig = idle_figure_axes(_fleet_runs(4096))
    bars, box, *gantts = fig.axes
    assert len(fig.axes) == 4 and len(small.axes) == 3  # two Gantts (baseline, C: least idle); a box plot at fleet size
    slowest = [f"n{k}" for k in range(4095, 4095 - EDGE_NODES, -1)]
    fastest = [f"n{k}" for k in range(EDGE_NODES - 1, -1, -1)]
    assert [t.get_text() for t in bars.get_xticklabels()] == slowest + fastest
    assert len(bars.patches) == 2 * 2 * EDGE_NODES  # two strategies' bars of the shown nodes only
    assert "8 slowest (least idle) and 8 fastest (most idle) of 4,096 nodes" in bars.get_title()
    assert "all 4,096 nodes" in box.get_title()
    gantt = gantts[-1]
    assert [t.get_text() for t in gantt.get_yticklabels()] == slowest + fastest
    assert "8 slowest (most compute) and 8 fastest of 4,096 nodes" in gantt.get_title()
    assert len(gantt.collections) == 3 and all(isinstance(c, PolyCollection) for c in gantt.collections)
    assert len(gantt.patches) == 0
    assert tuple(fig.get_size_inches()) == tuple(idle_figure_axes(_fleet_runs(20_000)).get_size_inches())
    assert [t.get_text() for t in small.axes[0].get_xticklabels()] == [f"n{k}" for k in range(SHOWN_NODES_MAX)]


def test_idle_figure_of_20000_nodes_is_drawn_in_seconds():
    """Bounded time: 20,000 nodes (60,000 node-rounds drawn before) in well under the ~7 s a
    thousand barh calls took; 15 s leaves room for a loaded 2-core machine (about 0.5 s idle)."""
    import time

    start = time.process_time()
    assert idle_figure(_fleet_runs(20_000))[:4] == b"\x89PNG"
    assert time.process_time() - start < 15


def test_simulate_table_summarises_fleets_and_keeps_every_node_in_summary_csv(tmp_path, capsys):
    """Issue 58: the per-node table printed 1,024 lines; above SHOWN_NODES_MAX nodes it prints the
    slowest and fastest and the distribution, and summary.csv keeps every node."""
    from simulator.outputs.run_figure import EDGE_NODES

    nodes = "".join(f'[[nodes]]\nname = "n{k}"\ngpus = {{a30 = 1}}\nstep_time_s = {0.1 + 0.01 * k:.2f}\n\n'
                    for k in range(40))
    path = tmp_path / "forty.toml"
    path.write_text('name = "forty"\n[model]\npreset = "llama-150m"\n[training]\nrounds = 2\nlocal_steps = 10\n'
                    'batch_size = 4\n\n' + nodes)
    out = tmp_path / "o"
    assert simulate_main([str(path), "--strategy", "baseline", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = printed.split("== baseline ==")[1].split("band ±")[0].splitlines()[2:]
    shown = [line.split()[0] for line in table if line.split() and line.split()[0].startswith("n")]
    assert shown == [f"n{k}" for k in range(39, 39 - EDGE_NODES, -1)] + [f"n{k}" for k in range(EDGE_NODES - 1, -1, -1)]
    assert "the 8 slowest nodes, least idle, then the 8 fastest, most idle, of 40: summary.csv holds every node" in printed
    assert table[-1].split()[0] == "total"
    assert len(pd.read_csv(out / "summary.csv")) == 40
