"""The README, tested (issue 58): every ```toml block and every command line of its ```bash blocks
runs, so a README that drifts from the code fails CI.

Each `geodt` line runs in-process (geodt.cli.main) in a fresh folder holding the README's own
cluster as my-cluster.toml, the repository's profiles/ and docs/, and must exit 0. Lines that start
processes or train run in the slow tier, block by block in the README's order (an earlier line
writes what a later one reads), with options appended that shorten them without changing where
outputs go (QUICKER). "A first hour" is run in order by tests/test_journeys.py, which also checks
that no command removes another's outputs. Lines that need what this machine cannot give (a GPU,
root and cgroup quotas, minutes of calibration) are checked against their command's --help: every
option they pass must exist (PARSE_ONLY, each with its reason). `pip install` and `python -m pytest`
lines are checked against pyproject.toml and constraints.txt.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from pathlib import Path

import pytest
import tomllib

from geodt.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

# Lines this machine cannot run as written, by a substring of the line, and why.
PARSE_ONLY = {
    "--device cuda:0": "needs a CUDA GPU",
    "profile check profiles/a30.csv": "reads the profile the GPU calibration above writes",
    "calibrate scenario": "needs root and a cgroup cpu controller (the scenario's CPU quotas)",
    "out/first-calibration/one-0.csv": "reads what calibrate scenario writes",
    "validate docs/first-calibration.toml": "needs root (CPU quotas) and the journey's calibrations",
    "--out out/first-calibration/net.csv": "part of the calibration journey, which needs root",
    "calibrate convergence": "about five minutes of real training runs (tests/test_convergence.py runs the mode)",
}
# Options that only shorten a command (fewer rounds, steps, repeats, one worker): where outputs go is unchanged.
SMALL_RUN = ["--set", "training.rounds=1", "--set", "training.local_steps=2", "--time-scale", "0.2",
             "--no-progress", "--threads", "1"]
QUICKER = {"run": SMALL_RUN, "validate": SMALL_RUN, "sweep": ["--workers", "1"],
           "calibrate network": ["--repeats", "3", "--max-mib", "16"]}


def fenced(language: str) -> list[tuple[str, str]]:
    """(the heading above, the block's text) of each ```language block."""
    found = []
    for match in re.finditer(rf"^```{language}\n(.*?)^```", README, flags=re.M | re.S):
        heading = re.findall(r"^#+ (.*)$", README[:match.start()], flags=re.M)[-1]
        found.append((heading, match.group(1)))
    return found


def command_lines() -> list[tuple[str, int, str]]:
    """(heading, index of the block, line) for every command line of every ```bash block."""
    lines = []
    for i, (heading, text) in enumerate(fenced("bash")):
        for line in text.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                lines.append((heading, i, line.strip()))
    return lines


def geodt_argv(line: str) -> list[str]:
    return shlex.split(line, comments=True)[1:]


def kind(line: str) -> str:
    """parse (PARSE_ONLY), fast (no process, no training) or slow."""
    if any(key in line for key in PARSE_ONLY):
        return "parse"
    argv = geodt_argv(line)
    if argv[0] in ("simulate", "plan", "catalog", "--version") or argv[:2] == ["sweep", "--table"]:
        return "fast"
    if argv[0] == "profile" and (ROOT / argv[2]).is_file():
        return "fast"
    return "slow"


def the_cluster() -> str:
    """The README's own cluster: the ```toml block that `my-cluster.toml` names."""
    (text,) = [t for _, t in fenced("toml") if 'name = "my-cluster"' in t]
    return text


@pytest.fixture
def readme_folder(tmp_path, monkeypatch):
    """A fresh folder as a user's checkout: the README's cluster, profiles/ and docs/ beside it."""
    (tmp_path / "my-cluster.toml").write_text(the_cluster())
    shutil.copytree(ROOT / "profiles", tmp_path / "profiles")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def geodt(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue()


def quicker(argv: list[str]) -> list[str]:
    key = " ".join(argv[:2]) if " ".join(argv[:2]) in QUICKER else argv[0]
    return argv + QUICKER.get(key, [])


def test_the_readme_has_what_this_test_reads():
    assert len(README.splitlines()) <= 300, "README.md is a guide: at most 300 lines (details in docs/GUIDE.md)"
    assert fenced("toml") and len(command_lines()) >= 20
    used = [key for key in PARSE_ONLY if any(key in line for _, _, line in command_lines())]
    assert used == list(PARSE_ONLY), f"PARSE_ONLY names lines the README no longer has: {set(PARSE_ONLY) - set(used)}"
    words = {line.split()[0] for _, _, line in command_lines()}
    assert words <= {"geodt", "pip", "python", "mkdir"}, words - {"geodt", "pip", "python", "mkdir"}


@pytest.mark.parametrize("block", [t for _, t in fenced("toml")], ids=lambda t: t.splitlines()[0])
def test_every_toml_block_simulates(readme_folder, block):
    """The README's example cluster, as written, simulates (issue 58: it crashed)."""
    (readme_folder / "block.toml").write_text(block)
    code, out = geodt(["simulate", "block.toml", "--out", "out/block"])
    assert code == 0, out
    assert (readme_folder / "out" / "block" / "summary.csv").is_file()


# each distinct command once (the quick start, the first hour and Journey 1 share `geodt simulate paper`)
FAST = list(dict.fromkeys(" ".join(geodt_argv(line)) for _, _, line in command_lines()
                          if line.startswith("geodt ") and kind(line) == "fast"))


@pytest.mark.parametrize("command", FAST)
def test_fast_command_runs(readme_folder, command):
    code, out = geodt(quicker(shlex.split(command)))
    assert code == 0, f"geodt {command}\n{out[-3000:]}"


def slow_blocks() -> list[int]:
    """The ```bash blocks with a slow line, but for "A first hour" (tests/test_journeys.py runs it in order)."""
    return sorted({i for heading, i, line in command_lines()
                   if line.startswith("geodt ") and kind(line) == "slow" and heading != "A first hour"})


@pytest.mark.slow
@pytest.mark.parametrize("block", slow_blocks())
def test_slow_block_runs_in_order(readme_folder, block):
    pytest.importorskip("torch")
    for heading, i, line in command_lines():
        if i != block:
            continue
        if line.startswith("mkdir "):
            (readme_folder / shlex.split(line)[-1]).mkdir(parents=True, exist_ok=True)
            continue
        if not line.startswith("geodt ") or kind(line) == "parse":
            continue
        code, out = geodt(quicker(geodt_argv(line)))
        assert code == 0, f"{heading}: {line}\n{out[-3000:]}"


def help_of(argv: list[str]) -> str:
    words = argv[:2] if argv[0] in ("calibrate", "profile") else argv[:1]
    code, text = geodt([*words, "--help"])
    assert code == 0, text
    return text


@pytest.mark.parametrize("line", [line for _, _, line in command_lines() if kind(line) == "parse"],
                         ids=lambda line: " ".join(geodt_argv(line))[:60])
def test_parse_only_command_names_options_that_exist(line):
    """A line this machine cannot run: its command exists and every option it passes is in its --help."""
    argv = geodt_argv(line)
    assert argv[0] in COMMANDS, argv[0]
    if argv[0] in ("calibrate", "validate", "run"):
        pytest.importorskip("torch")
    text = help_of(argv)
    for option in (a.split("=")[0] for a in argv if a.startswith("--")):
        assert option in text, f"{line}: {option} is not an option of geodt {argv[0]}"


def test_install_lines_name_what_exists():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    pip_lines = [line for _, _, line in command_lines() if line.startswith("pip ")]
    assert pip_lines
    for line in pip_lines:
        for extra in re.findall(r"\.\[([\w,]+)\]", line):
            assert set(extra.split(",")) <= set(project["optional-dependencies"]), line
        for version in re.findall(r"torch==(\S+)", line):
            assert version == pins["torch"], f"{line}: constraints.txt tests torch {pins['torch']}"
    assert any("--index-url https://download.pytorch.org/whl/cpu" in line for line in pip_lines)


def test_test_lines_name_markers_that_exist():
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    names = {m.split(":")[0] for m in markers}
    lines = [line for _, _, line in command_lines() if "python -m pytest" in line]
    assert lines
    for line in lines:
        for expression in re.findall(r'-m "([^"]+)"', line):
            assert set(re.findall(r"\w+", expression)) - {"not", "and", "or"} <= names, line


def test_every_link_names_a_file_and_heading_that_exist():
    """A README that points at moved text fails: each relative link's file exists, and its #anchor is a heading there."""
    def anchor(heading: str) -> str:  # GitHub's: lower case, punctuation dropped, spaces to hyphens
        return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")

    for target in re.findall(r"\]\(([^)]+)\)", README):
        if target.startswith(("http://", "https://")):
            continue
        path, _, fragment = target.partition("#")
        file = ROOT / path
        assert file.exists(), f"README links to {path}, which does not exist"
        if fragment:
            headings = re.findall(r"^#+ (.*)$", file.read_text(), flags=re.M)
            assert fragment in {anchor(h) for h in headings}, f"README links to {target}: no such heading"


def test_the_strategy_table_is_the_registrys():
    """"What each strategy does" says what --help says: one row per registered strategy, its summary."""
    from simulator.strategies.registry import SUMMARIES

    rows = re.findall(r"^\| `([\w-]+)` \| (.+) \|$", README.split("## What each strategy does")[1].split("\n## ")[0],
                      flags=re.M)
    assert dict(rows) == SUMMARIES and [name for name, _ in rows] == list(SUMMARIES)
