"""simulator.outputs: the files and answers a run leaves.

outputs writes every CSV and TOML byte for byte; run_outputs the timeline and syncs, perfetto the
trace.json, run_figure and loss_figure the PNGs; sweep_table the per-strategy metrics of a
timeline (the table of `geodt sweep --table`) and report the recommendation `geodt simulate`
ends with. Outputs import models/, engines/ and strategies/, never sweep/.
"""
