"""The user's files (issue 42): geodt removes only what it can prove it wrote, never writes outside
--out, never replaces another command's outputs without --force, and a refused command writes nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from formats.files import child_path
from formats.owners import own_temp, remove_orphan_temps
from geodt.run_cmd import run_main
from real.process.outdir import remove_stale_outputs
from simulator.cli import plan_main, simulate_main
from simulator.sweep.sweep_cli import main as sweep_main

RUN_FILES = {"plan.csv": b"earlier plan\n", "scenario.toml": b"# earlier scenario\n", "trace.csv": b"round\n0\n",
             "trace.json": b"{}"}


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _users_files(root: Path) -> dict[str, bytes]:
    """A user's own dot-files and folders, some with .tmp in their names."""
    (root / ".tmp").mkdir(parents=True)
    (root / ".tmp" / "notes.txt").write_bytes(b"mine")
    (root / ".vimrc.tmpl").write_bytes(b"set nu")
    (root / ".plan.csv.backup01").write_bytes(b"my copy")
    (root / ".draft.tmp123").write_bytes(b"not a geodt name")
    return _tree(root)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run_folder(root: Path, identity: str = "0123456789abcdef") -> dict[str, bytes]:
    """What `geodt run` leaves: its outputs and a checkpoint set (only the manifest is read here)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, data in RUN_FILES.items():
        (root / name).write_bytes(data)
    manifest = root / "checkpoints" / "node0" / "round-000001" / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"round": 1, "node": 0, "run_identity": identity}))
    return _tree(root)


def test_stale_outputs_are_geodts_own_names_of_dead_writers_only(tmp_path):
    """Was: every dot-name holding ".tmp" went (a user's .tmp/ folder, .vimrc.tmpl)."""
    user = _users_files(tmp_path)
    dead, alive = _dead_pid(), os.getpid()
    ours = [tmp_path / f".trace.csv.tmp{dead}", tmp_path / f".final_weights.pt.tmp{dead}",
            tmp_path / f".plan.csv.geodt{dead}-abc_1234.tmp"]
    for path in ours:
        path.write_bytes(b"half")
    stage = tmp_path / f".r.geodt{dead}-zz9_zz9z.tmp"
    (stage / "sub").mkdir(parents=True)
    (stage / "sub" / "timeline.csv").write_bytes(b"half")
    live = tmp_path / f".syncs.csv.tmp{alive}"
    live.write_bytes(b"being written")
    assert sorted(remove_stale_outputs(tmp_path)) == sorted([*ours, stage])
    assert _tree(tmp_path) == {**user, live.name: b"being written"}
    assert own_temp(".vimrc.tmpl") is None and own_temp(".tmp") is None and own_temp(".x.tmp12") is None


def test_a_killed_sweeps_stage_goes_with_the_next_sweep_and_nothing_else(tmp_path, capsys):
    """Was: a SIGKILLed sweep's staging folder (sweep.csv: 112 MB at 10^6 scenarios) stayed for good."""
    out = tmp_path / "s"
    out.mkdir()
    user = _users_files(out)
    killed = out / f".s.geodt{_dead_pid()}-abcdefgh.tmp"
    killed.mkdir()
    (killed / "sweep.csv").write_bytes(b"x" * 4096)
    running = out / f".s.geodt{os.getpid()}-abcdefgh.tmp"  # a sweep still writing: stays
    running.mkdir()
    args = ["--nodes", "2", "--gpus-per-node", "1", "--gpu-types", "a30,t4", "--bandwidth-gbps", "1",
            "--samples", "4", "--seed", "1", "--workers", "1", "--no-figures", "--out", str(out)]
    assert sweep_main(args) == 0
    assert not killed.exists() and running.is_dir()
    assert {k: v for k, v in _tree(out).items() if k in user} == user
    assert not [p for p in out.iterdir() if own_temp(p.name) is not None and p != running]


def test_simulate_into_a_run_folder_is_refused_and_writes_nothing(tmp_path, capsys):
    """Was: simulate replaced the run's plan.csv, scenario.toml and trace.json without a word."""
    run = tmp_path / "run"
    before = _run_folder(run)
    for main, argv in ((simulate_main, ["hetero-cpu"]), (plan_main, ["hetero-cpu", "--strategy", "baseline"]),
                       (sweep_main, ["--table", "hetero-cpu"])):
        assert main([*argv, "--out", str(run)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"--out {run}: holds another command's outputs" in err and "--force" in err, err
        assert _tree(run) == before
    assert simulate_main(["hetero-cpu", "--out", str(run), "--force"]) == 0
    assert (run / "plan.csv").read_bytes() != RUN_FILES["plan.csv"] and (run / "summary.csv").is_file()
    assert (run / "trace.csv").read_bytes() == RUN_FILES["trace.csv"]  # not simulate's: left as it was


def test_commands_rerun_into_their_own_folder(tmp_path, capsys):
    out = tmp_path / "p"
    for _ in range(2):
        assert plan_main(["hetero-cpu", "--strategy", "baseline", "--out", str(out)]) == 0
    assert simulate_main(["hetero-cpu", "--out", str(tmp_path / "sim")]) == 0
    assert simulate_main(["hetero-cpu", "--out", str(tmp_path / "sim"), "--csv"]) == 0  # its own parquet goes
    assert sorted(p.name for p in (tmp_path / "sim").iterdir()) == [
        "idle.png", "loss.png", "plan.csv", "scenario.toml", "summary.csv", "syncs.csv", "timeline.csv", "trace.json"]
    assert plan_main(["hetero-cpu", "--strategy", "baseline", "--out", str(tmp_path / "sim")]) == 2
    assert "holds another command's outputs (loss.png, summary.csv, syncs.csv, timeline.csv, ...)" in capsys.readouterr().err


RUN = ["hetero-cpu", "--strategy", "baseline", "--no-progress", "--threads", "1", "--emulate",
       "--set", "training.rounds=1", "--set", "training.local_steps=1"]


@pytest.mark.parametrize("extra, needle", [
    ([], "holds an earlier run's checkpoints"),
    (["--resume"], "--resume: "),
])
def test_run_over_earlier_checkpoints_is_refused_before_writing(tmp_path, capsys, extra, needle):
    """Was: a rerun replaced the earlier run's checkpoints (said afterwards); a refused --resume had
    already replaced plan.csv and scenario.toml."""
    run = tmp_path / "run"
    before = _run_folder(run)
    assert run_main([*RUN, "--out", str(run), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err, err
    assert _tree(run) == before


def test_run_into_a_simulate_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "sim"
    assert simulate_main(["hetero-cpu", "--out", str(out)]) == 0
    before = _tree(out)
    capsys.readouterr()
    assert run_main([*RUN, "--out", str(out)]) == 2
    assert "holds another command's outputs (idle.png, summary.csv, syncs.parquet, timeline.parquet)" in capsys.readouterr().err
    assert _tree(out) == before


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/geodt-user-files-abs", ".hidden", "a\\b", ".."])
def test_calibrate_scenario_node_names_stay_inside_out_dir(tmp_path, capsys, name):
    """Was: a node named ../../x wrote x-0.csv two folders up; an absolute name anywhere."""
    from geodt.calibration.cli import main as calibrate_main

    scenario = tmp_path / "a" / "s.toml"
    out = tmp_path / "a" / "b"
    out.mkdir(parents=True)
    scenario.write_text(f'name = "s"\n[model]\npreset = "tiny"\nseq_len = 16\n[training]\nrounds = 1\n'
                        f'[[nodes]]\nname = {json.dumps(name)}\ngpus = {{ "cpu" = 1 }}\n')
    assert calibrate_main(["scenario", "--scenario", str(scenario), "--out-dir", str(out), "--batch", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{scenario}: nodes[0].name:" in err, err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["a", "a/b", "a/s.toml"]
    assert not Path("/tmp/geodt-user-files-abs-0.csv").exists()


def test_child_path_cannot_leave_its_folder(tmp_path):
    assert child_path(tmp_path, "n-0.csv") == tmp_path / "n-0.csv"
    for bad in ("../x.csv", "/etc/x", "a/b", ".x", "", "a\\b"):
        with pytest.raises(ValueError):
            child_path(tmp_path, bad)


def test_orphan_stages_beside_a_new_out_only_for_that_out(tmp_path):
    dead = _dead_pid()
    mine, other = tmp_path / f".o.geodt{dead}-abcdefgh.tmp", tmp_path / f".other.geodt{dead}-abcdefgh.tmp"
    mine.mkdir(), other.mkdir()
    assert remove_orphan_temps(tmp_path, only="o") == [mine] and other.is_dir()
