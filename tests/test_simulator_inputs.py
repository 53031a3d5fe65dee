"""Bad input to `geodt simulate` / `geodt plan`: one line naming file, key and expectation; exit 2; nothing written."""
from __future__ import annotations

import re

import pytest
from conftest import SMALL

from simulator.cli import plan_main, simulate_main


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
    # issue 10: sizes beyond the limits are one line up front, not MemoryError, overflow or NaN later
    ("tiny-step-time", edit("step_time_s = 0.1", "step_time_s = 1e-30"), [], ["nodes[0].step_time_s", "from 1e-07"]),
    ("huge-step-time", edit("step_time_s = 0.1", "step_time_s = 1e308"), [], ["nodes[0].step_time_s", "to 1e+06"]),
    ("huge-rounds", edit("rounds = 2", "rounds = 1e9"), [], ["training.rounds", "from 1 to"]),
    ("huge-batch", edit("batch_size = 4", "batch_size = 1000000000"), [], ["training.batch_size", "from 1 to 65536"]),
    ("local-steps-2-63", edit("local_steps = 10", "local_steps = 9223372036854775808"), [],
     ["training.local_steps", "from 1 to"]),
    ("local-steps-beyond-float", edit("local_steps = 10", "local_steps = " + "9" * 400), [],
     ["training.local_steps", "positive finite"]),
    ("infinite-latency", edit("latency_ms = 1.0", "latency_ms = inf"), [], ["network.latency_ms", "from 0 to"]),
    ("tiny-uplink", edit("step_time_s = 0.1", "step_time_s = 0.1\nuplink_gbps = 1e-30"), [],
     ["nodes[0].uplink_gbps", "from 1e-06"]),
    ("infinite-bandwidth", edit("bandwidth_gbps = 1.0", "bandwidth_gbps = inf"), [], ["network.bandwidth_gbps"]),
    ("set-into-node-name", SMALL, ["--set", "nodes.a.name.y=1"], ["--set", "nodes.a.name", "not a table"]),
    ("formula-node-name", edit('name = "a"', 'name = "=HYPERLINK(1)"'), [], ["nodes[0].name", "= + - @"]),
    ("plus-node-name", edit('name = "a"', 'name = "+1"'), [], ["nodes[0].name", "= + - @"]),
    ("control-node-name", edit('name = "a"', 'name = "a\\u0007b"'), [], ["nodes[0].name", "control character"]),
    ("newline-node-name", edit('name = "a"', 'name = "a\\nb"'), [], ["nodes[0].name", "control character"]),
    ("scenario-name-up", edit('name = "small"', 'name = "../x"'), [], ["name", "not a path"]),
    ("scenario-name-absolute", edit('name = "small"', 'name = "/tmp/x"'), [], ["name", "not a path"]),
    ("long-profile-path", edit("step_time_s = 0.1", 'profile = "' + "p" * 300 + '.csv"'), [],
     ["nodes[0].profile", "not found"]),
    ("huge-gpu-count", edit('"cpu" = 1', '"cpu" = 10000000'), [], ["nodes[0].gpus.cpu", "at most 100000"]),
    ("gpu-typo", edit('"cpu" = 1', '"a3O" = 1'), [], ["nodes[0].gpus.a3O", "did you mean a30"]),
    ("float-precision-lost", edit("rounds = 2", "rounds = 1000").replace("step_time_s = 0.1", "step_time_s = 1e-7")
     .replace("bandwidth_gbps = 1.0", "bandwidth_gbps = 1e-6"), [], ["precision"]),
    ("timeline-too-large", edit("rounds = 2", "rounds = 1000000").replace("local_steps = 10", "local_steps = 100"),
     ["--strategy", "sync-ddp"], ["strategy sync-ddp", "timeline rows", "at most"]),
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


@pytest.mark.parametrize("make", ["fifo", "dev-zero", "dir", "huge"])
def test_scenario_that_is_not_a_small_regular_file_is_refused_unread(tmp_path, capsys, make):
    import os

    path = tmp_path / "s.toml"
    if make == "fifo":
        os.mkfifo(path)  # reading it would block forever
    elif make == "dev-zero":
        path = "/dev/zero"  # reading it would never end
    elif make == "dir":
        path.mkdir()
    else:
        with open(path, "wb") as handle:
            handle.truncate(17 << 20)
    code = simulate_main([str(path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "not a regular file" in err or "bytes; expected" in err
    assert not (tmp_path / "o").exists()


def test_scenario_not_utf8_is_one_line(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_bytes(b'name = "\xff"\n')
    assert simulate_main([str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not UTF-8" in err


def test_long_scenario_path_is_one_line(tmp_path, capsys):
    assert simulate_main([str(tmp_path / ("s" * 300 + ".toml")), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "scenario" in err


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
