"""calibrate: devices -> profiles (step time and memory per batch size), and the GPU catalog.

Torch-free modules (`presets`, `catalog`, `profiles`) may be imported by the simulator;
anything that touches torch imports it inside functions or lives in its own module.
"""
