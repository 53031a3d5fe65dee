"""The one error type for bad user input: its message is the whole one-line report; the one line for an
output that cannot be written (a full disk, a quota, a read-only file system); "did you mean" for a
mistyped name."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the closest of `choices` to a mistyped `word` (difflib), else ""."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class InputError(ValueError):
    """Bad scenario, override or argument. str(err) names the file, the key and what was expected."""


class FieldError(ValueError):
    """Raised inside config dataclasses; the loader adds the file and the key path."""

    def __init__(self, key: str, expected: str):
        super().__init__(f"{key}: {expected}")
        self.key = key
        self.expected = expected


STAGED = "nothing was replaced (outputs are staged and renamed whole)"


def write_error(out, exc: OSError, kept: str = STAGED) -> str:
    """An OSError met while writing --out as one line: the path, the system's words ("No space left on
    device" for a full disk), and what is left (ENOSPC, EDQUOT, EROFS, EACCES alike: each output is
    written to a temporary name first). Every command's one line for it."""
    return (f"--out {out}: cannot write {exc.filename or out} ({exc.strerror or exc}); {kept}: free space or "
            "choose another --out")
