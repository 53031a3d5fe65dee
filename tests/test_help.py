"""Every command's --help is complete and agrees with the README's command reference: the same
strategies and model presets everywhere (issue 31); `geodt --version`."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from facts.presets import PRESETS
from geodt.cli import COMMANDS, NEEDS_TORCH, main
from simulator.strategies import STRATEGIES

ROOT = Path(__file__).resolve().parents[1]


def help_text(capsys, argv: list[str]) -> str:
    try:
        code = main([*argv, "--help"])
    except SystemExit as exc:
        code = exc.code
    assert code in (0, None), argv
    text = capsys.readouterr().out
    return re.sub(r"\s+", " ", re.sub(r"-\n\s+", "-", text))  # argparse wraps lines, also inside names


def readme_reference(label: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    assert "## Command reference" in text, "README.md has no '## Command reference' section"
    section = text[text.index("## Command reference"):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    line = next(line for line in section.splitlines() if line.startswith(label))
    return re.findall(r"`([^`]+)`", line.split("(")[0])


def test_version(capsys):
    assert main(["--version"]) == 0
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"geodt {version}"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_help(capsys, command):
    if command in NEEDS_TORCH:
        pytest.importorskip("torch")
    text = help_text(capsys, [command])
    assert "usage:" in text and len(text) > 200, text


@pytest.mark.parametrize("argv", [["simulate"], ["plan"], ["sweep"], ["run"], ["validate"]])
def test_strategy_lists_agree(capsys, argv):
    if argv[0] in NEEDS_TORCH:
        pytest.importorskip("torch")
    assert ", ".join(STRATEGIES) in help_text(capsys, argv)  # every strategy, in the registry's order
    assert readme_reference("Strategies:") == list(STRATEGIES)


def test_preset_lists_agree(capsys):
    pytest.importorskip("torch")
    text = help_text(capsys, ["calibrate", "device"])
    assert f"preset ({', '.join(PRESETS)})" in text
    assert readme_reference("Model presets:") == list(PRESETS)


def test_run_help_does_not_claim_a_comparison(capsys):
    pytest.importorskip("torch")
    text = help_text(capsys, ["run"])
    assert "compared with the simulator" not in text and "default_out" not in help_text(capsys, ["simulate"])
