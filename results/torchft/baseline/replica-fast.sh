#!/bin/sh
# replica group fast: torchft's DiLoCo with replica-fast.toml (run lighthouse.sh first)
cd "$(dirname "$0")" || exit 2
exec "${PYTHON:-python}" train_torchft.py replica-fast.toml "$@"
