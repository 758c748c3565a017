#!/usr/bin/env bash
# On the lent GPU machine (Python 3.12 with JAX and its CUDA plugin, no network): install the
# carried wheels beside JAX and run the kit. Prints one line per case; the reports go to
# $OUT/gpu-kit.json (the device tool's output folder) or KIT_FOLDER/gpu-kit.json.
#   bash benchmarks/gpu/device.sh [KIT_FOLDER] [run.py options]
# PYTHON names the interpreter with JAX (default python3; here: PYTHON=.venv-jax/bin/python).
set -euo pipefail
cd "$(dirname "$0")/../.."
kit=${1:-benchmarks/gpu/kit}
shift || true
site=$(mktemp -d)
python=${PYTHON:-python3}
"$python" -m pip install --quiet --no-deps --no-index --target "$site" "$kit"/wheels/*.whl
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
PYTHONPATH="$site" "$python" benchmarks/gpu/run.py --kit "$kit" --json "${OUT:-$kit}/gpu-kit.json" "$@"
