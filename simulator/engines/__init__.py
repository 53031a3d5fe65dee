"""simulator.engines: the clocks that turn a plan and the models into a timeline.

engine is the one entry (simulate, simulate_chunks): it hands a plan to the engine its kind of round
names (formats/rounds.py; frames.engine_for): rounds_barrier (DiLoCo, sync-ddp), rounds_streaming
(Streaming DiLoCo) and rounds_server (async and quorum), which run the clocks: the analytic path
(engine_analytic), the SimPy event simulation (engine_simpy) and the barrier-free ones (engine_async).
Engines import models/ and the scenario, never strategies/, sweep/ or outputs/.
"""
