"""simulator: scenarios, timing and network models, strategies, SimPy engine and analytic path.

Never imports torch: it reads profiles and the GPU catalog through torch-free calibrate modules.
"""
