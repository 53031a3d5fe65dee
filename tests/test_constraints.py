"""constraints.txt, the versions the tests last passed with: every package geodt[all] names is pinned,
inside the range pyproject.toml asks for, so `pip install -c constraints.txt -e '.[all]'` reproduces it."""
from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def pins() -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in (ROOT / "constraints.txt").read_text().splitlines()]
    found = {}
    for line in filter(None, lines):
        name, version = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line).groups()
        found[canonicalize_name(name)] = version
    return found


def requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in named if not r.startswith("geodt[")]


def test_every_requirement_is_pinned_inside_its_range():
    pinned = pins()
    for requirement in requirements():
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue  # tomli: only below Python 3.11
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"constraints.txt does not pin {requirement.name}"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {name}=={pinned[name]}, outside pyproject.toml's {requirement}")


def test_torch_pin_matches_every_build():
    """A local label (+cpu) would match only the CPU index's wheel: pinned without it, CUDA builds match too."""
    assert "+" not in pins()["torch"]
