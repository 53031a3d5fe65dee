"""Fault injection: what geodt promises when a checkpoint rots, the disk fills, a peer hangs,
two runs share one --out, or the run is terminated (README, "What geodt promises under faults").

Each case asserts the message, the exit status, what is left on disk and, where promised, that
--resume ends with final weights bitwise equal to an uninterrupted run's. Tiny model, few
rounds: each run takes seconds; the slow part is process start-up on a loaded machine.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from real.checkpoint.checkpoint import verified_sets
from real.checkpoint.ckpt_set import set_rounds
from real.core.options import ExecOptions
from real.process.launch import launch
from tests.proctree import ctrl_c_reaches_it, launcher_env, running, spawned_children

SCENARIO = """name = "faults"
seed = 3
[model]
preset = "tiny"
seq_len = 16
dtype = "fp32"
[training]
rounds = {rounds}
checkpoint_every = {every}
[diloco]
warmup_steps = 1
"""
PLAN = """strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s
baseline,a,1,1,2,0.1,32,0.0
baseline,victim,1,1,2,0.1,32,0.0
"""
OTHER_LINES = ("real: synthetic Markov corpus",)


def _inputs(d: Path, rounds: int, every: int = 1) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "plan.csv").write_text(PLAN)
    (d / "scenario.toml").write_text(SCENARIO.format(rounds=rounds, every=every))
    return d


def _launch(d: Path, out: Path, **opts) -> int:
    options = ExecOptions(out_dir=str(out), threads=1, progress=False, summary=False, **opts)
    return launch(d / "plan.csv", d / "scenario.toml", options)


def _weights(out: Path) -> dict:
    return torch.load(out / "final_weights.pt", weights_only=True)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip() and not line.startswith(OTHER_LINES)]


def _start(d: Path, out: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "real", "--plan", str(d / "plan.csv"), "--scenario", str(d / "scenario.toml"),
           "--out", str(out), "--threads", "1", "--no-progress", *extra]
    return subprocess.Popen(cmd, env=env or launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=ctrl_c_reaches_it)


def _wait_for_set(proc: subprocess.Popen, out: Path, index: int = 1, count: int = 1, limit_s: float = 180) -> None:
    deadline = time.monotonic() + limit_s
    while len(set_rounds(out, index)) < count:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)


def _finish(proc: subprocess.Popen, limit_s: float) -> str:
    try:
        return proc.communicate(timeout=limit_s)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --- checkpoints that prove themselves ---------------------------------------------------------

@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> dict:
    """An uninterrupted run of 4 rounds, and the same run stopped after 3 (sets of rounds 2 and 3)."""
    tmp = tmp_path_factory.mktemp("flips")
    d = _inputs(tmp / "in", rounds=4)
    assert _launch(d, tmp / "whole") == 0
    assert _launch(d, tmp / "part", stop_after=3) == 0
    return {"in": d, "whole": _weights(tmp / "whole"), "part": tmp / "part"}


def _flip_json_digest(path: Path) -> None:
    """One flipped bit in the first file digest the manifest records (the JSON stays readable)."""
    data = bytearray(path.read_bytes())
    at = data.index(b'"blake2b": "') + len(b'"blake2b": "')
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind, reason", [
    ("global.pt", "global.pt fails its blake2b digest"),
    ("node.pt", "node.pt fails its blake2b digest"),
    ("manifest.json", "manifest.json fails its own digest"),
])
def test_a_flipped_bit_is_caught_and_resume_uses_the_previous_round_bitwise(stopped, tmp_path, capfd, kind,
                                                                             reason):
    out = tmp_path / "out"
    shutil.copytree(stopped["part"], out)
    victim = out / "checkpoints" / "node1" / "round-000003"
    (_flip_json_digest if kind == "manifest.json" else _flip_middle)(victim / kind)
    (out / ".final_weights.pt.tmp999").write_bytes(b"left by a killed run")
    (out / "checkpoints" / "node0" / ".round-000004.tmp999").mkdir()
    capfd.readouterr()
    assert _launch(stopped["in"], out, resume=True) == 0
    err = capfd.readouterr().err
    assert f"real: {victim}: skipped: {reason}" in err
    assert ("real: resuming from round 2, the newest every node holds intact; skipped round 3: node victim has "
            "none that verifies") in err
    assert _same(_weights(out), stopped["whole"])
    assert not (out / ".final_weights.pt.tmp999").exists()
    assert not list((out / "checkpoints").rglob(".*tmp*"))
    assert sorted(verified_sets(out, 1, report=False)) == [2, 3, 4]  # the bad set was replaced by a good one


def test_a_node_without_any_set_resumes_everyone_from_the_start_bitwise(tmp_path, capfd):
    """An interrupt kills the workers while one node's first background write runs: that node
    has no set, its peer has round 4 (seen in CI: SIGTERM right after victim's first set). The
    start of the run is what both hold: --resume starts from it, saying so, and ends bitwise."""
    d = _inputs(tmp_path / "in", rounds=6, every=4)
    reference = tmp_path / "reference"
    assert _launch(d, reference) == 0
    out = tmp_path / "out"
    assert _launch(d, out, stop_after=4) == 0
    shutil.rmtree(out / "checkpoints" / "node0")  # node a's first write never finished
    (out / "final_weights.pt").unlink()
    capfd.readouterr()
    assert _launch(d, out, resume=True) == 0
    err = capfd.readouterr().err
    assert "real: resuming from the start: node a has no checkpoint that verifies; skipped round 4" in err, err
    assert _same(_weights(out), _weights(reference))


def _tree(folder: Path) -> dict:
    """Every file under `folder` and its bytes (what a refused command must leave as it was)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_node_whose_every_set_fails_is_refused_and_every_set_stays(stopped, tmp_path, capfd):
    """Issue 59: every set of node victim flipped; --resume started every node from the start (exit
    0, all rounds again) and the keep rotation deleted node a's good sets. Now: one line naming the
    node and its sets, exit 2, the folder byte-identical (refused before any process starts, so
    whatever the strategy: the quorum variant lost its sets the same way)."""
    d = stopped["in"]
    out = tmp_path / "out"
    shutil.copytree(stopped["part"], out)
    rounds = sorted(set_rounds(out, 1))
    for round_ in rounds:
        _flip_middle(out / "checkpoints" / "node1" / f"round-{round_:06d}" / "global.pt")
    before = _tree(out)
    capfd.readouterr()
    assert _launch(d, out, resume=True) == 2
    lines = _lines(capfd.readouterr().err)
    assert len(lines) == 1, lines
    assert lines[0].startswith("real: --resume: node victim has no checkpoint that verifies"), lines[0]
    assert all(f"round {r}: global.pt fails its blake2b digest" in lines[0] for r in rounds), lines[0]
    assert f"sets that verify: a: rounds {', '.join(map(str, rounds))}" in lines[0], lines[0]
    assert _tree(out) == before


@pytest.mark.parametrize("final", [False, True])
def test_trace_splits_checkpoint_time_into_blocking_and_background(tmp_path, final):
    d = _inputs(tmp_path / "in", rounds=5, every=2)
    assert _launch(d, tmp_path / "out", checkpoint_final=final) == 0
    trace = pd.read_csv(tmp_path / "out" / "trace.csv")
    written = trace["round"].isin([1, 3, 4] if final else [1, 3])  # every 2 rounds (and the last, when asked)
    assert (trace.loc[written, "ckpt_background_s"] > 0).all() and (trace.loc[written, "ckpt_block_s"] > 0).all()
    assert (trace.loc[~written, ["ckpt_block_s", "ckpt_background_s"]] == 0).all().all()
    assert sorted(set_rounds(tmp_path / "out", 0)) == ([2, 4, 5] if final else [2, 4])  # the newest KEEP = 3


# --- disk space --------------------------------------------------------------------------------

def test_too_little_space_is_refused_before_the_run(tmp_path, capfd, monkeypatch):
    import real.process.outdir

    d = _inputs(tmp_path / "in", rounds=2)
    monkeypatch.setattr(real.process.outdir.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 10**6, 10**6))
    capfd.readouterr()
    assert _launch(d, tmp_path / "out") == 2
    lines = _lines(capfd.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith(f"real: {tmp_path / 'out'}: 976.6 KiB free; the run needs about")
    assert not (tmp_path / "out" / "checkpoints").exists() and not (tmp_path / "out" / "plan.csv").exists()


def _mount_tmpfs(where: Path, size_mib: int) -> None:
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")


def _fill(path, leave_bytes: int) -> None:
    """Fill path's disk but for about leave_bytes. In chunks, and a full disk is no error here: the
    run writes while this fills (a single write of the free space measured a moment before failed
    with ENOSPC under a loaded machine)."""
    chunk = b"\0" * (1 << 20)
    with open(path, "wb") as handle:
        try:
            while shutil.disk_usage(path.parent).free > leave_bytes + len(chunk):
                handle.write(chunk)
                handle.flush()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise


def test_a_disk_that_fills_mid_run_stops_it_in_one_line_and_resume_is_bitwise(tmp_path):
    d = _inputs(tmp_path / "in", rounds=40)
    reference = tmp_path / "reference"
    assert _launch(d, reference) == 0
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, 48)  # the run's peak (4 sets of 4.2 MB per node, final weights) fits
    try:
        out = disk / "out"
        proc = _start(d, out, "--emulate")
        _wait_for_set(proc, out, 0, count=2)
        filler = disk / "filler"
        _fill(filler, leave_bytes=1 << 20)  # the disk full but for 1 MiB: the next set cannot be written
        err = _finish(proc, 120)
        assert proc.returncode == 1, err
        lines = _lines(err)
        assert lines and all("no space left on device while writing round" in line and "checkpoints/node" in line
                             and "earlier rounds' checkpoints are intact" in line for line in lines), err
        assert not list(out.rglob("*.tmp*")) and not (out / "trace.csv").exists()
        assert all(verified_sets(out, i, report=False) for i in (0, 1))  # the last good rounds verify
        filler.unlink()
        resumed = _start(d, out, "--resume")
        err = _finish(resumed, 300)
        assert resumed.returncode == 0, err
        assert _same(_weights(out), _weights(reference))
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# --- a hung peer, signals ------------------------------------------------------------------------

