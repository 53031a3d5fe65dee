"""The README's "A first calibration journey": its commands parse, the scenario it names is the one
its calibrations write the profiles of, and the committed record of one run of it
(results/calibration-journey/) plans what that run executed. Seconds, no torch: the journey itself
(about four minutes, root for the quotas) is in the record, not run here."""
from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pandas as pd
import tomllib

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "results" / "calibration-journey"


def journey_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    block = text[text.index("## A first calibration journey"):]
    block = block[block.index("```bash") + len("```bash"):]
    return [shlex.split(line, comments=True) for line in block[:block.index("```")].strip().splitlines()]


def parsed():
    from geodt.calibration import links, scenario
    from geodt.run_cmd import _parser

    commands = journey_commands()
    assert [argv[:3] for argv in commands] == [["mkdir", "-p", "out/first-calibration"],
                                               ["geodt", "calibrate", "scenario"], ["geodt", "calibrate", "network"],
                                               ["geodt", "profile", "check"], ["geodt", "validate", commands[4][2]]]
    devices = scenario.parser().parse_args(commands[1][3:])
    network = links.parser().parse_args(commands[2][3:])
    validate = _parser("geodt validate", True).parse_args(commands[4][2:])
    return commands, devices, network, validate


def test_the_journey_validates_for_real_what_it_calibrated():
    commands, devices, network, validate = parsed()
    assert str(devices.out_dir) == commands[0][2]  # the folder made first
    assert validate.scenario == devices.scenario and not validate.emulate
    path = ROOT / devices.scenario
    table = tomllib.loads(path.read_text())
    # every profile the scenario names is a file the calibrations write: <out-dir>/<node>-<j>.csv, and --out
    written = {(ROOT / devices.out_dir / f"{node['name']}-{j}.csv").resolve()
               for node in table["nodes"] for j in range(node["gpus"]["cpu"])}
    named = {(path.parent / p).resolve() for node in table["nodes"]
             for p in ([node["profile"]] if isinstance(node["profile"], str) else node["profile"])}
    assert named == written
    assert (path.parent / table["network"]["profile"]).resolve() == (ROOT / network.out).resolve()
    assert commands[3][3] == f"{devices.out_dir}/one-0.csv"
    # quotas that fit a 2-core machine (validate warns otherwise)
    assert sum(node["gpus"]["cpu"] * node["cpu_quota"] for node in table["nodes"]) <= 2


def test_the_record_is_what_the_journey_plans(tmp_path):
    """The committed profiles, put where the journey writes them, plan the run the record shows."""
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    _, devices, network, validate = parsed()
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / devices.out_dir).mkdir(parents=True)
    for profile in (RECORD / "profiles").glob("*.csv"):
        shutil.copy(profile, tmp_path / devices.out_dir / profile.name)
    assert (tmp_path / network.out).is_file()
    scenario = load_scenario(str(tmp_path / validate.scenario))
    plan = make_plan(scenario, validate.strategy)
    ran = pd.read_csv(RECORD / "validate-measured-steps" / "plan.csv").set_index("node")
    for node in plan.nodes:
        assert node.local_steps == ran.loc[node.node, "local_steps"]
        assert abs(node.step_s - ran.loc[node.node, "step_s"]) < 1e-6
    validation = pd.read_csv(RECORD / "validate-measured-steps" / "validation.csv")
    assert (validation["mode"] == "measured").all()
