"""docs/DESIGN.md's module map lists every module of the tree, once, and nothing else.

The map is generated from each module's docstring (its first sentence):
`python tests/test_design_map.py` rewrites it in place. The test checks the names, so a module
added, moved or removed without the map fails here.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("formats", "facts", "train", "calibrate", "simulator", "real", "geodt")
DESIGN = ROOT / "docs" / "DESIGN.md"


def modules(root: Path = ROOT) -> list[str]:
    return [str(p.relative_to(root)) for package in PACKAGES for p in sorted((root / package).rglob("*.py"))]


def first_sentence(path: Path) -> str:
    doc = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split("\n\n")[0].split())
    match = re.search(r"[.!?](\s|$)", doc)
    doc = doc[:match.end()].strip() if match else doc
    return doc if len(doc) <= 160 else doc[:160].rsplit(" ", 1)[0] + " …"


def render_map(root: Path = ROOT) -> str:
    lines = []
    for package in PACKAGES:
        lines += [f"**{package}/**", "", "| module | what it covers |", "|---|---|"]
        lines += [f"| `{m}` | {first_sentence(root / m).replace('|', '/')} |"
                  for m in modules(root) if m.startswith(package + "/")]
        lines.append("")
    return "\n".join(lines)


def mapped(text: str) -> list[str]:
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+\.py)` \|", section, flags=re.M)


def test_the_map_lists_every_module_once():
    listed = mapped(DESIGN.read_text())
    assert sorted(listed) == sorted(modules())
    assert len(listed) == len(set(listed))


def test_every_module_has_a_docstring():
    assert [m for m in modules() if not first_sentence(ROOT / m)] == []


def test_a_module_missing_from_the_map_is_caught(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f'"""{package}."""\n')
    text = "# x\n\n## Module map\n\n" + render_map(tmp_path) + "\n## Next\n"
    assert sorted(mapped(text)) == sorted(modules(tmp_path))
    (tmp_path / "real" / "new.py").write_text('"""A new module."""\n')
    assert sorted(mapped(text)) != sorted(modules(tmp_path))


def rewrite(path: Path = DESIGN) -> None:
    """Replace the tables under "## Module map" (up to the next section) with render_map()."""
    head, rest = path.read_text().split("## Module map", 1)
    section, tail = rest.split("\n## ", 1)
    intro = section.split("**formats/**", 1)[0]
    path.write_text(head + "## Module map" + intro + render_map().rstrip() + "\n\n## " + tail)


if __name__ == "__main__":
    rewrite()
