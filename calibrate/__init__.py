"""calibrate: the measuring stage: a device -> a profile (step time and memory per batch size).

It times train/'s step (the one the executor runs) and writes profiles through formats/; it
imports no other stage. Link and scenario calibration, which need the executor or a scenario,
are in geodt/calibration/.
"""
