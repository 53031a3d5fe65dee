"""train/children.py `leave`: a spawned process ends with its status and without the interpreter's
teardown (where gloo's threads can abort it, SIGABRT, after its work was sent), and what it put on
a multiprocessing queue still arrives."""
from __future__ import annotations

import multiprocessing as mp

from train.children import leave


def _child(queue, status):
    queue.put(("rows", list(range(200_000))))  # larger than a pipe's buffer: sent by the feeder thread
    leave(status, queue)


def test_a_child_that_leaves_keeps_its_status_and_its_queued_rows():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, 3))
    proc.start()
    kind, rows = queue.get(timeout=60)
    proc.join(timeout=60)
    assert (kind, len(rows), rows[-1]) == ("rows", 200_000, 199_999)
    assert proc.exitcode == 3
