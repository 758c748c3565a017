#!/usr/bin/env bash
# Create (or bring up to date) the virtual environments of the peer libraries that
# benchmarks/peers/*.py compare replaygpu with. They are never dependencies of replaygpu.
#   benchmarks/peers/.venv-peers     SB3, cpprb, gymnasium, ale-py (torch 2.13.0)
#   benchmarks/peers/.venv-torchrl   TorchRL (torch 2.14.1, the torch its C++ extension needs)
# Idempotent: a second run only checks the pins.
#   bash benchmarks/peers/setup.sh            # uses python3; PYTHON=python3.11 to choose
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
# Pinned peers. SB3 needs torch; the figures in benchmarks/README.md used its CPU build
# (2.13.0+cpu, which pip takes from a local wheel folder where one is configured); PyPI's
# default build works the same on CPU, only larger.
peers_pins=(
  "torch==2.13.0"
  "stable-baselines3==2.9.2"
  "gymnasium==1.4.0"
  "mujoco==4.0.0"                      # sb3_sac.py (MuJoCo envs: the [mujoco] extra resolved to it)
  "imageio==2.38.1"                    # gymnasium.envs.mujoco imports these two
  "packaging==26.4"                    # (gymnasium[mujoco] pulls them; the pins above do not)
  "cpprb==11.0.0"
  "numpy==2.4.6"
  "ale-py==0.12.1"                     # breakout_sb3.py (the versions replaygpu's atari extra
  "opencv-python-headless==5.0.0.93"   # resolved to here)
)
# TorchRL in a venv of its own: its wheel's C++ extension (torchrl._torchrl, the sum tree of
# its PrioritizedSampler) is built against one torch release, and 0.14.x's needs symbols that
# torch 2.13 lacks (torch::autograd::_wrap_outputs with a trailing Node intrusive_ptr&,
# fire_node_creation_hooks); all of them resolve in torch 2.14.1. PyPI's default torch 2.14.1
# is a CUDA build (about 5 GB with its nvidia-* wheels) that runs the same on CPU.
torchrl_pins=(
  "torch==2.14.1"
  "torchrl==0.14.1"
  "tensordict==0.14.3"
  "numpy==2.4.6"
)

make_venv() {  # make_venv DIR PIN...: create DIR if absent, install the pins
  local venv="$1"
  shift
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
  fi
  [ -e "$venv/.gitignore" ] || echo '*' >"$venv/.gitignore"  # as python>=3.13's venv does
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}

make_venv "$here/.venv-peers" "${peers_pins[@]}"
"$here/.venv-peers/bin/python" - <<'PY'
from importlib.metadata import version

names = ("torch", "stable-baselines3", "gymnasium", "cpprb", "ale-py")
print("peers venv ready: " + ", ".join(f"{n} {version(n)}" for n in names))
PY
make_venv "$here/.venv-torchrl" "${torchrl_pins[@]}"
"$here/.venv-torchrl/bin/python" - <<'PY'
from importlib.metadata import version

import torchrl._torchrl  # noqa: F401  (fails here if the C++ extension does not load)

names = ("torch", "torchrl", "tensordict")
print("torchrl venv ready: " + ", ".join(f"{n} {version(n)}" for n in names))
PY
