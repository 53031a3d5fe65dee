"""Every file a command writes is its own (issue 59, issue 58): `calibrate network`, `calibrate
convergence`, `calibrate device` and `paper` refuse a user's file (or another command's) in one
line with everything left as it was, unless --force; a profile that fails its checks is refused,
never taken for an empty one; the command's own earlier output is a rerun.

Was: `calibrate network --out notes.txt` (or a run folder's plan.csv) replaced it, exit 0;
`calibrate convergence --out` took a profile with one NaN cell for an empty one and wrote over a
whole earlier run's rows (a user's text file became a profile); `paper --out DIR` replaced the
user's README.md and predictions.csv."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NET_PROFILE = ROOT / "profiles" / "loopback-net.csv"
CONVERGENCE = ROOT / "simulator" / "scenarios" / "convergence-hetero-cpu.csv"


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _users(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "plan.csv").write_text("strategy,node\nbaseline,a\n")  # a run folder's
    return folder


@pytest.mark.parametrize("name", ["notes.txt", "plan.csv"])
def test_calibrate_network_refuses_a_users_file_and_leaves_the_folder(tmp_path, capsys, name):
    from geodt.calibration.links import main

    folder = _users(tmp_path / "mine")
    before = _tree(folder)
    assert main(["--out", str(folder / name), "--max-mib", "1", "--repeats", "1"]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"geodt calibrate network: --out {folder / name}: holds a file that is not a network "
                           "profile ("), line
    assert line.endswith("expected a new file, an earlier network profile to replace, or --force to write over it")
    assert _tree(folder) == before


def test_calibrate_network_wan_refuses_a_users_file_before_building_anything(tmp_path, capsys):
    from geodt.calibration.wan_links import main

    folder = _users(tmp_path / "mine")
    before = _tree(folder)
    assert main(["--wan", "shaped", "--scenario", "hetero-cpu", "--out", str(folder / "notes.txt")]) == 2
    assert "holds a file that is not a network profile" in _one_line(capsys)
    assert _tree(folder) == before


def test_a_network_profile_is_its_own_and_force_takes_any_file(tmp_path):
    from geodt.calibration.links import check_network_out

    shutil.copy(NET_PROFILE, tmp_path / "net.csv")
    assert check_network_out(tmp_path / "net.csv", force=False) is None  # a rerun replaces it
    assert check_network_out(tmp_path / "new.csv", force=False) is None
    _users(tmp_path)
    assert check_network_out(tmp_path / "notes.txt", force=True) is None
    (tmp_path / "link.csv").symlink_to(tmp_path / "net.csv")
    assert "not a regular file" in check_network_out(tmp_path / "link.csv", force=True)


def _bad_cell(path: Path, value: str) -> None:
    """Row 5's loss replaced by `value`."""
    lines = path.read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(",")
    cells = lines[5].rstrip("\n").split(",")
    cells[header.index("loss")] = value
    lines[5] = ",".join(cells) + "\n"
    path.write_text("".join(lines))


@pytest.mark.parametrize("damage", ["users-text", "nan-cell", "huge-cell"])
def test_calibrate_convergence_refuses_a_profile_that_fails_its_checks(tmp_path, capsys, damage):
    from geodt.calibration.convergence import main

    out = tmp_path / "convergence.csv"
    if damage == "users-text":
        out.write_text("my notes\n")
    else:
        shutil.copy(CONVERGENCE, out)
        _bad_cell(out, "nan" if damage == "nan-cell" else "x" * (128 << 10))  # a 128 KiB cell is cut
    before = _tree(tmp_path)
    assert main(["hetero-cpu", "--runs", "baseline", "--out", str(out)]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"geodt calibrate convergence: --out {out}: holds a file that is not a convergence "
                           "profile ("), line
    assert line.endswith("or --force to write over it") and len(line) < 600, line[:300]
    if damage == "nan-cell":
        assert "row 5: loss = 'nan'; expected a finite number" in line
    assert _tree(tmp_path) == before


def test_calibrate_convergence_force_passes_the_owner_check(tmp_path):
    from geodt.calibration.convergence import _check, parser

    out = tmp_path / "convergence.csv"
    out.write_text("my notes\n")
    args = parser().parse_args(["hetero-cpu", "--runs", "baseline", "--out", str(out), "--force"])
    _, runs = _check(args)
    assert runs == ["baseline"]


def test_calibrate_device_force_writes_over_what_it_refuses(tmp_path):
    from calibrate.profile_writer import ProfileWriter
    from formats.profile import ProfileError

    out = tmp_path / "notes.csv"
    out.write_text("my notes\n")
    identity = {"device_name": "cpu", "device_index": 0, "gpu_key": "cpu", "model": "tiny", "seq_len": 16,
                "dtype": "fp32"}
    with pytest.raises(ProfileError):
        ProfileWriter(out, identity)
    assert out.read_text() == "my notes\n"
    writer = ProfileWriter(out, identity, force=True)
    try:
        assert writer.rows == []
    finally:
        writer.close()


def test_paper_refuses_a_users_readme_and_predictions_and_reruns_its_own(tmp_path, capsys):
    from geodt.paper import main

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("# my project\n")
    (mine / "predictions.csv").write_text("x\n1\n")
    before = _tree(mine)
    assert main(["--out", str(mine)]) == 2
    line = _one_line(capsys)
    assert line == (f"geodt paper: --out {mine}: holds files `geodt paper` would replace and did not write "
                    "(README.md, predictions.csv); expected a new folder, an earlier `geodt paper` output, or "
                    "--force to write over them")
    assert _tree(mine) == before
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trace.csv").write_text("round\n")
    assert main(["--out", str(tmp_path / "run")]) == 2
    assert "holds another command's outputs (trace.csv)" in _one_line(capsys)
    ours = tmp_path / "ours"
    assert main(["--out", str(ours)]) == 0
    (ours / "notes.txt").write_text("kept")
    assert main(["--out", str(ours)]) == 0  # its own folder: a rerun
    assert (ours / "notes.txt").read_text() == "kept"
    assert main(["--out", str(mine), "--force"]) == 0
    assert "Generated by `geodt paper`" in (mine / "README.md").read_text()
