"""real.membership: who is in the run.

members (the policy the one round loop consults: a fixed membership, or `--on-node-loss
continue`'s), membership (epochs, joins and admissions kept in the launcher's store) and inject
(faults at exact points, for the tests and benchmarks). Imports core/, rounds/ and checkpoint/,
never wan/ or process/.
"""
