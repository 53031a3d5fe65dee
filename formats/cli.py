"""The one argument parser of every geodt command: a usage error is one line and exit status 2.

argparse would print the usage block and then the error; geodt's rule for bad input (docs/DESIGN.md)
is one line naming what was wrong, on stderr, and status 2, the same for every command.
"""
from __future__ import annotations

import argparse
import io
import re
import textwrap
from dataclasses import fields
from types import SimpleNamespace

from formats.errors import FieldError
from formats.sections import SECTION_CLASSES


def whole_lines(raw: io.RawIOBase, encoding: str = "utf-8") -> io.TextIOWrapper:
    """A text stream over `raw` that hands each line to it in one write. Processes sharing a
    pipe (the nodes of a run stopping together) would otherwise interleave their lines: print()
    writes the text and its newline separately, and PYTHONUNBUFFERED makes each a write(2)."""
    return io.TextIOWrapper(io.BufferedWriter(raw, buffer_size=1 << 16), encoding=encoding,
                            errors="backslashreplace", line_buffering=True)


class LinesHelpFormatter(argparse.HelpFormatter):
    """argparse's help, but a description's own lines kept (each wrapped alone, its indent kept): a
    table such as the strategies, one line each, stays a table."""

    def _fill_text(self, text, width, indent):
        lines = []
        for line in text.splitlines():
            lead = line[:len(line) - len(line.lstrip())]
            column = re.match(r"\s*\S{1,20}\s{2,}", line)  # `name  text`: continue under the text
            hang = " " * (column.end() - len(lead)) if column else ""
            lines.append(textwrap.fill(line.strip(), width, initial_indent=indent + lead,
                                       subsequent_indent=indent + lead + hang) if line.strip() else "")
        return "\n".join(lines)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors print `prog: message` on stderr and exit with status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", LinesHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


def group_options(parser: argparse.ArgumentParser, groups: dict[str, list[str]]) -> None:
    """--help by purpose: move each named option (its first flag) out of the flat list into the titled
    group, groups in the order given; options named nowhere stay under "options"."""
    flat = parser._optionals  # argparse's own default group; moving an action changes only its --help place
    by_flag = {action.option_strings[0]: action for action in flat._group_actions if action.option_strings}
    for title, flags in groups.items():
        group = parser.add_argument_group(title)
        for flag in flags:
            action = by_flag[flag]
            flat._group_actions.remove(action)
            group._group_actions.append(action)


def add_strategy_list(parser: argparse.ArgumentParser, lines: str) -> None:
    """A --help section naming every strategy --strategy takes, one line each (`lines`, from the registry)."""
    parser.add_argument_group("strategies (--strategy NAME)", lines)


DIGITS = re.compile(r"[0-9]{1,12}")  # ASCII digits only: str.isdigit() accepts '²', which int() refuses


def _int_at_least(text: str, minimum: int, expected: str) -> int:
    stripped = text.strip()
    value = int(stripped) if re.fullmatch(r"[+-]?[0-9]{1,18}", stripped) else minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer > 0."""
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
    return value


# Command-line shorthands for scenario keys (--target-loss for [training] target_loss, ...): made from
# the key's one definition, so the value is parsed and checked as the key is, and given to the scenario
# as a `--set` override, which scenario.toml then records.
SHORTHANDS = {"target_loss": ("training", "--target-loss", "L"),
              "checkpoint_every": ("training", "--checkpoint-every", "K")}


def add_key_option(parser: argparse._ActionsContainer, name: str, purpose: str) -> None:
    """--flag for the scenario key SHORTHANDS[name]: `purpose` says what the command does with it."""
    section, flag, metavar = SHORTHANDS[name]
    parser.add_argument(flag, type=_key_type(section, name), default=None, metavar=metavar,
                        help=f"[{section}] {name}: {purpose}")


def key_overrides(args: argparse.Namespace) -> list[str]:
    """The shorthands given on the command line, as `--set` overrides (section.key=value)."""
    return [f"{section}.{name}={getattr(args, name)!r}" for name, (section, _, _) in SHORTHANDS.items()
            if getattr(args, name, None) is not None]


def _key_type(section: str, name: str):
    """argparse type: the text as the key's type (int or float), then the key's own checks."""
    f = next(f for f in fields(SECTION_CLASSES[section]) if f.name == name)
    number = int if "int" in str(f.type) else float

    def parse(text: str):
        try:
            value = number(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {'an integer' if number is int else 'a number'}") \
                from None
        try:
            for check in f.metadata["checks"]:
                check(SimpleNamespace(**{name: value}), name)
        except FieldError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc.expected}") from None
        return value

    parse.__name__ = name  # argparse names the type in its own messages
    return parse
