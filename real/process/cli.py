"""`python -m real --plan plan.csv --scenario scenario.toml --out DIR [...]`: run a plan.

The same command is the torchrun entry point: under torchrun each process is one device of
a node (real/process/launch.py; README, "Running across machines").
"""
from __future__ import annotations

import argparse
import sys

from formats.cli import OneLineParser, add_key_option
from formats.sections import NODE_LOSS_POLICIES


def add_exec_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `python -m real` and `geodt run` / `geodt validate`."""
    parser.add_argument("--emulate", action="store_true",
                        help="pad each inner step to the plan's step_s and each sync to its comm_s "
                             "(a schedule check, not a measurement)")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="X",
                        help="multiply every emulated time by X (e.g. 0.1 runs 10x faster)")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoints in --out")
    parser.add_argument("--stop-after", type=int, default=None, metavar="R",
                        help="stop cleanly after R rounds (checkpointed; --resume continues)")
    add_key_option(parser, "checkpoint_every", "a checkpoint every K rounds (default: the scenario's, else the "
                   "Young/Daly interval from the first checkpoint's measured cost and [simulation] mtbf_s); "
                   "written in the background")
    parser.add_argument("--checkpoint-final", action="store_true",
                        help="a checkpoint after the run's last round too (always with --stop-after)")
    parser.add_argument("--data", default=None, metavar="FILE",
                        help="train on FILE: .npy token array, otherwise raw bytes; python-stdlib: the Python standard "
                             "library's sources as bytes (default: synthetic Markov corpus)")
    parser.add_argument("--replicate-data", action="store_true",
                        help="every node reads the same shard (checks the arithmetic; not for training)")
    parser.add_argument("--timeout-s", type=float, default=300.0,
                        help="how long a lost peer may stall the others before they stop (on the shaped WAN "
                             "4 s of it name the lost node and stop the run)")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                        help="auto: nccl when every process has a GPU, else gloo")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address of this machine the local rendezvous binds to (only there; not used "
                             "under torchrun). No authentication: trusted networks only")
    parser.add_argument("--allow-any-host", action="store_true",
                        help="let --host be 0.0.0.0 (every interface; refused otherwise: the rendezvous is "
                             "unauthenticated)")
    parser.add_argument("--wan", choices=("loopback", "shaped"), default="loopback",
                        help="loopback: every process on this machine's loopback; shaped (root): each node in a "
                             "network namespace of its own, its link shaped to the plan's link_gbps (README)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per process (0: the node's pinned cores, else cores / processes)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--on-node-loss", choices=NODE_LOSS_POLICIES, default="stop",
                        help="stop: a node whose process dies stops the run (--resume continues it); continue: "
                             "the others average among themselves from the next round (one process per node, "
                             "CPU, classic DiLoCo)")
    parser.add_argument("--rejoin-after-s", type=float, default=None, metavar="S",
                        help="with --on-node-loss continue: restart a lost node's process S seconds after it "
                             "died (once); it rejoins at a round boundary from a live peer's weights")


def exec_options(args: argparse.Namespace, out_dir: str):
    # deferred: torch; geodt run --help builds this parser without it
    from real.process.worker import ExecOptions  # noqa: PLC0415

    return ExecOptions(out_dir=out_dir, emulate=args.emulate, time_scale=args.time_scale, resume=args.resume,
                       data_path=args.data, replicate_data=args.replicate_data, timeout_s=args.timeout_s,
                       backend=args.backend, stop_after=args.stop_after, threads=args.threads,
                       checkpoint_every=args.checkpoint_every, checkpoint_final=args.checkpoint_final,
                       progress=not args.no_progress, wan=args.wan, on_node_loss=args.on_node_loss,
                       rejoin_after_s=args.rejoin_after_s, allow_any_host=args.allow_any_host)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m real", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="plan.csv (strategy, node, gpus, batch_size, ...)")
    parser.add_argument("--scenario", required=True, help="the resolved scenario TOML")
    parser.add_argument("--out", required=True, help="output directory (trace.csv, checkpoints/)")
    add_exec_arguments(parser)
    args = parser.parse_args(argv)
    try:
        opts = exec_options(args, args.out)
    except ValueError as exc:
        print(f"real: {exc}", file=sys.stderr)
        return 2
    # deferred: torch; geodt run --help builds this parser without it
    from real.process.launch import launch  # noqa: PLC0415

    try:
        return launch(args.plan, args.scenario, opts, host=args.host)
    except KeyboardInterrupt:
        print("real: interrupted", file=sys.stderr)
        return 130