def test_a_stopped_peer_is_named_and_the_run_ends_within_the_timeout(tmp_path):
    d = _inputs(tmp_path / "in", rounds=500)
    out = tmp_path / "out"
    proc = _start(d, out, "--emulate", "--timeout-s", "10")
    _wait_for_set(proc, out)
    workers = sorted(spawned_children(proc.pid))  # spawned in rank order: the second is rank 1
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGSTOP)
    stopped_at = time.monotonic()
    err = _finish(proc, 60)
    elapsed = time.monotonic() - stopped_at
    assert proc.returncode == 1, err
    assert _lines(err)[-1] == ("real: node victim (rank 1, stopped (SIGSTOP or SIGTSTP)) stopped answering: its "
                               "peers waited --timeout-s 10 s for it and gave up; it was stopped"), err
    assert elapsed < 10 + 5, elapsed
    assert not any(running(pid) for pid in workers)


def test_sigterm_ends_the_run_as_ctrl_c_and_resume_is_bitwise(tmp_path):
    d = _inputs(tmp_path / "in", rounds=30, every=4)
    reference = tmp_path / "reference"
    assert _launch(d, reference) == 0
    out = tmp_path / "out"
    rdzv_root = tmp_path / "tmp"
    rdzv_root.mkdir()
    env = {**launcher_env(), "TMPDIR": str(rdzv_root)}
    proc = _start(d, out, "--emulate", env=env)
    _wait_for_set(proc, out)
    workers = spawned_children(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)  # the launcher alone, as `kill PID` does
    err = _finish(proc, 60)
    assert proc.returncode == 143, err
    assert _lines(err) == ["real: interrupted; outputs of completed rounds are in the checkpoints (--resume continues)"]
    assert not any(running(pid) for pid in workers)
    assert not (out / "trace.csv").exists() and not list(rdzv_root.glob("geodt-rdzv-*"))
    resumed = _start(d, out, "--resume", env=env)
    err = _finish(resumed, 300)
    assert resumed.returncode == 0, err
    assert _same(_weights(out), _weights(reference))


