"""simulator.models: what one node, link and round cost, with no clock of their own.

The step time (estimate, profile_fit, profile_check, timing, layout_choice, memory), the network
and its fits (network, netfit), what a run changes as it goes (drift, outage, workload,
checkpoints, adaptive, wallclock), the loss a run reaches (convergence, convergence_prior,
loss_prediction), and the small records of a run (totals, provenance). Models import the
scenario and one another, never engines/, strategies/, sweep/ or outputs/.
"""
