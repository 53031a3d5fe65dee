"""docs/DESIGN.md's scenario block, every section rendered from its keys.

Each section renders as the TOML lines DESIGN.md shows under "Scenario file": `key = default`
followed by the key's doc (allowed values first), for a required key `key = example`, or, for a
key absent by default, a commented `# key = example`. tests/test_scenario_schema.py asserts
DESIGN.md holds exactly these lines, so the doc cannot drift from the keys' one definition
(formats/sections.py, formats/scenario.py; [[nodes]]: simulator/scenario.py, passed in by the
caller since formats imports no stage); `python -m formats.scenario_doc` rewrites them.
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from formats.scenario import DilocoConfig, ModelSection
from formats.sections import REQUIRED, NetworkConfig, SimulationConfig, TrainingConfig

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md"
# (section name, its class, the comment on its header line), in DESIGN.md's order.
SECTIONS = (("model", ModelSection, ""), ("training", TrainingConfig, ""),
            ("network", NetworkConfig, "between nodes"),
            ("diloco", DilocoConfig, "the real executor's hyper-parameters (OpenDiLoCo's defaults)"),
            ("simulation", SimulationConfig, ""))
NODES = "nodes"  # [[nodes]]: an array of tables, its class simulator/scenario.py's NodeConfig
COLUMN = 26  # where the comments start, as in the rest of DESIGN.md's scenario block
WIDTH = 108  # the longest line a wrapped doc makes


def toml_value(value: Any) -> str:
    """`value` as inline TOML (a table's bare keys unquoted where TOML allows)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{k if re.fullmatch(r'[A-Za-z0-9_]+', k) else toml_value(k)} = {toml_value(v)}"
                 for k, v in value.items())
        return "{ " + ", ".join(items) + " }"
    if isinstance(value, float) and len(repr(value)) > 10:  # 2.15e8, not 215000000.0
        return f"{value:.6g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")
    return repr(value)


def _default(f) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return REQUIRED if f.default is MISSING else f.default


def _key_lines(f) -> list[str]:
    doc = f.metadata["doc"]
    if f.metadata["choices"]:
        doc = f"{' | '.join(f.metadata['choices'])}: {doc}"
    default = _default(f)
    if default is None:  # absent by default: shown commented, with an example, as DESIGN.md does
        lead, mark, rest = f"# {f.name} = {toml_value(f.metadata['example'])}", "", "#".ljust(COLUMN)
    else:
        shown = f.metadata["example"] if default is REQUIRED else default
        lead, mark, rest = f"{f.name} = {toml_value(shown)}", "# ", " " * COLUMN + "# "
    first = (lead.ljust(COLUMN) if len(lead) < COLUMN else lead + "  ") + mark
    return textwrap.wrap(doc, WIDTH, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False)


def render_section(name: str, cls: type | None = None) -> str:
    """The section's lines in DESIGN.md: its header, then every key in field order. `cls`: the
    class of a section not in SECTIONS ([[nodes]])."""
    comment = ""
    if cls is None:
        _, cls, comment = next(s for s in SECTIONS if s[0] == name)
    title = f"[[{name}]]" if name == NODES else f"[{name}]"
    header = title.ljust(COLUMN) + f"# {comment}" if comment else title
    lines = [header]
    for f in fields(cls):
        lines += _key_lines(f)
    return "\n".join(lines) + "\n"


def _section_pattern(name: str) -> re.Pattern:
    """A section's lines in DESIGN.md: from its header line up to the blank line (or the code
    block's end) that ends it."""
    title = rf"\[\[{name}\]\]" if name == NODES else rf"\[{name}\]"
    return re.compile(rf"^{title}[^\n]*\n(?:(?!```)[^\n]+\n)*", re.M)


def written_section(text: str, name: str) -> str | None:
    match = _section_pattern(name).search(text)
    return match.group(0) if match else None


def rewrite(path: Path = DESIGN, nodes: type | None = None) -> None:
    """Replace each section's lines in DESIGN.md with render_section() (and [[nodes]]'s, given its class)."""
    text = path.read_text()
    for name, cls in [(s[0], None) for s in SECTIONS] + ([(NODES, nodes)] if nodes else []):
        text = _section_pattern(name).sub(lambda _, name=name, cls=cls: render_section(name, cls), text, count=1)
    path.write_text(text)


if __name__ == "__main__":
    rewrite()
