"""real.checkpoint: a node's checkpoints (checkpoint) and the sets on disk that hold them (ckpt_set).

A checkpoint holds a round's state, an async or quorum run's cut among it, so it imports core/ and
rounds/, never membership/, wan/ or process/.
"""
