"""`geodt catalog`: the GPU types and model presets a scenario can name, with their key figures.

GPU types come from facts/gpu_catalog.csv (memory, memory bandwidth, dense peak TFLOPS by dtype,
the intra-node link), model presets from facts/presets.py (shape and parameter count). Both are
printed as tables; --csv prints the GPU table as CSV for a spreadsheet.
"""
from __future__ import annotations

import pandas as pd

from facts.catalog import load_catalog
from facts.presets import PRESETS
from formats.cli import OneLineParser

GPU_COLUMNS = ["key", "memory_gb", "memory_bandwidth_gbs", "fp32_tflops", "fp16_tflops", "bf16_tflops",
               "intra_node_gbps", "name"]


def gpu_table() -> pd.DataFrame:
    return pd.DataFrame([{c: getattr(spec, c) for c in GPU_COLUMNS} for spec in load_catalog().values()])


def preset_table() -> pd.DataFrame:
    return pd.DataFrame([{"preset": name, "params": f"{arch.params:,}", "hidden_size": arch.hidden_size,
                          "layers": arch.num_layers, "heads": arch.num_heads, "kv_heads": arch.num_kv_heads,
                          "vocab": arch.vocab_size} for name, arch in PRESETS.items()])


def catalog_main(argv: list[str]) -> int:
    parser = OneLineParser(prog="geodt catalog", description=(
        "The GPU types a scenario's nodes can name (gpus = { \"a30\" = 4 }) with their memory, memory "
        "bandwidth and dense peak TFLOPS by dtype (empty: the GPU has no such tensor math), then the "
        "model presets ([model] preset = \"llama-150m\")."))
    parser.add_argument("--csv", action="store_true", help="print the GPU table as CSV")
    args = parser.parse_args(argv)
    gpus = gpu_table()
    if args.csv:
        print(gpus.to_csv(index=False), end="")
        return 0
    print("GPU types (facts/gpu_catalog.csv; figures are dense peaks, TFLOPS; memory in GB, bandwidth in GB/s)")
    print(gpus.to_string(index=False, na_rep="-", float_format="{:g}".format))
    print("\nmodel presets")
    print(preset_table().to_string(index=False))
    return 0
