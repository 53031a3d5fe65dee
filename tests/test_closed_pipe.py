"""A reader of stdout that goes away (`geodt simulate paper | head -3`) ends the command quietly, as it ends a
Unix tool: exit status 141 (128 + SIGPIPE), nothing on stderr about it, the outputs written (formats/stdout.py).
Before: a BrokenPipeError traceback (simulate, plan), or `geodt sweep` blaming the disk ("cannot write ...
(Broken pipe) ... free space"), exit 2."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import types

import pytest

from formats.stdout import SIGPIPE_STATUS
from geodt import cli


def _closed_stdout():
    """A text stdout onto a pipe whose reader is already closed: every write to it fails (EPIPE)."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    return io.TextIOWrapper(io.FileIO(write_fd, "w"), encoding="utf-8", line_buffering=True)


def test_simulate_into_a_closed_pipe_exits_141_quietly(tmp_path, monkeypatch, capsys):
    stdout = _closed_stdout()
    monkeypatch.setattr(sys, "stdout", stdout)
    out = tmp_path / "o"
    assert cli.main(["simulate", "paper", "--strategy", "baseline", "C", "--out", str(out)]) == SIGPIPE_STATUS
    assert capsys.readouterr().err == ""
    assert (out / "summary.csv").stat().st_size > 0  # written before the first line is printed
    print("more")  # stdout now leads to /dev/null: a later write (the interpreter's flush at exit) passes
    stdout.flush()


def test_another_broken_pipe_is_not_taken_for_the_reader(monkeypatch):
    """A pipe to a child process or a socket that breaks is a fault: raised, not a quiet 141."""
    def command(argv):
        raise BrokenPipeError(32, "Broken pipe")

    module = types.ModuleType("pipe_command")
    module.main = command
    monkeypatch.setitem(sys.modules, "pipe_command", module)
    monkeypatch.setitem(cli.COMMANDS, "simulate", ("pipe_command", "main", ""))
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    with pytest.raises(BrokenPipeError):
        cli.main(["simulate", "paper"])


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["simulate", "paper"], ["plan", "paper", "--strategy", "C"],
                                  ["-m", "simulator", "paper", "--strategy", "baseline"],
                                  ["sweep", "--table", "paper"],
                                  ["sweep", "--gpu-types", "a30,v100", "--samples", "4", "--workers", "1",
                                   "--no-figures"]])
def test_commands_into_a_closed_pipe_end_quietly(tmp_path, argv):
    """The whole process, stdout a pipe closed before the first line (as `| head -0`; `| head -3` the same
    once head exits, racing the writes): exit 141, no traceback, no error line."""
    read_fd, write_fd = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as a user's
    command = argv if argv[0] == "-m" else ["-m", "geodt", *argv]  # python -m simulator, or geodt
    child = subprocess.Popen([sys.executable, *command, "--out", str(tmp_path / "o")], stdout=write_fd,
                             stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    os.close(read_fd)
    os.close(write_fd)
    err = child.stderr.read().decode()
    assert child.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "Broken pipe" not in err and "geodt" not in err.replace("geodt sweep: ", "")
