"""Bad input to `geodt simulate` / `geodt plan`: one line naming file, key and expectation; exit 2; nothing written."""
from __future__ import annotations

import re

import pytest

from simulator.cli import plan_main, simulate_main
from conftest import SMALL


def edit(old: str, new: str, count: int = 1) -> str:
    assert old in SMALL, old
    return SMALL.replace(old, new, count)


# (id, scenario text, extra argv, substrings the one error line must contain)
CASES = [
    ("unknown-top-key", SMALL + "\ncolour = 1\n", [], ["scenario.toml", "colour", "unknown key"]),
    ("unknown-section-key", edit("rounds = 2", "roundz = 2"), [], ["training.roundz", "unknown key", "rounds"]),
    ("unknown-gpu", edit('"cpu" = 1', '"rtx-9090" = 1'), [], ["nodes[0].gpus.rtx-9090", "unknown GPU", "a30"]),
    ("zero-gpu-count", edit('"cpu" = 1', '"cpu" = 0'), [], ["nodes[0].gpus.cpu", "positive GPU count"]),
    ("negative-bandwidth", edit("bandwidth_gbps = 1.0", "bandwidth_gbps = -1.0"), [], ["network.bandwidth_gbps", "positive"]),
    ("zero-rounds", edit("rounds = 2", "rounds = 0"), [], ["training.rounds", "positive"]),
    ("negative-step-time", edit("step_time_s = 0.1", "step_time_s = -0.1"), [], ["nodes[0].step_time_s", "positive"]),
    ("nan-step-time", edit("step_time_s = 0.1", "step_time_s = nan"), [], ["nodes[0].step_time_s", "finite"]),
    ("no-nodes", SMALL.split("[[nodes]]")[0] + "nodes = []\n", [], ["nodes", "at least one"]),
    ("missing-nodes", SMALL.split("[[nodes]]")[0], [], ["nodes", "at least one"]),
    ("duplicate-names", edit('name = "b"', 'name = "a"'), [], ["nodes[1].name", "duplicate", "'a'"]),
    ("missing-profile", edit("step_time_s = 0.1", 'profile = "nope.csv"'), [], ["nodes[0].profile", "nope.csv", "not found"]),
    ("bad-toml", SMALL + "\n[training\n", [], ["scenario.toml", "TOML"]),
    ("wrong-type", edit("rounds = 2", 'rounds = "ten"'), [], ["training.rounds", "integer", "'ten'"]),
    ("unknown-dtype", edit('dtype = "fp32"', 'dtype = "fp8"'), [], ["model.dtype", "bf16, fp16, fp32"]),
    ("unknown-preset", edit('preset = "tiny"', 'preset = "gpt-5"'), [], ["model.preset", "unknown model preset"]),
    ("bad-payload", edit("latency_ms = 1.0", 'latency_ms = 1.0\npayload_dtype = "fp4"'), [], ["network.payload_dtype", "int8"]),
    ("momentum-range", SMALL.replace("[[nodes]]", "[diloco]\nouter_momentum = 1.5\n[[nodes]]", 1), [],
     ["diloco.outer_momentum", "momentum"]),
    ("gpus-not-table", edit('gpus = { "cpu" = 1 }', 'gpus = "cpu"'), [], ["nodes[0].gpus", "table"]),
    ("unknown-strategy", SMALL, ["--strategy", "Z"], ["--strategy Z", "unknown strategy", "baseline"]),
    ("unknown-engine", SMALL, ["--engine", "fast"], ["--engine fast", "simpy, analytic"]),
    ("set-unknown-key", SMALL, ["--set", "training.roundz=3"], ["--set", "training.roundz", "unknown key"]),
    ("set-bad-type", SMALL, ["--set", "training.rounds=abc"], ["--set", "training.rounds", "integer", "'abc'"]),
    ("set-bad-value", SMALL, ["--set", "training.rounds=-3"], ["--set", "training.rounds", "positive"]),
    ("set-unknown-node", SMALL, ["--set", "nodes.zz.step_time_s=1"], ["--set", "nodes.zz", "no such node", "a, b, c"]),
    ("set-no-equals", SMALL, ["--set", "training.rounds"], ["--set", "key=value"]),
    ("set-into-scalar", SMALL, ["--set", "seed.x=1"], ["--set", "seed", "not a table"]),
]


@pytest.mark.parametrize("text,argv,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_one_line_exit_2_nothing_written(write_scenario, tmp_path, capsys, text, argv, needles):
    path = write_scenario(text)
    out = tmp_path / "out"
    code = simulate_main([str(path), "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not out.exists()


def test_missing_scenario_file(tmp_path, capsys):
    code = simulate_main([str(tmp_path / "none.toml"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "none.toml" in err and "not found" in err and len(err.splitlines()) == 1


def test_unknown_builtin_name(capsys):
    assert simulate_main(["nosuchscenario"]) == 2
    err = capsys.readouterr().err.strip()
    assert "nosuchscenario" in err and "paper" in err


def test_unwritable_out(write_scenario, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = simulate_main([str(write_scenario()), "--out", str(blocker / "sub")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--out" in err and len(err.splitlines()) == 1


def test_plan_requires_strategy(write_scenario, capsys):
    with pytest.raises(SystemExit) as exc:
        plan_main([str(write_scenario())])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_bad_argument_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        simulate_main(["paper", "--frobnicate"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search("unrecognized arguments", err)
