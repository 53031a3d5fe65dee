"""The check every refusal test makes: exit status 2 and one line on stderr naming what it must."""
from __future__ import annotations


def one_line_exit_2(capsys, code, *needles) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err
