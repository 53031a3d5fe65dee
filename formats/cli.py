"""The one argument parser of every geodt command: a usage error is one line and exit status 2.

argparse would print the usage block and then the error; geodt's rule for bad input (docs/DESIGN.md)
is one line naming what was wrong, on stderr, and status 2, the same for every command.
"""
from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors print `prog: message` on stderr and exit with status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")
