"""Refused means nothing written (issue 59): every refusal is decided before the first file or
process, and a test lists the folder before and after.

Was: a sweep refused for a target below the floor left spec.json and a parts folder, which then
blocked the corrected rerun ("holds a sweep with other arguments")."""
from __future__ import annotations

import pytest

from simulator.sweep.sweep_cli import main as sweep

SMALL = ["--nodes", "2", "--gpus-per-node", "1", "--gpu-types", "a30,t4", "--bandwidth-gbps", "1",
         "--samples", "4", "--seed", "5", "--chunk", "4", "--workers", "1", "--no-figures"]


def _listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else None


@pytest.mark.parametrize("target, message", [("0.01", "at or below the loss floor"),
                                              ("1000", "at or above the loss at the curve's start")])
def test_a_sweep_refused_for_its_target_writes_nothing_and_the_corrected_rerun_runs(tmp_path, capsys, target,
                                                                                      message):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = _listing(out)
    assert sweep([*SMALL, "--target-loss", target, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert _listing(out) == before
    assert sweep([*SMALL, "--target-loss", "5", "--out", str(out)]) == 0  # the corrected rerun
    assert (out / "sweep.csv").exists() or (out / "sweep").is_dir()


def test_a_scenario_file_with_a_utf8_byte_order_mark_loads(tmp_path):
    """Was: "Invalid statement (at line 1, column 1)" for a file an editor saved with a BOM."""
    from real.core.config import load_run_spec
    from simulator.scenario import BUILTIN_DIR, load_scenario

    text = (BUILTIN_DIR / "hetero-cpu.toml").read_text()
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (tmp_path / "plain.toml").write_text(text)
    bom, plain = load_scenario(str(tmp_path / "bom.toml")), load_scenario(str(tmp_path / "plain.toml"))
    assert bom.to_table() == plain.to_table()
    (tmp_path / "run.toml").write_text(plain.to_toml())
    (tmp_path / "bom-run.toml").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "run.toml").read_bytes())
    assert load_run_spec(tmp_path / "bom-run.toml") == load_run_spec(tmp_path / "run.toml")


@pytest.mark.slow
def test_a_mismatched_resume_names_the_key_that_differs(tmp_path, capsys):
    """Was: two opaque run-identity digests; docs/RUNNING.md promises the key. The folder stays as it was."""
    from geodt.run_cmd import run_main

    run = ["hetero-cpu", "--strategy", "baseline", "--emulate", "--no-progress", "--set", "training.rounds=3",
           "--set", "training.local_steps=2", "--checkpoint-every", "1", "--stop-after", "1", "--out", str(tmp_path / "r")]
    assert run_main(run) == 0
    before = {p: p.read_bytes() for p in sorted((tmp_path / "r").rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert run_main([*run, "--resume", "--set", "seed=7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ": seed: the checkpoints were made with 0, this run has 7; expected the scenario" in err[0], err
    assert {p: p.read_bytes() for p in sorted((tmp_path / "r").rglob("*")) if p.is_file()} == before


RUN = ["hetero-cpu", "--strategy", "baseline", "--emulate", "--no-progress", "--set", "training.rounds=2"]


def test_a_run_refused_for_disk_space_writes_no_plan(tmp_path, capsys, monkeypatch):
    """Was: plan.csv and scenario.toml written, then the refusal."""
    import shutil

    import real.process.outdir
    from geodt.run_cmd import run_main

    monkeypatch.setattr(real.process.outdir.shutil, "disk_usage",
                        lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 10**5, 10**5))
    out = tmp_path / "run"
    assert run_main([*RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "97.7 KiB free; the run needs about" in err[0], err
    assert _listing(out) in (None, [])


def test_a_corpus_too_short_for_every_node_is_refused_before_any_process(tmp_path, capsys):
    """Was: refused by the workers, after 4 processes started (30 s here), plan.csv and scenario.toml written."""
    import numpy as np

    from geodt.run_cmd import run_main

    np.save(tmp_path / "short.npy", np.arange(40, dtype=np.int64))
    out = tmp_path / "run"
    assert run_main([*RUN, "--data", str(tmp_path / "short.npy"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "40 tokens make shards of 10, fewer than seq_len=" in err[0], err
    assert _listing(out) in (None, [])
