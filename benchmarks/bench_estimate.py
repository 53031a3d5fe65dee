"""The catalog step-time estimate against published measured training throughput.

Reads benchmarks/estimate/published_throughput.csv (one published measurement per row, with
its model configuration, GPU, per-GPU micro-batch, gradient accumulation, parallelism, GPUs per
node, the nodes' network where published, and source) and compares each row's measured
tokens/s per GPU with simulator.estimate's:

    tokens/s = accum · b · s / (accum · overlapped(t_weights + t_launch + b · t_sample, t_fsdp) + t_optimizer / shards)

Every row is data-parallel or FSDP-like (each GPU runs the whole model on its own micro-batch;
FSDP shards the optimizer state over `optimizer_shards` GPUs). FSDP gathers the weights twice
and reduce-scatters the gradients every micro-step, t_fsdp (`fsdp_collective_s`, bf16 gathers
and fp32 reduce-scatter), over the GPU's NVLink or, when the row spans nodes, the node's
uplink (`uplink_gbps`) if slower; where a source does not publish its network the link is taken
as no slower than NVLink. The collectives run behind the compute and slow it (`overlapped_s`).
A row's `recompute` is one of simulator.estimate.RECOMPUTE. Nothing is fitted to the rows: the
estimate's constants are datasheet figures, published kernel efficiencies and op counts.

    python benchmarks/bench_estimate.py [--csv PATH]

Prints one line per row (estimate, measurement, error) and the median and worst absolute error;
exit status 1 if the median exceeds 10% or the worst 20% (the goals of issue 15).
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from facts.catalog import get_gpu  # noqa: E402
from simulator.estimate import Shape, estimate_step, fsdp_collective_s  # noqa: E402

CSV_PATH = Path(__file__).with_name("estimate") / "published_throughput.csv"
MEDIAN_GOAL, WORST_GOAL = 0.10, 0.20


def row_link_gbps(row: dict) -> float:
    """The link FSDP's collectives cross: the GPU's NVLink, or the node's uplink if the row spans
    nodes and its source publishes a slower one."""
    link = get_gpu(row["gpu"]).intra_node_gbps
    if int(row["gpus"]) > int(row["node_gpus"]) and row["uplink_gbps"]:
        link = min(link, float(row["uplink_gbps"]))
    return link


def row_estimate(row: dict) -> float:
    """Estimated tokens/s per GPU for one CSV row."""
    shape = Shape(hidden=int(row["hidden"]), layers=int(row["layers"]), heads=int(row["heads"]),
                  kv_heads=int(row["kv_heads"]), ffn=int(row["ffn"]), vocab=int(row["vocab"]),
                  gated_mlp=row["mlp"] == "swiglu")
    seq, params = int(row["seq_len"]), float(row["params"])
    fsdp = row["parallelism"].startswith("FSDP")
    comm_s = fsdp_collective_s(params, int(row["gpus"]), row_link_gbps(row)) if fsdp else 0.0
    est = estimate_step(row["gpu"], row["dtype"], seq, shape=shape, params=params,
                        attention=row["attention"], recompute=row["recompute"],
                        optimizer_shards=int(row["optimizer_shards"]), fsdp=fsdp, comm_s=comm_s)
    return est.tokens_per_s(int(row["micro_batch"]), seq, int(row["grad_accum"]))


def compare(path: Path = CSV_PATH) -> list[tuple[dict, float, float]]:
    """(row, estimated tokens/s, relative error) per row."""
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    out = []
    for row in rows:
        est = row_estimate(row)
        measured = float(row["tokens_per_s_per_gpu"])
        out.append((row, est, est / measured - 1.0))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, default=CSV_PATH)
    args = p.parse_args(argv)
    results = compare(args.csv)
    print(f"{'row':34s} {'gpu':10s} {'seq':>5s} {'b':>3s} {'measured':>9s} {'estimate':>9s} {'error':>7s}")
    for row, est, err in results:
        print(f"{row['id']:34s} {row['gpu']:10s} {row['seq_len']:>5s} {row['micro_batch']:>3s} "
              f"{float(row['tokens_per_s_per_gpu']):9.0f} {est:9.0f} {err:+7.1%}")
    errors = [abs(err) for _, _, err in results]
    median, worst = statistics.median(errors), max(errors)
    print(f"{len(results)} rows: median |error| {median:.1%}, worst {worst:.1%} "
          f"(goals: median <= {MEDIAN_GOAL:.0%}, worst <= {WORST_GOAL:.0%})")
    return 0 if median <= MEDIAN_GOAL and worst <= WORST_GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
