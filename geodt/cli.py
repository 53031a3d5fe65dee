"""The `geodt` command: a table of subcommands, each a `main(argv) -> int` imported lazily.

Lazy imports keep `geodt simulate` free of torch: only the subcommand that runs is imported, and
the commands that need torch import it only once they run (their --help reads without it).
A reader of stdout that goes away (`| head -3`) ends the command quietly: formats/stdout.py.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from formats.stdout import closed_stdout_status

# subcommand -> (module, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "simulate": ("simulator.cli", "simulate_main", "simulate DiLoCo rounds for each strategy"),
    "plan": ("simulator.cli", "plan_main", "print and write one strategy's plan"),
    "sweep": ("simulator.sweep.sweep_cli", "main", "what-if sweeps over node mixes"),
    "calibrate": ("geodt.calibration.cli", "main", ("measure a device, the links between processes, or a "
                  "scenario's devices (modes: device, network, scenario)")),
    "profile": ("simulator.models.profile_check", "profile_main", "inspect a calibration profile (profile check)"),
    "run": ("geodt.run_cmd", "run_main", "real DiLoCo training with a strategy's plan"),
    "validate": ("geodt.run_cmd", "validate_main", "simulate and run a plan, compare them"),
    "paper": ("geodt.paper", "main", "regenerate the papers' tables and figures"),
    "catalog": ("geodt.catalog_cmd", "catalog_main", "list the GPU types and model presets a scenario can name"),
}

# subcommand -> the extra that installs torch for it (the core install has no torch)
NEEDS_TORCH: dict[str, str] = {"calibrate": "calibrate", "run": "real", "validate": "real"}


def installed(package: str) -> str | None:
    """The installed distribution's version, None where it is not installed (metadata only: no import)."""
    # deferred: importlib.metadata brings email, zipfile and csv; geodt --help reads no version
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def version() -> str:
    """The installed distribution's version; from a checkout not installed, pyproject.toml's."""
    found = installed("geodt")
    if found is not None:
        return found
    from formats.toml import tomllib  # noqa: PLC0415  deferred: a checkout not installed only; --help reads no TOML

    return tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["version"]


# What a bug report needs beside geodt's own version: the interpreter and the packages whose behaviour
# changes geodt's numbers or its runs (torch, transformers and torchft only where installed).
REPORTED_PACKAGES = ("numpy", "pandas", "simpy", "torch", "transformers", "torchft")


def versions() -> str:
    """geodt's version, then Python's and each reported package's installed version (metadata only: no import)."""
    # sys.version's first word is platform.python_version(): geodt --help imports no platform
    parts = [f"geodt {version()}", f"python {sys.version.split()[0]}"]
    for package in REPORTED_PACKAGES:
        found = installed(package)
        parts.append(f"{package} {found}" if found is not None else f"{package} not installed")
    return "\n".join(parts)


def usage() -> str:
    lines = ["usage: geodt COMMAND [options]   (geodt COMMAND --help for each; geodt --version)", "", "commands:"]
    for name, (_, _, text) in COMMANDS.items():
        lines.append(f"  {name:<10} {text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(versions())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"geodt: unknown command {name!r}; expected one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module_name, function_name, _ = COMMANDS[name]
    if name == "plan" and any(a == "--export" or a.startswith("--export=") for a in rest):
        module_name, function_name = "geodt.torchft_export", "plan_export_main"  # plan, then its torchft launch
    # --help reads without torch: every command's parser is built from torch-free modules (tests/test_help.py)
    wants_help = any(a in ("-h", "--help") for a in rest)
    missing = [p for p in ("torch", "transformers")
               if name in NEEDS_TORCH and not wants_help and importlib.util.find_spec(p) is None]
    if missing:
        extra = NEEDS_TORCH[name]
        print(f"geodt {name}: needs {' and '.join(missing)}, not installed; install with pip install 'geodt[{extra}]' "
              f"(from a checkout: pip install -e '.[{extra}]')", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"geodt: command {name!r} is not available in this build", file=sys.stderr)
            return 2
        raise
    try:
        status = int(getattr(module, function_name)(rest) or 0)
        sys.stdout.flush()  # a reader gone shows here, not in the interpreter's flush at exit
        return status
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT; outputs are atomic
        print(f"geodt {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError as exc:  # stdout's reader went away (| head): quiet, exit 141; another pipe raises
        return closed_stdout_status(exc)

if __name__ == "__main__":
    raise SystemExit(main())
