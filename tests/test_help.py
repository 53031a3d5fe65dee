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


NO_TORCH = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            "from geodt.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("argv, flags", [
    (["run"], ["--strategy", "--out", "--set"]),
    (["validate"], ["--strategy", "--trace", "--engine"]),
    (["calibrate"], ["device", "network", "scenario"]),
    (["calibrate", "device"], ["--model", "--out"]),
])
def test_help_reads_without_torch(argv, flags):
    """The core install has no torch: --help still lists the command's flags (issue 42)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", NO_TORCH, *argv, "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "needs torch" not in done.stdout + done.stderr
    for flag in flags:
        assert flag in done.stdout, (flag, done.stdout)


def test_run_without_torch_still_says_what_to_install():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", NO_TORCH, "run", "paper", "--strategy", "A"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 2 and "needs torch" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def every_help() -> list[list[str]]:
    from geodt.calibration.cli import MODES

    return [[c] for c in COMMANDS] + [["calibrate", m] for m in MODES] + [["profile", "check"]]


# Code a user does not read: module paths, CamelCase classes, ALL_CAPS constants (a placeholder
# of the usage line, such as RUN_DIR, is the user's own value; DiLoCo and MiB are words)
CODE = [re.compile(r"\b[\w/]+\.py\b"), re.compile(r"\b[A-Z][a-z]+[A-Z]\w*\b"), re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b")]
WORDS = {"DiLoCo", "KiB", "MiB", "GiB", "TiB"}


def code_names(text: str) -> list[str]:
    """The module paths, classes and constants a --help text names (module comment above)."""
    placeholders = (set(re.findall(r"\b[A-Z][A-Z0-9_]+\b", text.split("\n\n")[0]))
                    | set(re.findall(r"-[\w-]+[ =]\[?([A-Z][A-Z0-9_]*)", text)))
    found = {m.group(0) for pattern in CODE for m in pattern.finditer(text)}
    return sorted(found - placeholders - WORDS)


def test_code_names_finds_code():
    text = "usage: x [--out RUN_DIR]\n\nsee simulator/outputs/run_outputs.py, StagedOutput and WORK_ROWS; RUN_DIR/a.csv, 2 MiB"
    assert code_names(text) == ["StagedOutput", "WORK_ROWS", "simulator/outputs/run_outputs.py"]


@pytest.mark.parametrize("argv", every_help(), ids=" ".join)
def test_help_names_no_code(argv):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", NO_TORCH, *argv, "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert not code_names(done.stdout), f"geodt {' '.join(argv)} --help names code: {code_names(done.stdout)}"
