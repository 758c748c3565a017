#!/usr/bin/env bash
# Prepare the GPU kit here, for a lent GPU machine without network and without TensorFlow:
# export the fused train calls (TensorFlow, this checkout's environment) and download the wheels
# the JAX + flashbax baseline needs there (pure Python: flashbax, chex, optax, toolz, absl-py,
# typing_extensions). Writes benchmarks/gpu/kit/ (ignored by git, about 50 MB: carry it).
#   bash benchmarks/gpu/prepare.sh           # every case
#   bash benchmarks/gpu/prepare.sh --quick   # the small cases
#   bash benchmarks/gpu/prepare.sh --device-check   # the device check's (dqn64, dqn256,
#                                                   # r2d2-paper, atari; 37 MiB)
set -euo pipefail
cd "$(dirname "$0")/../.."
kit=benchmarks/gpu/kit
rm -rf "$kit"
python benchmarks/gpu/export.py --out "$kit" "$@"
python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --dest "$kit/wheels" flashbax==0.1.3 chex==0.1.92 optax==0.2.8 toolz absl-py typing_extensions
du -sh "$kit"
