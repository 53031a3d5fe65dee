"""Where a path resolves (docs/DESIGN.md, "Scenario file"): a path typed on the command line (`--set
KEY=PATH` included) against the current folder, a path written inside a file against that file's folder."""
from __future__ import annotations

import shutil
from pathlib import Path

from simulator.models.loss_prediction import BUILT_IN_PROFILE, loss_setup
from simulator.scenario import load_scenario

NET_PROFILE = Path(__file__).parents[1] / "profiles" / "loopback-net.csv"


def test_a_set_path_resolves_against_the_current_folder_for_a_built_in_scenario(tmp_path, monkeypatch):
    """Journey 4: `--set training.convergence_profile=out/hetero-cpu/convergence.csv` after calibrating
    in the current folder (it was looked up under simulator/scenarios/)."""
    (tmp_path / "out" / "hetero-cpu").mkdir(parents=True)
    shutil.copy(BUILT_IN_PROFILE, tmp_path / "out" / "hetero-cpu" / "convergence.csv")
    monkeypatch.chdir(tmp_path)
    scenario = load_scenario("hetero-cpu", ["training.convergence_profile=out/hetero-cpu/convergence.csv"])
    assert scenario.resolve_path(scenario.training.convergence_profile) == \
        tmp_path / "out" / "hetero-cpu" / "convergence.csv"
    assert loss_setup(scenario).same_model


def test_set_paths_and_file_paths_each_keep_their_own_folder(tmp_path, monkeypatch):
    """A scenario in another folder: its own `profile` line resolves beside it, a `--set` path from where
    the user stands."""
    scenario_dir, here = tmp_path / "scenarios", tmp_path / "here"
    (scenario_dir / "prof").mkdir(parents=True)
    here.mkdir()
    shutil.copy(NET_PROFILE, scenario_dir / "prof" / "net.csv")
    shutil.copy(NET_PROFILE, here / "net.csv")
    shutil.copy(BUILT_IN_PROFILE, here / "conv.csv")
    (scenario_dir / "s.toml").write_text('name = "s"\n[model]\npreset = "tiny"\nseq_len = 64\n'
                                         '[network]\nprofile = "prof/net.csv"\n'
                                         '[[nodes]]\nname = "a"\ngpus = { "cpu" = 1 }\nstep_time_s = 0.1\n')
    monkeypatch.chdir(here)
    inside = load_scenario(str(scenario_dir / "s.toml"))
    assert inside.resolve_path(inside.network.profile) == scenario_dir / "prof" / "net.csv"
    given = load_scenario(str(scenario_dir / "s.toml"), ["network.profile=net.csv",
                                                         "training.convergence_profile=conv.csv"])
    assert given.resolve_path(given.network.profile) == here / "net.csv"
    assert given.resolve_path(given.training.convergence_profile) == here / "conv.csv"
