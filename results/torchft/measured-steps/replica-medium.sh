#!/bin/sh
# replica group medium: torchft's DiLoCo with replica-medium.toml (run lighthouse.sh first)
cd "$(dirname "$0")" || exit 2
exec "${PYTHON:-python}" train_torchft.py replica-medium.toml "$@"
