"""The GPU catalog: required GPUs, the paper's figures, dense-peak conventions, bad input."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from facts.catalog import (
    CATALOG_PATH,
    CatalogError,
    GpuSpec,
    get_gpu,
    load_catalog,
    peak_tflops,
    read_catalog,
    spec_tflops,
)

REPO = Path(__file__).resolve().parents[1]

REQUIRED = [
    "rtx-2080-ti", "titan-rtx", "a30", "rtx-3090", "v100", "v100-pcie", "titan-xp", "t4",
    "a10", "l4", "l40s", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200",
    "rtx-4090", "rtx-a6000", "cpu",
]
PAPER = {"rtx-2080-ti": 113.8, "titan-rtx": 130.0, "a30": 165.0, "rtx-3090": 142.0, "v100": 125.0, "v100-pcie": 125.0}


def test_every_required_gpu_is_present():
    catalog = load_catalog()
    assert set(REQUIRED) <= set(catalog)
    for key, spec in catalog.items():
        assert spec.key == key
        assert spec.source


def test_paper_figures_exactly_and_only_for_its_five_gpus():
    catalog = load_catalog()
    assert {k: s.paper_tflops for k, s in catalog.items() if s.paper_tflops is not None} == PAPER


@pytest.mark.parametrize("key", ["rtx-2080-ti", "rtx-3090", "rtx-4090"])
def test_geforce_fp32_accumulate_is_half_the_headline(key):
    spec = get_gpu(key)
    assert spec.fp16_tflops == pytest.approx(spec.fp16_acc16_tflops / 2, rel=1e-3)


@pytest.mark.parametrize("key", ["titan-rtx", "a30", "v100", "t4", "a100-80gb", "h100-sxm", "rtx-a6000"])
def test_titan_rtx_and_data_center_cards_run_fp32_accumulate_at_full_rate(key):
    spec = get_gpu(key)
    assert spec.fp16_tflops == spec.fp16_acc16_tflops


def test_bf16_support_matches_architecture():
    no_bf16 = {"rtx-2080-ti", "titan-rtx", "v100", "v100-pcie", "titan-xp", "t4", "cpu"}
    for key, spec in load_catalog().items():
        assert spec.bf16_supported == (key not in no_bf16), key
        assert (spec.bf16_tflops is None) == (key in no_bf16), key


def test_peak_and_spec_differ_for_2080_ti_fp16():
    spec = get_gpu("rtx-2080-ti")
    assert spec_tflops(spec, "fp16") == 113.8
    assert peak_tflops(spec, "fp16") == 56.9


def test_peak_and_spec_agree_for_a30_bf16():
    spec = get_gpu("a30")
    assert peak_tflops(spec, "bf16") == spec_tflops(spec, "bf16") == 165.0


def test_bf16_without_support_falls_back_to_fp32_peak_but_paper_figure_stays():
    spec = get_gpu("v100")
    assert peak_tflops(spec, "bf16") == spec.fp32_tflops == 15.7
    assert spec_tflops(spec, "bf16") == 125.0
    t4 = get_gpu("t4")
    assert peak_tflops(t4, "bf16") == spec_tflops(t4, "bf16") == t4.fp32_tflops


def test_titan_xp_has_no_tensor_cores_and_trains_at_fp32_rate():
    spec = get_gpu("titan-xp")
    assert not spec.has_tensor_cores
    assert spec.fp16_tflops < spec.fp32_tflops / 50  # the crippled 1/64 native rate, recorded
    for dtype in ("bf16", "fp16", "fp32"):
        assert peak_tflops(spec, dtype) == spec.fp32_tflops
        assert spec_tflops(spec, dtype) == spec.fp32_tflops


def test_fp32_ignores_the_paper_figure():
    spec = get_gpu("rtx-3090")
    assert spec_tflops(spec, "fp32") == peak_tflops(spec, "fp32") == 35.6


def test_cpu_is_nominal_and_modest():
    spec = get_gpu("cpu")
    assert spec.nominal and "NOMINAL" in spec.name
    assert 0.05 <= spec.fp32_tflops <= 1.0
    assert spec.memory_gb == 24 and spec.memory_bandwidth_gbs == 20
    assert [k for k, s in load_catalog().items() if s.nominal] == ["cpu"]
    assert peak_tflops(spec, "bf16") == peak_tflops(spec, "fp16") == spec.fp32_tflops


def test_dense_figures_not_sparse():
    # Ampere+ datasheet headlines are 2:4-sparse; dense A100 is 312, not 624.
    assert get_gpu("a100-80gb").bf16_tflops == 312.0
    assert get_gpu("h100-sxm").bf16_tflops == pytest.approx(1979 / 2, rel=1e-3)
    assert get_gpu("l4").bf16_tflops == 121.0


def test_paper_table2_node_averages_from_spec_tflops():
    nodes = [
        {"rtx-2080-ti": 4},
        {"rtx-2080-ti": 3, "titan-rtx": 1},
        {"a30": 4},
        {"rtx-3090": 2, "v100": 2},
    ]
    means = [sum(spec_tflops(get_gpu(k), "bf16") * n for k, n in node.items()) / sum(node.values())
             for node in nodes]
    # Table 2 prints node 2 as 117.9: (3 x 113.8 + 130) / 4 = 117.85, rounded half up.
    assert means == pytest.approx([113.8, 117.85, 165.0, 133.5], abs=1e-9)


def test_unknown_gpu_lists_keys():
    with pytest.raises(CatalogError) as info:
        get_gpu("rtx-9090")
    message = str(info.value)
    assert message.startswith("unknown GPU 'rtx-9090'; did you mean rtx-4090 or rtx-3090 or rtx-a6000? expected one of ")
    for key in REQUIRED:
        assert key in message


def test_typo_suggests_the_closest_keys():  # issue 11
    with pytest.raises(CatalogError, match=r"unknown GPU 'h100sxm'; did you mean h100-sxm"):
        get_gpu("h100sxm")
    with pytest.raises(CatalogError, match=r"unknown GPU 'zzzz'; expected one of"):
        get_gpu("zzzz")


def test_intra_node_link_nvlink_for_sxm_parts_pcie_for_the_rest():
    catalog = load_catalog()
    nvlink = {"v100": 1200.0, "a100-40gb": 2400.0, "a100-80gb": 2400.0, "h100-sxm": 3600.0, "h100-hbm2e": 3600.0,
              "h200": 3600.0}
    for key, spec in catalog.items():
        assert spec.intra_node_gbps == nvlink.get(key, 100.0), key
        if key in nvlink:
            assert "NVLink" in spec.source


def test_unknown_dtype():
    with pytest.raises(CatalogError, match="unknown dtype 'int8'; expected one of bf16, fp16, fp32"):
        peak_tflops(get_gpu("a30"), "int8")
    with pytest.raises(CatalogError, match="unknown dtype"):
        spec_tflops(get_gpu("a30"), "float16")


def test_load_catalog_is_cached_and_returns_fresh_dicts():
    first, second = load_catalog(), load_catalog()
    assert first == second and first is not second
    first.pop("a30")
    assert "a30" in load_catalog()
    assert first["v100"] is second["v100"]


def test_spec_is_frozen_and_memory_bytes():
    spec = get_gpu("rtx-2080-ti")
    with pytest.raises(AttributeError):
        spec.memory_gb = 12  # type: ignore[misc]
    assert spec.memory_bytes == 11 * 2**30


def test_import_does_not_pull_in_torch():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    code = "import facts.catalog, sys; facts.catalog.load_catalog(); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True)


def test_csv_ships_next_to_the_module():
    assert CATALOG_PATH.parent == Path(sys.modules["facts.catalog"].__file__).parent
    assert CATALOG_PATH.name.endswith(".csv")  # covered by package-data calibrate = ["*.csv"]


# ---- malformed catalog files: each names the file, the place and what was expected ----

def _rewrite(tmp_path, edit) -> Path:
    lines = CATALOG_PATH.read_text(encoding="utf-8").splitlines(keepends=True)
    path = tmp_path / "bad.csv"
    path.write_text("".join(edit(lines)), encoding="utf-8")
    return path


def _replace_in_row(key, old, new):
    def edit(lines):
        return [line.replace(old, new, 1) if line.startswith(key + ",") else line for line in lines]
    return edit


@pytest.mark.parametrize(
    "edit, expected",
    [
        (_replace_in_row("a30", ",24,933,", ",24,fast,"), r"line 4 \(GPU 'a30'\): column memory_bandwidth_gbs: expected a number"),
        (_replace_in_row("a30", ",24,933,", ",24,-933,"), r"line 4: GPU 'a30': memory_bandwidth_gbs must be a positive number"),
        (_replace_in_row("a30", ",true,165,", ",yes,165,"), r"column bf16_supported: expected true or false"),
        (_replace_in_row("v100", ",false,125,", ",true,125,"), r"bf16_supported must be true exactly when bf16_tflops is given"),
        (_replace_in_row("t4", ",65,65,", ",66,65,"), r"fp16_tflops \(FP32 accumulate\) must not exceed"),
        (_replace_in_row("t4", "t4,", "Tesla T4,"), r"key must be lower case words joined by hyphens"),
        (lambda lines: lines + [lines[3]], r"duplicate key 'a30'"),
        (lambda lines: [lines[0].replace("fp32_tflops", "fp32")] + lines[1:], r"header: expected columns"),
        (lambda lines: lines[:1], r"expected at least one GPU row"),
        (lambda lines: lines + ["x,y\n"], r"expected 15 fields"),
    ],
)
def test_malformed_catalog(tmp_path, edit, expected):
    path = _rewrite(tmp_path, edit)
    with pytest.raises(CatalogError, match=expected) as info:
        read_catalog(path)
    assert str(info.value).startswith(str(path))


def test_missing_catalog_file(tmp_path):
    with pytest.raises(CatalogError, match="cannot read the GPU catalog"):
        read_catalog(tmp_path / "nope.csv")


def test_shipped_catalog_reads_cleanly():
    assert read_catalog(CATALOG_PATH) == load_catalog()
    assert isinstance(next(iter(load_catalog().values())), GpuSpec)


def test_geodt_catalog_lists_every_gpu_with_its_figures_and_the_presets(capsys):
    """`geodt catalog` (issue 42): every GPU type of facts/ with memory, peak TFLOPS by dtype and
    memory bandwidth, then the model presets, in one table each."""
    from facts.presets import PRESETS
    from geodt.cli import main

    assert main(["catalog"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    for key, spec in load_catalog().items():
        row = lines[key]
        assert f"{spec.memory_gb:g}" in row and f"{spec.memory_bandwidth_gbs:g}" in row, row
        assert f"{spec.fp32_tflops:g}" in row, row
    assert "memory_gb" in out and "fp32_tflops" in out and "memory_bandwidth_gbs" in out
    for name, arch in PRESETS.items():
        assert name in lines and f"{arch.params:,}" in lines[name], lines.get(name)
    row = lines["v100"]
    assert row[row.index(f"{get_gpu('v100').fp32_tflops:g}") + 1] == f"{get_gpu('v100').fp16_tflops:g}"


def test_geodt_catalog_refuses_arguments_in_one_line(capsys):
    from geodt.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["catalog", "--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--bogus" in err, err
