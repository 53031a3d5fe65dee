"""docs/DESIGN.md's scenario block for `[training]`, `[network]` and `[simulation]`, rendered from the keys.

Each section renders as the TOML lines DESIGN.md shows under "Scenario file": `key = default`
followed by the key's doc (allowed values first), or, for a key absent by default, a commented
`# key = example`. tests/test_scenario_schema.py asserts DESIGN.md holds exactly these lines,
so the doc cannot drift from formats/sections.py; `python -m formats.scenario_doc` rewrites them.
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import fields
from pathlib import Path
from typing import Any

from formats.sections import NetworkConfig, SimulationConfig, TrainingConfig

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md"
# (section name, its class, the comment on its header line), in DESIGN.md's order.
SECTIONS = (("training", TrainingConfig, ""), ("network", NetworkConfig, "between nodes"),
            ("simulation", SimulationConfig, ""))
COLUMN = 26  # where the comments start, as in the rest of DESIGN.md's scenario block
WIDTH = 108  # the longest line a wrapped doc makes


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def _key_lines(f) -> list[str]:
    doc = f.metadata["doc"]
    if f.metadata["choices"]:
        doc = f"{' | '.join(f.metadata['choices'])}: {doc}"
    if f.default is None:  # absent by default: shown commented, with an example, as DESIGN.md does
        lead, mark, rest = f"# {f.name} = {toml_value(f.metadata['example'])}", "", "#".ljust(COLUMN)
    else:
        lead, mark, rest = f"{f.name} = {toml_value(f.default)}", "# ", " " * COLUMN + "# "
    first = (lead.ljust(COLUMN) if len(lead) < COLUMN else lead + "  ") + mark
    return textwrap.wrap(doc, WIDTH, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False)


def render_section(name: str) -> str:
    """The section's lines in DESIGN.md: its header, then every key in field order."""
    _, cls, comment = next(s for s in SECTIONS if s[0] == name)
    header = f"[{name}]".ljust(COLUMN) + f"# {comment}" if comment else f"[{name}]"
    lines = [header]
    for f in fields(cls):
        lines += _key_lines(f)
    return "\n".join(lines) + "\n"


def _section_pattern(name: str) -> re.Pattern:
    """A section's lines in DESIGN.md: from its header line up to the blank line that ends it."""
    return re.compile(rf"^\[{name}\][^\n]*\n(?:[^\n]+\n)*", re.M)


def written_section(text: str, name: str) -> str | None:
    match = _section_pattern(name).search(text)
    return match.group(0) if match else None


def rewrite(path: Path = DESIGN) -> None:
    """Replace each section's lines in DESIGN.md with render_section()."""
    text = path.read_text()
    for name, _, _ in SECTIONS:
        text = _section_pattern(name).sub(lambda _, name=name: render_section(name), text, count=1)
    path.write_text(text)


if __name__ == "__main__":
    rewrite()
