"""Calibrations that compose stages: links and scenarios.

`geodt calibrate network` times the executor's own sync (real/) between real processes
(`links`), on a scenario's shaped WAN (`wan_links`, which plans the scenario's round with the
simulator), and `geodt calibrate scenario` measures every node of a scenario at once
(`scenario`). Devices alone are measured by calibrate/, which imports no other stage; these
live here because they need real/'s sync or the simulator's scenario, which calibrate/ may not
import. `cli` is the one `geodt calibrate` with a subcommand per mode.
"""
