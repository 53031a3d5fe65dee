"""Per-round records of a torchft DiLoCo run in geodt's trace.csv format (torch only, no geodt import).

A user adds it to a torchft training script without changing torchft: `attach` it to the Manager and
the inner optimizer *before* entering `torchft.local_sgd.DiLoCo` (its optimizer hook must run before
DiLoCo's, which syncs), wrap each inner step in `with recorder.step():`, and `close()` at the end.
Each replica writes RUN_DIR/traces/<node>.csv; `geodt validate --trace RUN_DIR` (with the plan's
plan.csv and scenario.toml in RUN_DIR) joins them and compares predicted and measured idle, sync and
round per replica. (`geodt plan --export torchft` copies it beside the launch files it writes.)

What is measured (docs/DESIGN.md, "Time accounting"): a step's *compute* runs from entering
`step()` to the end of the inner optimizer's step (before DiLoCo's hook); the rest of the step is
DiLoCo's sync work. Of that, the time inside `Manager.start_quorum` is *idle* (torchft's DiLoCo
runs a synchronous quorum, which returns once every live replica has reached its sync point: the
wait for the last one) and the remainder (all-reduce of the pseudo-gradients, should_commit, outer
step) is *comm*. A round is `sync_every` inner steps (Streaming DiLoCo: all its fragment syncs).

Emulation (geodt's --emulate, a schedule check): given `step_s` and `comm_s`, each inner step is
padded by sleeping until it has lasted step_s × time_scale (deadlines accumulating from the last
sync, as geodt's executor pads), and each sync until comm_s × time_scale / fragments; a step
whose real compute took longer counts in `overrun_steps`. A sync is padded from its quorum's end (its
all-reduce's start), so under Streaming DiLoCo (τ > 0) the τ steps between sync and merge hide it. The trace's
`mode` column then says `emulated`, so validation never calls it measured.
"""
from __future__ import annotations

import contextlib
import csv
import os
import time
from pathlib import Path

# geodt's formats/timeline.py TRACE_COLUMNS + RUN_COLUMNS (tests/test_torchft_export.py checks they agree)
COLUMNS = ["strategy", "node", "round", "compute_s", "idle_s", "comm_s", "round_start_s", "round_end_s", "tokens",
           "loss", "overrun_steps", "ckpt_block_s", "ckpt_background_s", "local_steps", "batch_size",
           "bytes_sent", "peak_mem_bytes", "mode", "time_scale"]


def _pad(until: float) -> None:
    remaining = until - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


