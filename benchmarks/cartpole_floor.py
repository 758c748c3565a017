"""The floor of `replaygpu demo cartpole` on this machine: import, compilation and SGD alone.

Builds the demo's DQN update (rl-zoo3's CartPole-v1 hyperparameters: batch 64, MLP 256x256) on
a table of 50k random CartPole-shaped rows and times, in one process: the TensorFlow + agents
import, the first ``Learner.train(128)`` call (trace + XLA compilation), and the median of
``--calls`` further calls, scaled to the demo's 24,576 SGD steps. With and without double DQN
(rl-zoo3's SB3 DQN is not double). No env step is taken: whatever the demo does beyond this is
acting, logging and evaluation. Run:

    python benchmarks/cartpole_floor.py              # both variants, one subprocess each
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
SGD_STEPS = 24_576  # 192 training calls of 128 steps in 50k env steps (train_freq 256)


def measure(double_q: bool, calls: int) -> None:
    start = time.perf_counter()
    import numpy as np

    import replaygpu as rg
    from replaygpu.agents.dqn import DQN, DQNConfig
    from replaygpu.agents.envs import make_vector_env

    import_s = time.perf_counter() - start
    config = DQNConfig(double_q=double_q)
    table = rg.ReplayTable(rg.specs_from_env(make_vector_env("CartPole-v1", 1, 0)), 100_000)
    rng, n = np.random.default_rng(0), 50_000
    table.append(
        {
            "obs": rng.normal(size=(n, 4)).astype(np.float32),
            "action": rng.integers(2, size=n),
            "reward": np.ones(n, np.float32),
            "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
            "terminated": np.zeros(n, bool),
            "truncated": np.zeros(n, bool),
        }
    )
    agent = DQN(4, 2, config)
    sampler = rg.UniformSampler(table, seed=0)
    learner = rg.Learner(
        table, sampler, agent.update, config.batch_size, jit_compile=True, autograph=False
    )
    start = time.perf_counter()
    learner.train(config.gradient_steps)
    first_s = time.perf_counter() - start
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        learner.train(config.gradient_steps)
        times.append(time.perf_counter() - start)
    step_s = float(np.median(times)) / config.gradient_steps
    print(
        f"double_q={double_q}: import {import_s:.1f} s, first call {first_s:.2f} s, "
        f"{step_s * 1e3:.3f} ms a step -> {SGD_STEPS} SGD steps {step_s * SGD_STEPS:.1f} s; "
        f"floor {import_s + first_s + step_s * SGD_STEPS:.1f} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40, help="timed calls of 128 steps")
    parser.add_argument("--child", choices=["double", "single"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure(args.child == "double", args.calls)
        return
    print(f"{os.cpu_count()} CPUs, load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for variant in ("double", "single"):  # a fresh process each: the import is measured too
        cmd = [sys.executable, __file__, "--child", variant, "--calls", str(args.calls)]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