def test_a_killed_worker_is_named_by_its_signal_and_a_killed_launchers_rendezvous_is_cleaned(tmp_path):
    d = _inputs(tmp_path / "in", rounds=500)
    rdzv_root = tmp_path / "tmp"
    rdzv_root.mkdir()
    env = {**launcher_env(), "TMPDIR": str(rdzv_root)}
    proc = _start(d, tmp_path / "out", "--emulate", "--timeout-s", "30", env=env)
    _wait_for_set(proc, tmp_path / "out")
    os.kill(sorted(spawned_children(proc.pid))[1], signal.SIGKILL)
    err = _finish(proc, 60)
    assert proc.returncode == 1, err
    assert _lines(err)[-1] == "real: node victim (rank 1) was killed by SIGKILL; the other processes were stopped"
    assert "out-of-memory" not in err
    # A launcher killed outright leaves its rendezvous folder; the next run removes it.
    proc = _start(d, tmp_path / "out2", "--emulate", env=env)
    _wait_for_set(proc, tmp_path / "out2")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = list(rdzv_root.glob(f"geodt-rdzv-{proc.pid}-*"))
    assert len(left) == 1
    _inputs(tmp_path / "in1", rounds=1)
    again = _start(tmp_path / "in1", tmp_path / "out3", env=env)
    err = _finish(again, 300)
    assert again.returncode == 0, err
    assert not left[0].exists()
    # and its forkserver's folder (a $TMPDIR this long puts it in /tmp: real/process/launch.py _server_folder)
    assert not list(Path("/tmp").glob(f"geodt-rdzv-{proc.pid}-*"))


