"""--data corpus files (issue 58): a FIFO, a device or a file too large to read is refused from os.stat
before it is opened, and a .npy whose header is oversized or garbled is one line, not a traceback; in
`geodt calibrate convergence` (in-process) and in `geodt run` (refused before any process starts)."""
from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys

import numpy as np
import pytest

from geodt.calibration.convergence import main as convergence_main
from geodt.run_cmd import run_main
from real.core.data import MAX_CORPUS_BYTES, NPY_MAX_HEADER_BYTES
from tests.one_line import one_line_exit_2

GOOD = b"{'descr': '<i8', 'fortran_order': False, 'shape': (100,), }"


def _npy(path, header: bytes, body: bytes = np.arange(100, dtype="<i8").tobytes(), version: int = 1):
    size = struct.pack("<H" if version == 1 else "<I", len(header))
    path.write_bytes(b"\x93NUMPY" + bytes([version, 0]) + size + header + body)
    return path


def _bad_npys(tmp_path):
    return {  # name -> (file, what the line says)
        "oversized header": (_npy(tmp_path / "big.npy", GOOD + b" " * 2 * NPY_MAX_HEADER_BYTES + b"\n", version=2),
                             "not a readable .npy header"),
        "garbled header": (_npy(tmp_path / "garbled.npy", b"{'descr': '<i8', 'shape': ([[[[[[ }\n"),
                           "not a readable .npy header"),
        "header past the file": (_write(tmp_path / "short.npy", b"\x93NUMPY\x01\x00" + struct.pack("<H", 60000) + b"x"),
                                 "not a readable .npy header"),
        "huge shape": (_npy(tmp_path / "huge.npy", b"{'descr': '<i8', 'fortran_order': False, "
                            b"'shape': (10000000000000,), }\n"), "its header promises 10000000000000 tokens"),
        "2-D": (_npy(tmp_path / "flat.npy", b"{'descr': '<i8', 'fortran_order': False, 'shape': (10, 10), }\n"),
                "expected a 1-D integer token array"),
    }


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_bad_npy_headers_are_one_line_in_calibrate_convergence(tmp_path, capsys):
    for name, (path, needle) in _bad_npys(tmp_path).items():
        out = tmp_path / f"{path.stem}.csv"
        err = one_line_exit_2(capsys, convergence_main(["hetero-cpu", "--data", str(path), "--out", str(out)]),
                              "--data", path.name, needle)
        assert "Traceback" not in err and not out.exists(), name


def test_bad_npy_headers_are_one_line_in_run_before_any_process(tmp_path, capsys):
    for name, (path, needle) in _bad_npys(tmp_path).items():
        out = tmp_path / f"run-{path.stem}"
        code = run_main(["hetero-cpu", "--strategy", "baseline", "--emulate", "--set", "training.rounds=1",
                         "--data", str(path), "--out", str(out)])
        one_line_exit_2(capsys, code, "--data", path.name, needle)
        assert not out.exists(), name


def test_a_good_npy_still_loads(tmp_path):
    from real.core.data import load_tokens

    path = tmp_path / "ok.npy"
    np.save(path, np.arange(200, dtype=np.int32) % 256)
    assert np.array_equal(load_tokens(path, 256), np.arange(200) % 256)
    assert load_tokens(path, 256).dtype == np.int32


def test_a_corpus_too_large_to_read_is_refused_from_its_size(tmp_path, capsys):
    big = tmp_path / "big.bin"
    with open(big, "wb") as handle:  # sparse: its size without its bytes
        handle.truncate(MAX_CORPUS_BYTES + 1)
    one_line_exit_2(capsys, convergence_main(["hetero-cpu", "--data", str(big), "--out", str(tmp_path / "c.csv")]),
                    "--data", f"{MAX_CORPUS_BYTES + 1} bytes", f"at most {MAX_CORPUS_BYTES} bytes")


def _memory_cap():  # a regression reading /dev/zero whole must fail in its own process, not fill this machine
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.slow
@pytest.mark.parametrize("source", ["fifo", "/dev/zero", "/dev/urandom"])
def test_a_corpus_that_is_not_a_regular_file_is_refused_unread(tmp_path, source):
    """Each read would block (FIFO) or never end (devices): calibrate convergence never returned."""
    if source == "fifo":
        os.mkfifo(tmp_path / "fifo")
        source = str(tmp_path / "fifo")
    done = subprocess.run([sys.executable, "-m", "geodt", "calibrate", "convergence", "hetero-cpu", "--data", source,
                           "--out", str(tmp_path / "c.csv")], capture_output=True, text=True, timeout=120,
                          preexec_fn=_memory_cap)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (f"geodt calibrate convergence: --data: {source}: not a regular file; expected a "
                                   "token file (.npy: a 1-D integer array; else bytes)")
    assert not (tmp_path / "c.csv").exists()
