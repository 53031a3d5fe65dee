"""The one error type for bad user input: its message is the whole one-line report."""


class InputError(ValueError):
    """Bad scenario, override or argument. str(err) names the file, the key and what was expected."""


class FieldError(ValueError):
    """Raised inside config dataclasses; the loader adds the file and the key path."""

    def __init__(self, key: str, expected: str):
        super().__init__(f"{key}: {expected}")
        self.key = key
        self.expected = expected
