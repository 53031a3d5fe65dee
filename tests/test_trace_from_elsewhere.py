"""`geodt validate --trace RUN_DIR` on a folder from elsewhere (issue 59): data, never directions.

Was: a `validation` symlink planted in RUN_DIR was written through (a user's validation.csv
elsewhere replaced); a trace with every row twice reported idle and rounds exactly doubled, exit
0; a NaN or negative time ended in a traceback (issue 58). Now each is one line, exit 2, and
both folders as they were."""
from __future__ import annotations

import pandas as pd
import pytest

from geodt.run_cmd import validate_main
from tests.test_validate import _finished_run

RECORD = {"mode": "measured", "time_scale": 1.0}


def _tree(root):
    return {str(p.relative_to(root)): (p.is_symlink(), p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_planted_validation_link_is_not_written_through(tmp_path, capsys):
    run = _finished_run(tmp_path / "run", RECORD)
    elsewhere = tmp_path / "users"
    elsewhere.mkdir()
    (elsewhere / "validation.csv").write_text("my own validation\n")
    (run / "validation").symlink_to(elsewhere)
    before, theirs = _tree(run), _tree(elsewhere)
    assert validate_main(["--trace", str(run)]) == 2
    assert _one_line(capsys) == (f"geodt validate: --trace {run}: validation is a symbolic link (to {elsewhere}); "
                                 "geodt never writes through a link found in a run folder; remove it, or give "
                                 "--out outside the run folder")
    assert _tree(run) == before and _tree(elsewhere) == theirs
    assert validate_main(["--trace", str(run), "--out", str(tmp_path / "mine")]) == 0  # the user's choice
    assert (elsewhere / "validation.csv").read_text() == "my own validation\n"


def test_a_link_deeper_in_the_out_path_inside_the_run_is_refused(tmp_path, capsys):
    run = _finished_run(tmp_path / "run", RECORD)
    (tmp_path / "users").mkdir()
    (run / "reports").symlink_to(tmp_path / "users")
    assert validate_main(["--trace", str(run), "--out", str(run / "reports" / "v")]) == 2
    assert "reports is a symbolic link" in _one_line(capsys)
    assert list((tmp_path / "users").iterdir()) == []


def _with_trace(run, change) -> None:
    trace = pd.read_csv(run / "trace.csv")
    change(trace).to_csv(run / "trace.csv", index=False)


@pytest.mark.parametrize("change, message", [
    (lambda t: pd.concat([t, t]), ("line {n}: node {node} round 0 is given 2 times; expected one row per node "
                                   "and round (a trace concatenated twice?)")),
    (lambda t: t.assign(idle_s=t["idle_s"].where(t.index != 1, float("nan"))),
     "line 3: idle_s = nan; expected a finite number of seconds >= 0"),
    (lambda t: t.assign(round_end_s=t["round_end_s"].where(t.index != 0, -1.0)),
     "line 2: round_end_s = -1.0; expected a finite number of seconds >= 0"),
    (lambda t: t.assign(compute_s=t["compute_s"].where(t.index != 2, float("inf"))),
     "line 4: compute_s = inf; expected a finite number of seconds >= 0"),
])
def test_a_trace_that_would_give_a_silent_wrong_answer_is_refused(tmp_path, capsys, change, message):
    run = _finished_run(tmp_path / "run", RECORD)
    rows = len(pd.read_csv(run / "trace.csv"))
    first = pd.read_csv(run / "trace.csv")["node"].iloc[0]
    _with_trace(run, change)
    before = _tree(run)
    assert validate_main(["--trace", str(run)]) == 2
    line = _one_line(capsys)
    assert line == f"geodt validate: {run / 'trace.csv'}: " + message.format(n=rows + 2, node=first), line
    assert _tree(run) == before  # no validation folder


def test_an_out_holding_another_commands_outputs_is_refused_unless_force(tmp_path, capsys):
    run = _finished_run(tmp_path / "run", RECORD)
    other = tmp_path / "sweep"
    other.mkdir()
    (other / "sweep.csv").write_text("mine\n")
    assert validate_main(["--trace", str(run), "--out", str(other)]) == 2
    assert "holds another command's outputs (sweep.csv)" in _one_line(capsys)
    assert sorted(p.name for p in other.iterdir()) == ["sweep.csv"]
    assert validate_main(["--trace", str(run), "--out", str(other), "--force"]) == 0
