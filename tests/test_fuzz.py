"""Property-based fuzzing of the CLI (issue 10): scenario mutations and arguments.

Each example mutates a small valid scenario (keys, types, extreme numbers, names, paths:
FIFOs, /dev/zero, 300-character names) or draws odd arguments, runs the `geodt` command
in-process (`geodt.cli.main`) under a hang guard (SIGALRM), and asserts the contract:

- exit 0, every number in every CSV written is finite, and every planned batch fits its
  node (the model's or the profile's memory); or
- exit 2 with exactly one line on stderr and nothing written to --out;
- never a traceback (any exception out of main fails), never a hang (the guard fails).

Deterministic (derandomize=True, no example database) and bounded (MAX_EXAMPLES), so it runs
in CI in well under a minute on 2 cores.
"""
from __future__ import annotations

import contextlib
import io
import os
import signal
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geodt.cli import main as geodt

ROOT = Path(__file__).resolve().parents[1]
MAX_EXAMPLES = 250
HANG_S = 30

BASE = {
    "name": "fuzz", "seed": 0,
    "model": {"preset": "llama-60m", "seq_len": 256, "dtype": "bf16"},
    "training": {"rounds": 2, "local_steps": 5, "batch_size": 2},
    "network": {"bandwidth_gbps": 1.0, "latency_ms": 1.0},
    "nodes": [{"name": "a", "gpus": {"a30": 2}}, {"name": "b", "gpus": {"t4": 1, "v100": 1}},
              {"name": "c", "gpus": {"cpu": 1}, "step_time_s": 0.5}],
}
KEYS = ["name", "seed", "model.preset", "model.params", "model.seq_len", "model.dtype", "training.rounds",
        "training.local_steps", "training.batch_size", "network.bandwidth_gbps", "network.latency_ms",
        "network.collective", "network.payload_dtype", "simulation.jitter_cv", "diloco.outer_lr", "bogus",
        "model.bogus", "nodes.0.name", "nodes.1.name", "nodes.0.gpus", "nodes.1.gpus.t4", "nodes.0.step_time_s",
        "nodes.2.step_time_s", "nodes.1.uplink_gbps", "nodes.0.intra_node_gbps", "nodes.2.profile", "nodes"]
NUMBERS = [0, -1, 1, 3, 0.5, 1e-30, 1e-7, 1e308, float("inf"), float("-inf"), float("nan"), 2**63, 10**9,
           1e6, 65536, 99999999]
ODD = [[1, 2], "abc", {}, True, "", {"a30": 0}, {"x": 1}, {"h100sxm": 1}, [{"name": "z"}]]
NAMES = ["=cmd()", "+1", "-x", "@a", "a\nb", "a\tb", "../x", "/abs/x", "x" * 300, "ok", "ok2", ".", "a,b"]
PATHS = ["/dev/zero", "{fifo}.json", "{fifo}.csv", "p" * 300 + ".csv", "missing.json",
         str(ROOT / "profiles" / "cpu-1thread.csv"), "{config}"]
PLAUSIBLE = st.sampled_from([1, 2, 4, 8, 16, 64, 0.1, 0.01, 10.0, 100.0, "ring", "partitioned", "fp16", "int8",
                             "fp32", "llama-150m", "tiny", "ok"])
VALUES = st.sampled_from(NUMBERS + ODD + NAMES + PATHS) | st.integers(-3, 10**6) | st.floats(allow_nan=True) \
    | st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12) | PLAUSIBLE | PLAUSIBLE


class Hang(BaseException):
    """Raised by the guard; a BaseException, so that no handler in the CLI swallows it."""


def _alarm(signum, frame):
    raise Hang()


def set_key(table: dict, dotted: str, value, delete: bool) -> None:
    parts = dotted.split(".")
    where = table
    for part in parts[:-1]:
        where = where[int(part)] if isinstance(where, list) else where.setdefault(part, {})
        if not isinstance(where, (dict, list)):
            return
    last = parts[-1]
    if isinstance(where, list):
        return
    if delete:
        where.pop(last, None)
    else:
        where[last] = value


def fill(value, tmp: Path):
    if isinstance(value, str):
        return value.replace("{fifo}", str(tmp / "fifo")).replace("{config}", str(tmp / "bad.json"))
    return value


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = geodt(argv)
            except SystemExit as exc:  # argparse's exit inside a subcommand
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return code, out.getvalue(), err.getvalue()


