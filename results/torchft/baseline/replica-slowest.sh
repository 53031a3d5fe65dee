#!/bin/sh
# replica group slowest: torchft's DiLoCo with replica-slowest.toml (run lighthouse.sh first)
cd "$(dirname "$0")" || exit 2
exec "${PYTHON:-python}" train_torchft.py replica-slowest.toml "$@"
