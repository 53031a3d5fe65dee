#!/bin/sh
# replica group slow: torchft's DiLoCo with replica-slow.toml (run lighthouse.sh first)
cd "$(dirname "$0")" || exit 2
exec "${PYTHON:-python}" train_torchft.py replica-slow.toml "$@"
