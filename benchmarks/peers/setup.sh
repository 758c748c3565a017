#!/usr/bin/env bash
# Create (or bring up to date) benchmarks/peers/.venv-peers: the peer libraries that
# benchmarks/peers/*.py compare replaygpu with, in their own virtual environment. They are
# never dependencies of replaygpu. Idempotent: a second run only checks the pins.
#   bash benchmarks/peers/setup.sh            # uses python3; PYTHON=python3.11 to choose
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-peers"
python="${PYTHON:-python3}"
# Pinned peers. SB3 and TorchRL need torch; the figures in benchmarks/README.md used its CPU
# build (2.13.0+cpu, which pip takes from a local wheel folder where one is configured);
# PyPI's default build works the same on CPU, only larger.
pins=(
  "torch==2.13.0"
  "stable-baselines3==2.9.2"
  "gymnasium==1.4.0"
  "cpprb==11.0.0"
  "torchrl==0.14.1"
  "tensordict==0.14.3"
  "numpy==2.4.6"
  "ale-py==0.12.1"                     # breakout_sb3.py (the versions replaygpu's atari extra
  "opencv-python-headless==5.0.0.93"   # resolved to here)
)
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "${pins[@]}"
"$venv/bin/python" - <<'PY'
from importlib.metadata import version

names = ("torch", "stable-baselines3", "gymnasium", "cpprb", "torchrl", "tensordict", "ale-py")
print("peers venv ready: " + ", ".join(f"{n} {version(n)}" for n in names))
PY
