"""Acting one env step at a time: an eager Keras call against `NumpyModel` (issue 49, item 2).

The recipes of docs/recipes.md acted with ``model(obs[None], training=False)`` every env step:
an eager TensorFlow call per step. `replaygpu.numpy_model.NumpyModel` runs the same forward pass
in numpy from the model's weights. Per network, both act on the same single observation:

- ``ddpg``: the DDPG actor of docs/recipes.md (Pendulum: obs [3], Dense 256 ReLU twice, a tanh
  output scaled by 2), one float32 observation ``[1, 3]``;
- ``cnn``: the Nature CNN of `agents.networks.nature_cnn` (6 actions), one uint8 stack of four
  84x84 frames ``[1, 4, 84, 84]``.

Each round times --calls calls of each variant in turn (the Keras output converted to numpy, as
acting needs it); rounds alternate which variant goes first so machine load hits both alike.
Printed: the median and best microseconds per call of each, and the ratio Keras / numpy of the
medians, with the largest difference between the two outputs.

Threads (``--threads``), each setting in a fresh process (BLAS reads its thread count when it
loads): ``one``, one BLAS thread and one TensorFlow thread per op and between ops, as every
actor process runs (`agents.distributed.fleet.ACTOR_THREAD_ENV`; a BLAS thread pool per actor
made Atari actors 11x slower on 2 cores); ``default``, what numpy and TensorFlow choose. Run::

    python benchmarks/numpy_policy.py
    python benchmarks/numpy_policy.py --nets ddpg --calls 5000 --repeats 9 --threads one
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from replaygpu.agents.distributed.fleet import ACTOR_THREAD_ENV
from replaygpu.agents.networks import nature_cnn
from replaygpu.numpy_model import NumpyModel

#: calls per round by default: about the same seconds per round for either network
CALLS = {"ddpg": 2000, "cnn": 100}


def ddpg_actor() -> keras.Model:
    """The actor of the DDPG recipe (docs/recipes.md), as written there."""
    obs = keras.Input((3,))
    h = keras.layers.Dense(256, activation="relu")(obs)
    h = keras.layers.Dense(256, activation="relu")(h)
    return keras.Model(obs, 2.0 * keras.layers.Dense(1, activation="tanh")(h))


def network(name: str) -> tuple[keras.Model, np.ndarray]:
    """The model and the one observation it acts on."""
    rng = np.random.default_rng(0)
    if name == "ddpg":
        return ddpg_actor(), rng.normal(size=(1, 3)).astype(np.float32)
    frames = rng.integers(0, 256, (1, 4, 84, 84), dtype=np.uint8)
    return nature_cnn((4, 84, 84), 6, seed=0), frames


def per_call(act: Callable[[], np.ndarray], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        act()
    return (time.perf_counter() - start) / calls


def measure(name: str, calls: int, repeats: int) -> None:
    model, x = network(name)
    policy = NumpyModel.from_keras(model)
    variants: dict[str, Callable[[], np.ndarray]] = {
        "keras model(x, training=False)": lambda: np.asarray(model(x, training=False)),
        "NumpyModel policy(x)": lambda: policy(x),
    }
    outputs = [act() for act in variants.values()]  # warm: the first eager call builds
    gap = float(np.max(np.abs(outputs[0] - outputs[1])))
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(repeats):
        for v in list(variants)[:: 1 if i % 2 == 0 else -1]:
            seconds[v].append(per_call(variants[v], calls))
    medians = {v: statistics.median(s) for v, s in seconds.items()}
    for v, s in seconds.items():
        print(
            f"{name:4s} {v:32s} {medians[v] * 1e6:9.1f} us/call (median of {repeats} rounds "
            f"of {calls}), best {min(s) * 1e6:9.1f}",
            flush=True,
        )
    keras_s, numpy_s = medians.values()
    print(
        f"{name:4s} keras / numpy (medians): {keras_s / numpy_s:.1f}x; outputs differ by at most "
        f"{gap:.1e}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", nargs="+", choices=sorted(CALLS), default=["ddpg", "cnn"])
    parser.add_argument("--calls", type=int, default=0, help="calls per round (0: per net)")
    parser.add_argument("--repeats", type=int, default=7, help="rounds per variant")
    parser.add_argument(
        "--threads", nargs="+", choices=["one", "default"], default=["one", "default"]
    )
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process:
        if os.environ.get("OPENBLAS_NUM_THREADS") == "1":
            tf.config.threading.set_intra_op_parallelism_threads(1)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        threads = tf.config.threading.get_intra_op_parallelism_threads() or "default"
        print(
            f"# threads {args.threads[0]}: BLAS {os.environ.get('OPENBLAS_NUM_THREADS', 'default')}"
            f", TensorFlow {threads}; load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        for name in args.nets:
            measure(name, args.calls or CALLS[name], args.repeats)
        return
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} "
        f"CPUs; tensorflow {tf.__version__}, keras {keras.__version__}, numpy {np.__version__}",
        flush=True,
    )
    for setting in args.threads:
        env = {**os.environ, **(ACTOR_THREAD_ENV if setting == "one" else {})}
        command = [sys.executable, __file__, "--in-process", "--threads", setting, "--nets"]
        command += [*args.nets, "--calls", str(args.calls), "--repeats", str(args.repeats)]
        subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    main()
