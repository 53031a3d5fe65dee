"""Lines of processes sharing one pipe do not interleave: each reaches the pipe in one write."""
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from formats.cli import whole_lines

ROOT = Path(__file__).resolve().parents[1]


class Writes(io.RawIOBase):
    def __init__(self):
        self.calls = []

    def writable(self):
        return True

    def write(self, data):
        self.calls.append(bytes(data))
        return len(data)


def test_a_printed_line_is_one_write():
    raw = Writes()
    stream = whole_lines(raw)
    print("real: node a (rank 0): lost contact with node victim; stopping", file=stream)
    print("second", file=stream)
    assert raw.calls == [b"real: node a (rank 0): lost contact with node victim; stopping\n", b"second\n"]


def test_processes_printing_together_keep_their_lines_whole():
    # Under PYTHONUNBUFFERED a plain print() is two write(2) calls, text then newline; two
    # nodes stopping at once wrote "…stoppingreal: node c …" on one line (CI, stop 34).
    code = textwrap.dedent("""
        import io, sys
        from formats.cli import whole_lines
        sys.stderr = whole_lines(io.FileIO(2, "w", closefd=False))
        tag = sys.argv[1]
        for i in range(3000):
            print(f"real: node {tag} (rank {i}): lost contact; stopping", file=sys.stderr)
    """)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    r, w = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", code, tag], stderr=w, env=env) for tag in "ac"]
    os.close(w)
    with os.fdopen(r) as pipe:
        lines = pipe.read().splitlines()
    assert [p.wait() for p in procs] == [0, 0]
    assert len(lines) == 6000
    assert all(line.startswith("real: node ") and line.endswith("; stopping") and line.count("real:") == 1
               for line in lines)
