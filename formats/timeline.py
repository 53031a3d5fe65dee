"""The columns of the per-round outputs: timeline.csv, summary.csv, syncs.csv, trace.csv and validation.csv.

docs/DESIGN.md, "Outputs", defines each column. The simulator writes timeline.csv and
summary.csv, the executor trace.csv (the timeline's columns first, so a measured trace reads
wherever a predicted timeline does: simulator/outputs/perfetto.py, geodt validate), and `geodt validate`
validation.csv. Lists, not tuples: pandas reads a list as a selection of columns.
"""
from __future__ import annotations

# tokens: what the node trained on in the round (adaptive plans change it round by round).
TIMELINE_COLUMNS = ["strategy", "node", "round", "compute_s", "idle_s", "comm_s", "round_start_s", "round_end_s",
                    "tokens"]
SUMMARY_COLUMNS = ["strategy", "node", "compute_s", "idle_s", "comm_s", "tokens", "utilization"]
# `geodt simulate`'s summary.csv adds the loss model's figures for the node's strategy (the same on
# each of its rows; simulator/models/loss_prediction.py): the predicted loss at the run's end, its band
# (± nats: the spread the effects' fits leave), the wall-clock seconds to [training] target_loss, else to
# the baseline's predicted end loss (inf: not reached in the run), and that time's band (± s).
LOSS_COLUMNS = ["loss_end", "loss_band", "time_to_target_s", "time_band_s"]
# ... and where its figures come from and how far off they may be (simulator/models/provenance.py,
# facts/bands.py): the node's step source (measured | profile | catalog), the network's
# (calibrated | assumed), and the strategy's error band in % (the same on each of its rows).
PROVENANCE_COLUMNS = ["step_source", "network_source", "error_band_pct"]
# ... and the staleness of the strategy's merged pseudo-gradients, in global updates applied between a
# node's pull and its merge (simulator/engines/engine_async.py): their mean and 90th percentile over every merge of
# the run (the same on each of its rows; 0 for strategies with a barrier, whose merges see no update between).
STALENESS_COLUMNS = ["staleness_mean", "staleness_p90"]
# syncs.csv (`geodt simulate`), one row per node and fragment sync: when its compute towards the sync
# began, reached the sync point, the all-reduce's start and end (the same for every node), the merge
# point, and the wait there split into idle (before the all-reduce started: the wait for the other
# nodes) and exposed comm (while it ran), then the outer step (simulator/engines/engine_analytic.py).
SYNC_COLUMNS = ["strategy", "node", "round", "fragment", "compute_start_s", "sync_point_s", "start_s", "end_s",
                "merge_point_s", "idle_s", "exposed_s", "outer_s"]
# trace.csv: the timeline plus what a real run measures (real/rounds/trace.py's docstring).
TRACE_COLUMNS = TIMELINE_COLUMNS + ["loss", "overrun_steps", "ckpt_block_s", "ckpt_background_s",
                                    "local_steps", "batch_size",
                                    "bytes_sent", "peak_mem_bytes"]
# trace.csv's run columns after TRACE_COLUMNS, the same on every row (real/rounds/trace.py run_columns): how the run
# was made, so that whatever reads the trace later (geodt validate --trace) labels it as it ran. mode:
# MODES[emulated]; time_scale: --time-scale under --emulate (the run's times are the plan's × it), else 1.
RUN_COLUMNS = ["mode", "time_scale"]
MODES = {False: "measured", True: "emulated"}  # a real run | a schedule check (--emulate: steps padded)
# validate's loss model against the run (geodt/validation.py loss_comparison); empty until compared
LOSS_VALIDATION_COLUMNS = ["predicted_loss_end", "measured_loss_end", "predicted_time_to_target_s",
                           "measured_time_to_target_s", "loss_model_time_to_target_s"]
# validation.csv of an async run (trace.csv with `staleness`, real/rounds/round_async.py), after the others: per node,
# the mean staleness of its merges, predicted and measured, and the run's mean over every merge (the same on
# each row; the STALENESS goal of facts/fidelity.py judges their error), and the run's 90th percentile
# (linearly interpolated, as summary.csv's staleness_p90).
STALENESS_VALIDATION_COLUMNS = ["predicted_staleness_mean", "measured_staleness_mean",
                                "predicted_run_staleness_mean", "measured_run_staleness_mean",
                                "predicted_run_staleness_p90", "measured_run_staleness_p90"]
# validate's host over the run's window (train/hoststat.py), the same on every row: % of the machine's CPU
# time stolen by the hypervisor for other guests, and % busy; empty where not known (validate --trace)
HOST_VALIDATION_COLUMNS = ["host_steal_pct", "host_busy_pct"]
# validation.csv: per node, summed over the measured rounds; comm is the sync (the timeline's comm_s).
VALIDATION_COLUMNS = ["strategy", "node", "predicted_idle_s", "measured_idle_s", "predicted_round_s",
                      "measured_round_s", "error_pct_of_round", "predicted_comm_s", "measured_comm_s",
                      "comm_error_pct", "mode", "network", "predicted_compute_s", "measured_compute_s",
                      "predicted_tokens", "measured_tokens", "predicted_wall_s", "measured_wall_s",
                      "wall_error_pct", *LOSS_VALIDATION_COLUMNS, "round_error_pct", *HOST_VALIDATION_COLUMNS,
                      "verdict"]
