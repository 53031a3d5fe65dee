"""real.rounds: the kinds of round a node runs, and what they share.

rounds (the Round interface, the node's parts, the one inner-step loop), round_classic (DiLoCo),
round_ddp (sync-ddp), round_streaming (Streaming DiLoCo), round_async and round_quorum (no
barrier, both round_server's parameter-server round), adaptive (rebalance / deadline), trace
(the rows of trace.csv) and state (a node's state in one object: what checkpoints and membership
work on). Rounds import core/, never checkpoint/, membership/, wan/ or process/.
"""
