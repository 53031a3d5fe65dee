"""simulator.engines: the clocks that turn a plan and the models into a timeline.

engine is the one entry (simulate, simulate_chunks) that dispatches to the analytic path
(engine_analytic), the SimPy event simulation (engine_simpy) and the barrier-free runs (async and
quorum, engine_async). Engines import models/ and the scenario, never strategies/, sweep/ or
outputs/.
"""
