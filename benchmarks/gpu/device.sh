#!/usr/bin/env bash
# On the lent GPU machine (Python 3.12 with JAX and its CUDA plugin, no network): install the
# carried wheels beside JAX and run the device check: every case of the kit and the pure-JAX
# round-trip pair under each XLA flag set (default, while, while-unroll, no-command-buffers),
# each set in a process of its own (check.py). Prints one line per case and set, then a summary
# table; the report goes to $OUT/gpu-kit.json (the device tool's output folder) or
# KIT_FOLDER/gpu-kit.json.
#   bash benchmarks/gpu/device.sh [KIT_FOLDER] [check.py and run.py options]
# e.g. `--flag-sets default while`, `--repeats 3`, `--set-timeout 100` (seconds per set).
# PYTHON names the interpreter with JAX (default python3; here: PYTHON=.venv-jax/bin/python).
set -euo pipefail
cd "$(dirname "$0")/../.."
kit=${1:-benchmarks/gpu/kit}
shift || true
site=$(mktemp -d)
python=${PYTHON:-python3}
"$python" -m pip install --quiet --no-deps --no-index --target "$site" "$kit"/wheels/*.whl
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
du -sh "$kit"
PYTHONPATH="$site" "$python" benchmarks/gpu/check.py --kit "$kit" \
  --json "${OUT:-$kit}/gpu-kit.json" "$@"
