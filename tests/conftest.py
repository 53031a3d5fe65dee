"""Shared fixtures (scenario files written into tmp_path), skipping the torch tests without torch, and
the two tiers of tests.

The core install (`pip install -e .`) has no torch; `geodt[real]` / `geodt[calibrate]` add it.
Without torch, each test module that imports it at top level, or that starts the executor in a
subprocess, is skipped whole without being imported (listed in the header), and a test that
imports it while running is reported as skipped. With torch installed nothing here applies.

Tiers: `python -m pytest -m "not slow"` is the fast tier (minutes), `-m slow` the rest. A test is
slow when it starts a process (subprocess.Popen, a multiprocessing Process: a Pool, torch's spawn),
trains a model or takes seconds; tests/tiers.py holds the rule that marks them at collection (whole
modules, and single tests by name), and the guard below keeps the rule honest: a test left in the
fast tier that starts a process fails, naming the process (tests/test_tiers.py checks the guard).
"""
from __future__ import annotations

import ast
import importlib.util
import textwrap
from pathlib import Path

import pytest
from tiers import guard_fast_tier, is_slow

# Packages only the extras install: a test needing one of them cannot run on the core install.
EXTRA_PACKAGES = ("torch", "transformers")
HAVE_TORCH = importlib.util.find_spec("torch") is not None
# Modules that need torch only inside a subprocess (`python -m real`), where no import error reaches pytest.
SUBPROCESS_TORCH_MODULES = ("test_real_failures.py",)


def _imports_extra_at_top_level(path: Path) -> bool:
    """Whether the module's top-level statements import torch or transformers (so collecting it fails)."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name.split(".")[0] in EXTRA_PACKAGES for name in names):
            return True
    return False


def torch_test_modules(tests_dir: Path) -> list[str]:
    return sorted(p.name for p in tests_dir.glob("test_*.py")
                  if p.name in SUBPROCESS_TORCH_MODULES or _imports_extra_at_top_level(p))


TORCH_MODULES = () if HAVE_TORCH else tuple(torch_test_modules(Path(__file__).parent))


class _NeedsTorch(pytest.Module):
    """A test module that cannot be imported without torch: collected as one skip, never imported."""

    def collect(self):
        pytest.skip(f"{self.path.name} needs torch (pip install -e '.[real,calibrate]')")


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name in TORCH_MODULES and module_path.parent == Path(__file__).parent:
        return _NeedsTorch.from_parent(parent, path=module_path)
    return None


def pytest_collection_modifyitems(config, items):
    """The tier rule (tests/tiers.py): mark slow what starts processes, trains or takes seconds."""
    for item in items:
        if "slow" not in item.keywords and is_slow(item.path.name, item.name):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request, monkeypatch):
    """A test of the fast tier that starts a process fails (tests/tiers.py says which tests are slow)."""
    guard_fast_tier(request.node, monkeypatch)


def pytest_report_header(config):
    if not HAVE_TORCH:
        return f"torch is not installed: skipping {', '.join(TORCH_MODULES)} and every test that imports it"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Without torch, a test failing on `import torch` (or transformers) is a skip, not a failure."""
    outcome = yield
    if HAVE_TORCH or call.excinfo is None or not call.excinfo.errisinstance(ModuleNotFoundError):
        return
    missing = (call.excinfo.value.name or "").split(".")[0]
    if missing in EXTRA_PACKAGES:
        report = outcome.get_result()
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"needs {missing} (pip install -e '.[real]')")

SMALL = """
name = "small"
seed = 0
[model]
preset = "tiny"
seq_len = 64
dtype = "fp32"
[training]
rounds = 2
local_steps = 10
batch_size = 4
[network]
bandwidth_gbps = 1.0
latency_ms = 1.0
[[nodes]]
name = "a"
gpus = { "cpu" = 1 }
step_time_s = 0.1
[[nodes]]
name = "b"
gpus = { "cpu" = 1 }
step_time_s = 0.2
[[nodes]]
name = "c"
gpus = { "cpu" = 1 }
step_time_s = 0.25
"""


@pytest.fixture
def write_scenario(tmp_path):
    """write_scenario(text) -> path of a scenario file holding the dedented text."""
    def write(text: str = SMALL, name: str = "scenario.toml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path
    return write
