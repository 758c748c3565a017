"""How close SAC's fused SGD step is to this CPU core's matrix-multiply peak (issue 35, item 3).

At 100k MuJoCo env steps the wall clock of `demo halfcheetah` is mostly its 90k SGD steps
(batch 256 through the actor and two 256x256 critics). The issue asks for 3x SB3's wall clock.
This script measures, in one process on one core, round-robin:

- SAC's SGD step in the fused learner (the served learner's update, XLA, HalfCheetah-v5 shapes);
- the core's peak for the same arithmetic: an ``[n, n] x [n, n]`` float32 matmul, the faster of
  XLA's and TensorFlow's own kernel (oneDNN).

and counts the step's multiply-adds from its shapes (the dense layers' forward and backward
passes, ``matmul_flops``). The achieved FLOP/s over the peak says what share of the core the step
uses, a ratio that holds on a shared core too; with SB3's wall clock over ours (``--sb3-ratio``)
it says what share 3x SB3 would need. Run pinned to one core, so both figures share it::

    taskset -c 0 python benchmarks/sac_floor.py --rounds 5 --sb3-ratio 1.92
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import gymnasium as gym
import numpy as np
import tensorflow as tf
from gpu.export import built

from replaygpu.agents.sac.config import SACLearnerConfig


def dense_macs(sizes: list[int]) -> int:
    """Multiply-adds of one forward pass of one row through dense layers of ``sizes``."""
    return sum(a * b for a, b in itertools.pairwise(sizes))


def matmul_flops(obs: int, act: int, hidden: list[int], batch: int) -> int:
    """FLOPs (2 per multiply-add) of the dense layers in one SAC SGD step, per batch.

    With ``A`` the actor's forward pass (obs -> hidden -> mean and log-std) and ``C`` one
    critic's (obs + action -> hidden -> 1), a backward pass costing twice its forward pass (the
    gradients of the weights and of the inputs) and once where only the inputs' are needed:

    - target: the actor on the next observations and both target critics: ``A + 2C``;
    - critic loss: both critics forward and backward: ``2C + 4C``;
    - actor loss: the actor forward and backward, both critics forward and back to the actions
      (inputs only): ``A + 2A + 2C + 2C``.
    """
    actor = dense_macs([obs, *hidden, 2 * act])
    critic = dense_macs([obs + act, *hidden, 1])
    return 2 * batch * (4 * actor + 12 * critic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=200, help="SGD steps per train call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--matmul", type=int, default=1024, help="n of the peak's n x n matmul")
    parser.add_argument(
        "--sb3-ratio",
        type=float,
        default=None,
        help="SB3's wall clock over ours, measured side by side (1.92 on one core each): the "
        "share of the peak that 3x SB3 needs is ours x 3 / this",
    )
    args = parser.parse_args()

    config = SACLearnerConfig(env_id=args.env, buffer_size=50_000, learning_rate=3e-4)
    learner, _ = built(config, 50_000)
    env = gym.make(args.env)
    obs, act = int(np.prod(env.observation_space.shape)), int(np.prod(env.action_space.shape))
    flops = matmul_flops(obs, act, list(config.hidden_sizes), config.batch_size)

    n = args.matmul
    a, b = tf.random.normal([n, n]), tf.random.normal([n, n])
    matmuls = {
        kind: tf.function(lambda x, y: tf.reduce_sum(tf.matmul(x, y)), jit_compile=xla)
        for kind, xla in (("XLA", True), ("oneDNN", False))
    }
    reps = 20

    learner.train(2)  # trace, compile
    for matmul in matmuls.values():
        matmul(a, b).numpy()
    step_s: list[float] = []
    peaks: dict[str, list[float]] = {kind: [] for kind in matmuls}
    for _ in range(args.rounds):
        start = time.perf_counter()
        learner.train(args.steps)
        step_s.append((time.perf_counter() - start) / args.steps)
        for kind, matmul in matmuls.items():
            start = time.perf_counter()
            for _ in range(reps):
                matmul(a, b).numpy()
            peaks[kind].append(reps * 2 * n**3 / (time.perf_counter() - start))

    step = statistics.median(step_s)
    rates = {kind: statistics.median(values) for kind, values in peaks.items()}
    best = max(rates, key=rates.__getitem__)
    top = rates[best]
    achieved = flops / step
    print(
        f"# sac_floor {args.env}: obs {obs}, actions {act}, hidden {list(config.hidden_sizes)}, "
        f"batch {config.batch_size}; medians of {args.rounds} rounds, load "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(f"SAC SGD step (XLA)   : {step * 1e3:.2f} ms, {flops / 1e6:.0f} MFLOP of matmuls")
    print(f"achieved             : {achieved / 1e9:.1f} GFLOP/s")
    for kind, rate in rates.items():
        print(f"{n}x{n} matmul, {kind:6s}: {rate / 1e9:.1f} GFLOP/s (one thread)")
    print(f"core's matmul peak   : {top / 1e9:.1f} GFLOP/s ({best})")
    print(f"share of the peak    : {achieved / top:.0%}")
    if args.sb3_ratio:
        print(
            f"SB3 at {args.sb3_ratio:.2f}x our wall clock: 3x SB3 needs "
            f"{achieved / top * 3 / args.sb3_ratio:.0%} of the peak (the whole run at this "
            "step's share; env steps and acting make it more)"
        )


if __name__ == "__main__":
    main()