# --- one run per --out ---------------------------------------------------------------------------

def test_a_second_run_on_a_busy_out_is_refused_naming_the_first(tmp_path, capsys):
    d = _inputs(tmp_path / "in", rounds=500)
    out = tmp_path / "out"
    first = _start(d, out, "--emulate")
    try:
        _wait_for_set(first, out)
        second = _start(d, out)
        err = _finish(second, 120)
        assert second.returncode == 2
        assert _lines(err) == [(f"real: {out}: another run (pid {first.pid}) is using this directory; wait for it "
                               f"to end or choose another --out")]
        from geodt.run_cmd import run_main, validate_main

        for main, prog in ((run_main, "geodt run"), (validate_main, "geodt validate")):
            assert main(["hetero-cpu", "--strategy", "baseline", "--out", str(out), "--no-progress"]) == 2
            assert capsys.readouterr().err.strip() == (f"{prog}: {out}: another run (pid {first.pid}) is using this "
                                                       f"directory; wait for it to end or choose another --out")
        assert first.poll() is None  # the first run goes on, its inputs untouched
        assert (out / "plan.csv").read_text() == PLAN
    finally:
        os.killpg(first.pid, signal.SIGINT)
        _finish(first, 60)
    assert first.returncode == 130
    assert not (out / ".run.lock").exists()


def test_rendezvous_folders_of_live_launchers_are_kept(tmp_path):
    from real.process.outdir import remove_orphan_rendezvous

    mine = Path(tempfile.mkdtemp(prefix=f"geodt-rdzv-{os.getpid()}-", dir=tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = Path(tempfile.mkdtemp(prefix=f"geodt-rdzv-{gone.pid}-", dir=tmp_path))
    assert remove_orphan_rendezvous(str(tmp_path)) == [orphan]
    assert mine.exists() and not orphan.exists()


def test_an_output_that_cannot_be_written_is_one_line(capsys):
    """A full disk while `geodt run` writes trace.json (a write() error names no file)."""
    import errno

    from geodt.run_cmd import interruptible
    from geodt.run_exec import naming

    def fill(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    assert interruptible(lambda argv: naming(Path("out/trace.json"), fill))([]) == 1
    assert capsys.readouterr().err == ("geodt: out/trace.json: no space left on device; nothing half-written is left "
                                       "(the outputs written before it and the checkpoints are intact)\n")
