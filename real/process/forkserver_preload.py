"""Imported by the forkserver a local run's processes are forked from (real/process/launch.py `workers`):
what a worker runs, torch included, imported once in the server instead of once per process.

The server is in the launcher's process group and must outlive a SIGTERM sent to the whole group (a
scheduler, systemd, `kill -- -PGID`): the launcher handles it and stops the workers (real/process/
supervise.py), reading each one's end from the server, so the server ignores it. (Python's forkserver
ignores SIGINT itself; a worker sets both again at its start.)
"""
from __future__ import annotations

import signal

import real.process.launch  # noqa: F401  the worker's modules, torch among them

signal.signal(signal.SIGTERM, signal.SIG_IGN)
