"""The columns of the per-round outputs: timeline.csv, summary.csv, trace.csv and validation.csv.

docs/DESIGN.md, "Outputs", defines each column. The simulator writes timeline.csv and
summary.csv, the executor trace.csv (the timeline's columns first, so a measured trace reads
wherever a predicted timeline does: simulator/perfetto.py, geodt validate), and `geodt validate`
validation.csv. Lists, not tuples: pandas reads a list as a selection of columns.
"""
from __future__ import annotations

TIMELINE_COLUMNS = ["strategy", "node", "round", "compute_s", "idle_s", "comm_s", "round_start_s", "round_end_s"]
SUMMARY_COLUMNS = ["strategy", "node", "compute_s", "idle_s", "comm_s", "tokens", "utilization"]
# trace.csv: the timeline plus what a real run measures (real/trace.py's docstring).
TRACE_COLUMNS = TIMELINE_COLUMNS + ["loss", "tokens", "overrun_steps", "ckpt_s", "local_steps", "batch_size",
                                    "bytes_sent"]
VALIDATION_COLUMNS = ["strategy", "node", "predicted_idle_s", "measured_idle_s", "predicted_round_s",
                      "measured_round_s", "error_pct_of_round", "mode"]