def check_outputs(out: Path) -> None:
    from simulator.models.timing import node_timings
    from simulator.scenario import load_scenario

    for csv in out.glob("*.csv"):
        # idle_left is NaN by definition where the baseline has no idle (nothing to remove); note is text;
        # a plan's cpu_cores / cpu_quota are empty for a node without CPU limits; time_to_target_s is inf
        # where the run never reaches the target and empty without one (formats/timeline.py LOSS_COLUMNS), and so
        # is its band time_band_s;
        # quorum and grace_s are empty but for a quorum plan (formats/plan.py)
        frame = pd.read_csv(csv).drop(columns=["idle_left", "note", "cpu_cores", "cpu_quota", "time_to_target_s",
                                               "time_band_s", "quorum", "grace_s"], errors="ignore")
        numbers = frame.select_dtypes("number").to_numpy(dtype=float)
        assert np.isfinite(numbers).all(), f"{csv.name}: a non-finite number"
    if (out / "plan.csv").exists():
        scenario = load_scenario(str(out / "scenario.toml"))
        largest = {t.node.name: t.max_batch() for t in node_timings(scenario)}
        plan = pd.read_csv(out / "plan.csv", dtype={"node": str}, keep_default_na=False)
        for node, batch in zip(plan["node"], plan["batch_size"]):
            assert 1 <= batch <= largest[node], f"node {node}: batch {batch} does not fit ({largest[node]})"


def check(code: int, stdout: str, stderr: str, out: Path, argv) -> None:
    assert code in (0, 2), (code, argv, stderr[-2000:])
    assert "Traceback" not in stderr, stderr
    if code == 2:
        lines = stderr.strip("\n").split("\n")
        assert len(lines) == 1 and lines[0], (argv, stderr)
        assert not out.exists() or not any(out.iterdir()), f"{argv}: wrote {list(out.iterdir())}"
    else:
        check_outputs(out)


@settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(mutations=st.lists(st.tuples(st.sampled_from(KEYS), VALUES, st.sampled_from([False, False, False, True])),
                          min_size=1, max_size=3),
       command=st.sampled_from(["simulate", "plan", "table"]),
       strategy=st.sampled_from([None, "baseline", "A", "B", "hybrid", "network-aware", "sync-ddp"]))
def test_scenario_mutations(mutations, command, strategy):
    import copy

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        os.mkfifo(tmp / "fifo.json")
        os.mkfifo(tmp / "fifo.csv")
        (tmp / "bad.json").write_text('{"hidden_size": [1, 2], "num_hidden_layers": 1e999}')
        table = copy.deepcopy(BASE)
        for key, value, delete in mutations:
            set_key(table, key, fill(value, tmp), delete)
        path = tmp / "s.toml"
        try:
            path.write_text(tomli_w.dumps(table))
        except (TypeError, ValueError):  # a value TOML cannot hold (None): not a file a user can write
            return
        out = tmp / "out"
        if command == "table":
            argv = ["sweep", "--table", str(path), "--out", str(out)]
        else:
            argv = [command, str(path), "--out", str(out)]
            if command == "simulate":
                argv += ["--engine", "analytic"]
        if strategy or command == "plan":
            argv += ["--strategy", strategy or "C"]
        code, stdout, stderr = run(argv)
        check(code, stdout, stderr, out, argv)


ARG_VALUES = st.sampled_from(["inf", "nan", "-1", "0", "1e-30", "1e300", "\u00b2", "", "abc", "1,,2", "3",
                              "a30,a30", "a3O", "h100sxm,t4", "100000000", "2,4", "auto:\u00b2"])


@settings(max_examples=MAX_EXAMPLES // 2, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(command=st.sampled_from(["sweep", "simulate-set", "calibrate", "scenario-path"]),
       option=st.sampled_from(["--bandwidth-gbps", "--nodes", "--gpus-per-node", "--gpu-types", "--samples",
                               "--seed", "--chunk", "--strategy", "--set"]),
       value=ARG_VALUES | st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8))
def test_arguments(command, option, value):
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        out = tmp / "out"
        if command == "sweep":
            argv = ["sweep", "--nodes", "2", "--gpus-per-node", "2", "--gpu-types", "a30,v100", "--samples", "6",
                    "--workers", "1", "--no-figures", "--bandwidth-gbps", "1", "--out", str(out), option, value]
        elif command == "simulate-set":
            argv = ["simulate", "hetero-cpu", "--engine", "analytic", "--set", value if "=" in value
                    else f"training.rounds={value}", "--out", str(out)]
        elif command == "calibrate":
            # --device tpu: refused before anything is measured, whatever the batch
            argv = ["calibrate", "device", "--device", "tpu", "--batch", value, "--out", str(out / "p.csv")]
        else:
            os.mkfifo(tmp / "fifo.toml")
            target = {"--nodes": "/dev/zero", "--gpus-per-node": str(tmp / "fifo.toml"),
                      "--gpu-types": str(tmp / ("s" * 300 + ".toml")), "--samples": str(tmp)}.get(option, value)
            argv = ["simulate", target or "x", "--out", str(out)]
        code, stdout, stderr = run(argv)
        if command == "sweep" and code == 0:
            frame = pd.read_csv(out / "sweep.csv")
            numbers = frame.select_dtypes("number").drop(columns=["idle_left"]).to_numpy(dtype=float)
            assert np.isfinite(numbers).all()
            return
        check(code, stdout, stderr, out, argv)
