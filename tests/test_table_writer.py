"""simulator/outputs/run_outputs.py TableWriter: Parquet chunks encoded and written by a thread of the writer's
own while the caller goes on (the engine's next chunk, the loss model, the figures), in order, and a failed
write reported by the next write or by close(), so `geodt simulate` still ends in one line (issue 58's speed
goal: pyarrow's encoding overlaps the Python work on a second core)."""
from __future__ import annotations

import errno
import io
import os
import threading

import pandas as pd
import pyarrow.parquet as pq
import pytest

from simulator.outputs.run_outputs import TableWriter


def _chunk(first: int, rows: int = 3) -> pd.DataFrame:
    return pd.DataFrame({"round": range(first, first + rows), "seconds": [0.5 * r for r in range(first, first + rows)]})


def test_a_write_returns_while_its_chunk_is_written_and_chunks_keep_their_order(monkeypatch):
    release, started, threads = threading.Event(), threading.Event(), []
    real = pq.ParquetWriter.write_table

    def slow_write(self, table, *args, **kwargs):
        threads.append(threading.current_thread())
        started.set()
        assert release.wait(10)
        return real(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", slow_write)
    buffer = io.BytesIO()
    writer = TableWriter(buffer, "parquet", ["round", "seconds"])
    writer.write(_chunk(0))
    assert started.wait(10) and not release.is_set()  # returned with the write still running
    release.set()
    writer.write(_chunk(3))
    writer.close()
    assert {t.name.split("_")[0] for t in threads} == {"geodt-parquet"} and threads[0] is not threading.current_thread()
    assert pd.read_parquet(io.BytesIO(buffer.getvalue()))["round"].tolist() == list(range(6))


def test_a_failed_write_is_raised_by_close_and_abandon_then_ends_quietly(monkeypatch):
    def enospc(self, table, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq.ParquetWriter, "write_table", enospc)
    writer = TableWriter(io.BytesIO(), "parquet", ["round", "seconds"])
    writer.write(_chunk(0))  # the error is the thread's, raised when the write is waited for
    with pytest.raises(OSError, match="No space left"):
        writer.close()
    writer.abandon()
    assert writer.parquet is None


def test_simulate_with_the_first_parquet_write_failing_is_one_line(tmp_path, capsys, monkeypatch):
    from simulator.cli import simulate_main

    def enospc(self, table, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq.ParquetWriter, "write_table", enospc)
    out = tmp_path / "sim"
    assert simulate_main(["hetero-cpu", "--strategy", "baseline", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "Traceback" not in err[0]
    assert list(tmp_path.iterdir()) == []  # the stage is gone
