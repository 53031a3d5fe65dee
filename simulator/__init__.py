"""simulator: scenarios, timing and network models, strategies, SimPy engine and analytic path.

Never imports torch, calibrate/ or real/: profiles arrive as files read through formats/, and
the simulator's own models of them live here (profile_fit: t(b) and m(b); netfit: the network
profile's fits; estimate: the catalog step time; memory: the bytes a node holds). The GPU
catalog and presets come from facts/.
"""
