"""`geodt profile check PROFILE.csv`: how well the simulator's t(b) fit predicts each measured batch.

Leave-one-out: each measured step time predicted from the other rows (simulator/models/profile_fit.py).
Torch-free; bad input is one line and exit status 2.
"""
from __future__ import annotations

import sys
from pathlib import Path

from facts.fidelity import PROFILE_LOO_PCT
from formats.cli import OneLineParser
from formats.profile import ProfileError, read_profile_frame
from simulator.models.profile_fit import ProfileModel, leave_one_out


def profile_main(argv: list[str] | None = None) -> int:
    """`geodt profile check PROFILE.csv`: leave-one-out error of the t(b) model."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = OneLineParser(prog="geodt profile", description="Inspect calibration profiles.")
    sub = parser.add_subparsers(dest="action", required=True, parser_class=OneLineParser)
    check = sub.add_parser("check", help="leave-one-out error of the step-time model at each batch")
    check.add_argument("profile", type=Path)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error, already printed as one line (2), or --help (0)
        return exc.code
    try:
        frame = read_profile_frame(args.profile)
        model = ProfileModel(frame, source=str(args.profile))
        table = leave_one_out(model)
    except ProfileError as exc:
        print(f"geodt profile: {exc}", file=sys.stderr)
        return 2
    t0_s, per_sample_s = model.fit()
    print(f"{args.profile}: {model.device_name} [{model.gpu_key}], {model.model}, seq_len {model.seq_len}, "
          f"{model.dtype}; fit t(b) = {t0_s * 1e3:.3f} ms + {per_sample_s * 1e3:.3f} ms x b")
    # The model times a batch by its mean step (rounds sum steps), the median where a profile has no
    # mean; calibrate prints medians, so the column says which this is.
    means = (frame["step_s_mean"].fillna("").astype(str).str.strip() != "") if "step_s_mean" in frame else None
    statistic = "median" if means is None or not means.any() else "mean" if means.all() else "mean_or_median"
    measured = f"{statistic}_ms"
    shown = table.assign(**{measured: table["measured_s"] * 1e3}, predicted_ms=table["predicted_s"] * 1e3)
    print(shown[["batch_size", measured, "predicted_ms", "error_pct"]].to_string(
        index=False, float_format=lambda v: f"{v:.3f}"))
    abs_err = table["error_pct"].abs()
    worst = table.loc[abs_err.idxmax()]
    print(f"leave-one-out |error|: median {abs_err.median():.2f}%, worst {abs_err.max():.2f}% "
          f"(batch {int(worst['batch_size'])})")
    if model.max_batch() is not None:
        print(f"largest batch that fits: {model.max_batch()}")
    print(profile_verdict(table))
    return 0


def profile_verdict(table) -> str:
    """Whether the fit is usable for planning: the median leave-one-out |error| within
    PROFILE_LOO_PCT (facts/fidelity.py, the band a profiled prediction is held to), and the batches
    predicted worse than that named, since a plan at those batches may be off by as much."""
    abs_err = table["error_pct"].abs()
    off = table[abs_err > PROFILE_LOO_PCT]
    named = ", ".join(f"{int(b)} ({e:+.1f}%)" for b, e in zip(off["batch_size"], off["error_pct"]))
    if abs_err.median() > PROFILE_LOO_PCT:
        return (f"verdict: not usable for planning as it is: the median batch is predicted from the others "
                f"{abs_err.median():.1f}% off (goal ≤ {PROFILE_LOO_PCT:g}%; batch {named}); the step time is not "
                "linear in the batch, or the rows are noisy: re-measure (geodt calibrate device, more --repeats)")
    beyond = (f"; batch {named} beyond {PROFILE_LOO_PCT:g}%: a plan at those batches may be off by as much"
              if len(off) else "")
    return (f"verdict: usable for planning (median leave-one-out error {abs_err.median():.1f}% ≤ "
            f"{PROFILE_LOO_PCT:g}%){beyond}")
