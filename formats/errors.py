"""The one error type for bad user input: its message is the whole one-line report."""
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
