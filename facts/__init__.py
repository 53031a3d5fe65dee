"""facts: what every stage knows and nobody measures: the GPU catalog and the model presets.

Torch-free (numpy, pandas and the standard library); calibrate/, simulator/, real/ and geodt/ all
may import it, and it imports only formats/.
"""
