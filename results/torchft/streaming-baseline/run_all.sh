#!/bin/sh
# the lighthouse and every replica group on this machine; the lighthouse stops with them
cd "$(dirname "$0")" || exit 2
./lighthouse.sh & lighthouse=$!
trap 'kill $lighthouse 2>/dev/null' EXIT INT TERM
sleep 1  # the lighthouse binds before the replicas ask it for a quorum
pids=""
./replica-fast.sh & pids="$pids $!"
./replica-medium.sh & pids="$pids $!"
./replica-slow.sh & pids="$pids $!"
./replica-slowest.sh & pids="$pids $!"
status=0
for pid in $pids; do wait "$pid" || status=1; done
exit "$status"
