"""simulator.sweep: `geodt sweep`, many scenarios at once.

sweep is the fast vectorised path over node mixes; sweep_cli the command; sweep_dataset,
sweep_cluster and sweep_drift write the dataset (locally or on a Dask cluster, with drift);
sweep_fit, sweep_summary and sweep_figures read it back. The sweep sits above everything else in
simulator/: it imports models/, engines/, strategies/, outputs/ and the simulate command's
helpers in simulator.cli; nothing below imports it.
"""
