"""simulator: scenarios, timing and network models, strategies, SimPy engine and analytic path.

Never imports torch, calibrate/ or real/: profiles arrive as files read through formats/, and
the simulator's own models of them live here (profile_fit: t(b) and m(b); netfit: the network
profile's fits; estimate: the catalog step time; memory: the bytes a node holds). The GPU
catalog and presets come from facts/.

Rooms, bottom up: models/ (what a step, a link, a round cost), engines/ (the clocks: analytic,
SimPy, async), strategies/ (the plans), outputs/ (files, trace, figures, the report), sweep/
(`geodt sweep`); at the top the scenario (scenario.py, scenarios/) and the commands (cli.py,
__main__.py). tests/test_imports.py holds the arrows between them.
"""
