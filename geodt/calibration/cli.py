"""`geodt calibrate MODE ...`: one command, a subcommand per thing measured.

- `device`: one device's step time and peak memory per batch size -> a profile (calibrate/cli.py);
- `network`: the executor's sync, outer step and checkpoint between processes of this machine
  -> a network profile (links.py); with `--wan shaped --scenario S`, on the scenario's own shaped
  links (wan_links.py);
- `scenario`: every CPU device of a scenario at once, under its limits -> one profile each
  (scenario.py);
- `convergence`: short real runs of the strategies -> a convergence profile (convergence.py).

The spellings before subcommands (`geodt calibrate --device ...`, `--network`, `--scenario`) still
work, with a one-line note, until geodt 0.3.
"""
from __future__ import annotations

import importlib
import sys

# mode -> (module, entry point, one-line help)
MODES: dict[str, tuple[str, str, str]] = {
    "device": ("geodt.calibration.device", "main",
               "step time and peak memory per batch size on a device -> a profile CSV"),
    "network": ("geodt.calibration.links", "main",
                ("the executor's sync, outer step and checkpoint between processes -> a network profile "
                "(--wan shaped --scenario S: on the scenario's shaped links)")),
    "scenario": ("geodt.calibration.scenario", "main",
                 "every CPU device of a scenario at once, under its limits -> one profile each"),
    "convergence": ("geodt.calibration.convergence", "main",
                    "short real runs of the strategies on real text -> a convergence profile (loss per token)"),
}
PARSERS = {"device": ("calibrate.cli", "calibrate_parser"), "network": ("geodt.calibration.links", "parser"),
           "network --wan shaped": ("geodt.calibration.wan_links", "parser"),
           "scenario": ("geodt.calibration.scenario", "parser"),
           "convergence": ("geodt.calibration.convergence", "parser")}


def _has(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def usage() -> str:
    lines = ["usage: geodt calibrate MODE [options]   (geodt calibrate MODE --help for each)", "", "modes:"]
    lines += [f"  {name:<9} {text}" for name, (_, _, text) in MODES.items()]
    lines += ["", "options of each mode:"]
    for _name, (module, function) in PARSERS.items():
        text = getattr(importlib.import_module(module), function)().format_usage().strip()
        lines.append("  " + text.removeprefix("usage: ").replace("\n", "\n  "))
    return "\n".join(lines)


def old_spelling(argv: list[str]) -> str:
    """The mode an argument list without one meant (the spellings before subcommands)."""
    if "--network" in argv:
        return "network"
    return "scenario" if _has(argv, "--scenario") else "device"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in MODES:
        mode, rest = argv[0], argv[1:]
    elif argv[0].startswith("-"):
        mode, rest = old_spelling(argv), [a for a in argv if a != "--network"]
        print(f"geodt calibrate: note: this spelling is now `geodt calibrate {mode} ...`; "
              "the old one works until geodt 0.3", file=sys.stderr)
    else:
        print(f"geodt calibrate: unknown mode {argv[0]!r}; expected one of {', '.join(MODES)}", file=sys.stderr)
        return 2
    module, function, _ = MODES[mode]
    if mode == "network" and _has(rest, "--wan"):
        module = "geodt.calibration.wan_links"
    return int(getattr(importlib.import_module(module), function)(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
