"""The light install: core dependencies without torch, extras with it, and what a core install does.

A core install (`pip install -e .`) has no torch; these tests hide torch from a subprocess
(sys.modules["torch"] = None makes `import torch` fail and find_spec return None) to check
that the torch-free commands work and the others say which extra to install.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from formats.toml import tomllib

ROOT = Path(__file__).resolve().parents[1]
HIDE_TORCH = "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip() for r in requirements}


def test_core_dependencies_have_no_torch_and_extras_do():
    meta = project()
    core = names(meta["dependencies"])
    assert {"numpy", "pandas", "simpy", "matplotlib", "tqdm", "tomli-w"} <= core
    assert not core & {"torch", "transformers", "nvidia-ml-py"}
    extras = meta["optional-dependencies"]
    assert names(extras["real"]) == {"torch", "transformers", "pyroute2"}  # pyroute2: --wan shaped
    assert names(extras["calibrate"]) == {"torch", "transformers", "nvidia-ml-py"}
    # no torch: the core test run stays light (pytest-xdist: .ci/run's slow tier on two workers)
    assert names(extras["test"]) == {"pytest", "hypothesis", "ruff", "packaging", "pytest-xdist"}
    assert names(extras["peer"]) == {"torchft"}
    assert names(extras["cluster"]) == {"dask"}  # geodt sweep --scheduler
    assert extras["all"] == ["geodt[real,calibrate,test,peer,cluster]"]


def test_the_torch_floor_has_the_fully_shard_the_executor_imports():
    """real/core/sharding.py imports torch.distributed.fsdp.fully_shard, public from torch 2.6 (the floor was 2.1)."""
    assert "from torch.distributed.fsdp import fully_shard" in (ROOT / "real/core/sharding.py").read_text()
    extras = project()["optional-dependencies"]
    for extra in ("real", "calibrate"):
        torch = next(Requirement(r) for r in extras[extra] if Requirement(r).name == "torch")
        assert not torch.specifier.contains("2.5.1") and torch.specifier.contains("2.6.0"), (extra, str(torch))


def run_hidden(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE_TORCH + code], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("command,extra", [("run", "real"), ("validate", "real"), ("calibrate", "calibrate")])
def test_torch_commands_without_torch_say_which_extra(tmp_path, command, extra):
    out = tmp_path / "out"
    args = ["hetero-cpu", "--strategy", "baseline", "--out", str(out)] if command != "calibrate" else \
        ["--device", "cpu", "--model", "tiny", "--batch", "1", "--out", str(out / "p.csv")]
    result = run_hidden(f"from geodt.cli import main; sys.exit(main({[command, *args]!r}))", tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"geodt {command}: needs torch and transformers, not installed; "
                                    f"install with pip install 'geodt[{extra}]'")
    assert not out.exists()


def test_core_commands_work_without_torch(tmp_path):
    code = ("from geodt.cli import main; "
            "assert main(['simulate', 'paper', '--strategy', 'baseline', 'hybrid', '--out', 'sim']) == 0; "
            "assert main(['profile', 'check', sys.argv[1]]) == 0; "
            "assert main(['sweep', '--table', 'paper', '--strategy', 'C', '--out', 'table']) == 0; "
            "import geodt.paper")
    result = subprocess.run([sys.executable, "-c", HIDE_TORCH + code, str(ROOT / "profiles" / "cpu-1thread.csv")],
                            cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "sim" / "trace.json").exists() and (tmp_path / "table" / "table.csv").exists()
    assert "\nrecommended: hybrid — " in result.stdout


def test_conftest_finds_modules_importing_torch_at_top_level(tmp_path):
    from conftest import _imports_extra_at_top_level

    cases = {"a.py": "import torch\n", "b.py": "from transformers import LlamaConfig\n",
             "c.py": "import torch.distributed as dist\n", "d.py": "def f():\n    import torch\n",
             "e.py": "import numpy\nfrom real.core.config import load_plan\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    assert {n for n in cases if _imports_extra_at_top_level(tmp_path / n)} == {"a.py", "b.py", "c.py"}