class RoundRecorder:
    """One replica's rounds (module docstring); times in seconds since `epoch` (time.time() based,
    so that replicas on one machine share a clock)."""

    def __init__(self, run_dir: str | os.PathLike, node: str, strategy: str, sync_every: int, batch_size: int,
                 seq_len: int, devices: int = 1, fragments: int = 1, step_s: float | None = None,
                 comm_s: float | None = None, time_scale: float = 1.0):
        if (step_s is None) != (comm_s is None):
            raise ValueError("step_s and comm_s: give both (an emulated run) or neither (a measured one)")
        self.path = Path(run_dir) / "traces" / f"{node}.csv"
        self.node, self.strategy, self.sync_every = node, strategy, int(sync_every)
        self.batch_size, self.devices, self.seq_len, self.fragments = int(batch_size), int(devices), int(seq_len), \
            int(fragments)
        self.emulated = step_s is not None
        self.step_pad_s = step_s * time_scale if self.emulated else 0.0
        self.comm_pad_s = comm_s * time_scale / self.fragments if self.emulated else 0.0
        self.time_scale = float(time_scale) if self.emulated else 1.0
        self.rows: list[dict] = []
        self.epoch = time.time()
        self._offset = self.epoch - time.perf_counter()  # perf_counter → seconds since the epoch
        self._steps = 0
        self._loss = float("nan")
        self._round = self._fresh_round(0.0)
        self._inner_end: float | None = None
        self._step_start = 0.0
        self._deadline = 0.0  # when the current emulated step may end (perf_counter seconds)
        self._sync_start = 0.0  # when the last quorum returned: the sync's all-reduce starts
        self._quorum_s = 0.0
        self._committed = False
        self._hook = None
        self._in_step = False

    def _fresh_round(self, start_s: float) -> dict:
        return {"compute_s": 0.0, "idle_s": 0.0, "comm_s": 0.0, "start_s": start_s, "overruns": 0}

    def _now_s(self) -> float:
        return time.perf_counter() + self._offset - self.epoch

    def attach(self, manager, inner_optimizer) -> RoundRecorder:
        """Hook the inner optimizer (ends each step's compute, pads it) and time the Manager's quorum and
        commit; call before `with DiLoCo(...)` so that this hook runs before DiLoCo's."""
        self._hook = inner_optimizer.register_step_post_hook(self._inner_done)
        start_quorum, should_commit = manager.start_quorum, manager.should_commit

        def timed_quorum(*args, **kwargs):
            if self._in_step and self._inner_end is None:  # DiLoCo's hook ran before ours: compute would hold the sync
                raise RuntimeError("RoundRecorder: attach it before entering torchft's DiLoCo (its optimizer hook "
                                   "must run before DiLoCo's, which syncs)")
            t0 = time.perf_counter()
            try:
                return start_quorum(*args, **kwargs)
            finally:
                self._sync_start = time.perf_counter()  # the all-reduce is issued after the quorum
                self._quorum_s += self._sync_start - t0

        def marked_commit(*args, **kwargs):
            self._committed = True
            return should_commit(*args, **kwargs)

        manager.start_quorum, manager.should_commit = timed_quorum, marked_commit
        return self

    def start(self) -> None:
        """Set the epoch to now: call once every replica is ready (after a first quorum), before step 0."""
        self.epoch = time.time()
        self._offset = self.epoch - time.perf_counter()
        self._round = self._fresh_round(0.0)
        self._deadline = time.perf_counter()

    def _inner_done(self, *_args) -> None:
        if self.emulated:
            if time.perf_counter() - self._step_start > self.step_pad_s:
                self._round["overruns"] += 1
            # deadlines accumulate over the steps between syncs (as geodt's executor pads,
            # real/rounds/rounds.py), so one sleep's overshoot on a loaded host is not carried on
            self._deadline = max(self._deadline, self._step_start) + self.step_pad_s
            _pad(self._deadline)
        self._inner_end = time.perf_counter()

    def loss(self, value: float) -> None:
        """The step's training loss (the round's row keeps its last step's)."""
        self._loss = float(value)

    @contextlib.contextmanager
    def step(self):
        """One inner step: forward, backward and the inner optimizer's step (DiLoCo syncs inside it)."""
        self._step_start = time.perf_counter()
        self._inner_end, self._quorum_s, self._committed = None, 0.0, False
        self._in_step = True
        try:
            yield self
        finally:
            self._in_step = False
        if self._committed:  # the sync lasts comm_s from its all-reduce's start (Streaming: τ steps before)
            _pad(self._sync_start + self.comm_pad_s)
        end = time.perf_counter()
        if self._quorum_s or self._committed:  # a sync: the next step's deadline counts from its end
            self._deadline = end
        inner_end = self._inner_end if self._inner_end is not None else end
        r = self._round
        r["compute_s"] += inner_end - self._step_start
        r["idle_s"] += self._quorum_s
        r["comm_s"] += end - inner_end - self._quorum_s
        self._steps += 1
        if self._steps % self.sync_every == 0:
            self._end_round(end + self._offset - self.epoch)

    def _end_round(self, end_s: float) -> None:
        r = self._round
        self.rows.append({
            "strategy": self.strategy, "node": self.node, "round": len(self.rows),
            "compute_s": r["compute_s"], "idle_s": r["idle_s"], "comm_s": r["comm_s"],
            "round_start_s": r["start_s"], "round_end_s": end_s,
            "tokens": self.sync_every * self.batch_size * self.devices * self.seq_len, "loss": self._loss,
            "overrun_steps": r["overruns"], "ckpt_block_s": 0.0, "ckpt_background_s": 0.0,
            "local_steps": self.sync_every, "batch_size": self.batch_size,
            "bytes_sent": 0,  # not measured: torchft's process group does not count bytes
            "peak_mem_bytes": 0,  # not measured here
            "mode": "emulated" if self.emulated else "measured", "time_scale": self.time_scale,
        })
        self._round = self._fresh_round(end_s)

    def close(self) -> Path:
        """Remove the hook and write the trace whole (a temporary file renamed over it)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with tmp.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(tmp, self.path)
        return self.path
