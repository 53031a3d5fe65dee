#!/bin/sh
# torchft's lighthouse for this plan (geodt plan --export torchft).
# join_timeout_ms: how long a quorum waits for a live straggler: the slowest replica's predicted round 7.716 s × time scale 5 + the band 38.2% = 10.663 s
# quorum_tick_ms: 1% of the predicted round (1 to 100 ms): each quorum's wait rounds up to a tick
# heartbeat_timeout_ms: torchft's default; a stopped replica leaves the quorum after it
exec torchft_lighthouse --bind 127.0.0.1:53685 --min_replicas 4 --join_timeout_ms 10663 --quorum_tick_ms 77 --heartbeat_timeout_ms 5000
