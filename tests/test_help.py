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


def readme_strategies() -> list[str]:
    """The strategies README.md's "What each strategy does" table names, in its order (the one list of
    them in the README; tests/test_readme.py checks its summaries against the registry's)."""
    text = (ROOT / "README.md").read_text()
    assert "## What each strategy does" in text, "README.md has no '## What each strategy does' section"
    section = text.split("## What each strategy does")[1].split("\n## ")[0]
    return re.findall(r"^\| `([\w-]+)` \|", section, flags=re.M)


def test_version(capsys):
    """geodt's version first, then what a bug report needs: Python and each package that moves geodt's numbers."""
    import platform
    from importlib.metadata import version as installed

    assert main(["--version"]) == 0
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:3] == [f"geodt {version}", f"python {platform.python_version()}", f"numpy {installed('numpy')}"]
    assert [line.split()[0] for line in lines] == ["geodt", "python", "numpy", "pandas", "simpy", "torch",
                                                   "transformers", "torchft"]


def test_version_names_a_package_not_installed(capsys, monkeypatch):
    """A package missing from the install is named as such (a core install has no torch), not an error."""
    import importlib.metadata

    real = importlib.metadata.version

    def without_torch(name):
        if name == "torch":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", without_torch)
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert "torch not installed" in out.splitlines() and f"pandas {real('pandas')}" in out.splitlines()


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
    assert [name for name in readme_strategies() if name in STRATEGIES] == list(STRATEGIES)


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


def test_every_strategy_has_a_one_line_summary():
    from simulator.strategies.registry import BARRIERLESS, SUMMARIES

    assert list(SUMMARIES) == [*STRATEGIES, *BARRIERLESS]
    assert all(0 < len(text) <= 110 and "\n" not in text for text in SUMMARIES.values())


@pytest.mark.parametrize("argv", [["simulate"], ["plan"], ["sweep"], ["run"], ["validate"]])
def test_help_describes_every_strategy(capsys, argv):
    """--help lists each strategy with what it does, one line each (wrapped under its name)."""
    from simulator.strategies.registry import BARRIERLESS, SUMMARIES

    text = help_text(capsys, argv)  # whitespace folded: a wrapped line reads as one
    assert "strategies (--strategy NAME):" in text
    names = list(STRATEGIES) + ([] if argv == ["sweep"] else list(BARRIERLESS))
    for name in names:
        assert f"{name} {SUMMARIES[name]}" in text, name


@pytest.mark.parametrize("validate", [False, True])
def test_run_and_validate_help_is_grouped_by_purpose(validate):
    """Every option of run and validate sits in a titled group (geodt/run_cmd.py RUN_GROUPS): none in the flat list."""
    from geodt.run_cmd import RUN_GROUPS, VALIDATE_GROUPS, _parser

    parser = _parser("geodt validate" if validate else "geodt run", validate)
    left = [a.option_strings[0] for a in parser._optionals._group_actions if a.option_strings != ["-h", "--help"]]
    assert left == [], f"options in no group: {left}; add them to RUN_GROUPS / VALIDATE_GROUPS"
    titles = [g.title for g in parser._action_groups]
    expected = list(RUN_GROUPS) + (list(VALIDATE_GROUPS) if validate else [])
    assert [t for t in titles if t in expected] == expected


@pytest.mark.parametrize("argv, suggestion", [
    (["simulate", "paper", "--strategy", "hybird"], "did you mean 'hybrid'?"),
    (["plan", "paper", "--strategy", "measured-step"], "did you mean 'measured-steps'?"),
    (["plan", "paper", "--strategy", "quorom"], "did you mean 'quorum'?"),
    (["sweep", "--table", "paper", "--strategy", "rebalanse"], "did you mean 'rebalance'?"),
    (["simulate", "paper", "--set", "training.round=3"], "did you mean 'rounds'?"),
    (["simulate", "paper", "--set", "network.bandwith_gbps=3"], "did you mean 'bandwidth_gbps'?"),
])
def test_did_you_mean(capsys, tmp_path, argv, suggestion):
    from one_line import one_line_exit_2

    one_line_exit_2(capsys, main([*argv, "--out", str(tmp_path / "out")]), suggestion)
    assert not (tmp_path / "out").exists()


def test_did_you_mean_a_misspelt_section_in_a_file(capsys, write_scenario, tmp_path):
    from one_line import one_line_exit_2

    path = write_scenario('name = "x"\n[traning]\nrounds = 2\n[[nodes]]\nname = "a"\ngpus = { "a30" = 1 }\n')
    one_line_exit_2(capsys, main(["simulate", str(path), "--out", str(tmp_path / "out")]),
                    f"{path}: traning: unknown key", "did you mean 'training'?")


def test_no_suggestion_for_a_word_far_from_every_name(capsys, tmp_path):
    from one_line import one_line_exit_2

    err = one_line_exit_2(capsys, main(["simulate", "paper", "--strategy", "zzz", "--out", str(tmp_path / "o")]))
    assert "did you mean" not in err


def test_strategy_lines_stay_a_table_and_prose_wraps_flush(capsys):
    """The strategies keep one line each, continued under their text; a description wraps at the margin."""
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    lines = capsys.readouterr().out.splitlines()
    width = len("  measured-steps  ")
    assert any(line.startswith("  quorum" + " " * (width - len("  quorum"))) for line in lines)
    following = lines[next(i for i, line in enumerate(lines) if line.startswith("  quorum")) + 1]
    assert following.startswith(" " * width) and not following.startswith(" " * (width + 1))
    description = lines[lines.index("") + 1:lines.index("", lines.index("") + 1)]
    assert len(description) > 1 and not any(line.startswith(" ") for line in description)
