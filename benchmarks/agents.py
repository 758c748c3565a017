"""Agents benchmark: do the demos' agents learn, and how fast, on this machine.

  dqn   DQN on CartPole-v1 with the rl-zoo3 hyperparameters (lr 2.3e-3, batch 64, buffer 1e5,
        learning_starts 1000, gamma 0.99, train_freq 256, gradient_steps 128, target synced
        after every training call (rl-zoo3's target_update_interval=10 is in env steps),
        exploration_fraction 0.16, final eps 0.04, MLP 256x256), 50k env steps, one run per
        seed. Target: greedy evaluation mean >= 475 over 20 episodes for every seed, and
        wall-clock <= 30 s per run (setup + XLA compilation + acting + training; the final
        evaluation and the Python/TensorFlow import are reported apart).
  sac   SAC on Pendulum-v1, 20k env steps. Target: greedy evaluation mean >= -200.
  apex  Ape-X DQN on CartPole-v1 with 2 actor processes (ApexConfig defaults: 80k env steps,
        3-step returns, batch 128, 32 samples per insert, lr 2e-3 decayed linearly to 2e-5).
        Target: greedy evaluation >= 475; reports actor env steps/s and learner SGD steps/s.
  breakout  DQN with the Nature CNN on Breakout under the Atari-100k protocol: 100k agent steps
        (400k frames), no sticky actions, replay 1e5, training from step 1600, epsilon 1 -> 0.01
        over the first 10k steps, one SGD step (batch 32) every 4 agent steps, target synced
        every 1000 steps, Adam 1e-4, double DQN on 3-step returns; 10 evaluation games at
        epsilon 0.05. ``--breakout-one-step`` trains the Nature/SB3 variant instead (1-step,
        no double DQN), which benchmarks/peers/breakout_sb3.py --atari100k compares with SB3.
        Random play scores 1.7. Target: mean >= 5 (3x random). About 20 min per seed on a
        2-core CPU, so not in CI; tests/test_atari.py runs the same code for a few hundred
        steps.

Prints one line per run, then per-agent medians over runs. Run:
    python benchmarks/agents.py                      # dqn (3 seeds), sac (1 seed), apex (3)
    python benchmarks/agents.py --only dqn --seeds 0 1 2
    python benchmarks/agents.py --only breakout --breakout-seeds 0 1 2
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# This file is named like the `agents` package: drop its folder from the import path so that
# `import agents` finds the package (the repository root, or the installed one).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))
# TensorFlow and the agents are imported inside functions: actor processes are spawned and
# re-import this file, and they must stay free of TensorFlow.


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


BREAKOUT_100K = dict(
    steps=100_000,
    buffer_size=100_000,
    learning_starts=1600,
    repeat_action_probability=0.0,
    exploration_fraction=0.1,
    exploration_final_eps=0.01,
    train_freq=4,
    gradient_steps=1,
    target_update_interval=1000,
    learning_rate=1e-4,
    eval_episodes=10,
    eval_epsilon=0.05,
    n_step=3,
    double_q=True,
)
NATURE_TARGETS = dict(n_step=1, double_q=False)


def run_one(kind: str, seed: int, actor_envs: int = 1, one_step: bool = False) -> dict[str, float]:
    """Train one agent from scratch and measure it."""
    start = time.perf_counter()
    if kind == "dqn":
        from replaygpu.agents.dqn import agent as dqn

        result = dqn.train(dqn.DQNConfig(seed=seed, steps=50_000, eval_episodes=20))
    elif kind == "sac":
        from replaygpu.agents.sac import agent as sac

        result = sac.train(sac.SACConfig(seed=seed, steps=20_000, eval_episodes=10))
    elif kind == "apex":
        from replaygpu.agents.distributed import learner
        from replaygpu.agents.dqn.config import ApexConfig

        config = ApexConfig(seed=seed, num_actors=2, actor_envs=actor_envs, eval_episodes=20)
        result = learner.train(config)
    elif kind == "breakout":
        from replaygpu.agents.dqn import atari

        targets = NATURE_TARGETS if one_step else {}
        result = atari.train(atari.AtariDQNConfig(seed=seed, **{**BREAKOUT_100K, **targets}))
    else:
        raise ValueError(kind)
    total = time.perf_counter() - start
    returns = result.eval_returns
    return {
        "eval_mean": float(returns.mean()),
        "eval_min": float(returns.min()),
        "wall_s": total,
        "train_s": result.train_seconds,
        "compile_s": result.compile_seconds,
        "env_sps": result.env_steps_per_s,
        "sgd_sps": result.sgd_steps_per_s,
        "env_steps": float(result.env_steps),
        "sgd_steps": float(result.sgd_steps),
    }


TARGETS = {"dqn": 475.0, "sac": -200.0, "apex": 475.0, "breakout": 5.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        nargs="*",
        default=["dqn", "sac", "apex"],
        choices=["dqn", "sac", "apex", "breakout"],
        help="which agents to run",
    )
    parser.add_argument(
        "--seeds", nargs="*", type=int, default=[0, 1, 2], help="DQN seeds (one run each)"
    )
    parser.add_argument("--sac-seeds", nargs="*", type=int, default=[0])
    parser.add_argument("--apex-seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--breakout-seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--breakout-one-step",
        action="store_true",
        help="Breakout with 1-step targets and no double DQN (the Nature / SB3 DQN)",
    )
    parser.add_argument("--apex-envs", type=int, default=1, help="envs per Ape-X actor")
    args = parser.parse_args()

    t0 = time.perf_counter()
    import tensorflow as tf

    import_s = time.perf_counter() - t0
    print(
        f"python {platform.python_version()}, tensorflow {tf.__version__}, "
        f"{os.cpu_count()} CPUs, TF+agents import {import_s:.1f} s; {load()}"
    )
    seeds = {
        "dqn": args.seeds,
        "sac": args.sac_seeds,
        "apex": args.apex_seeds,
        "breakout": args.breakout_seeds,
    }
    for kind in args.only:
        rows = []
        for seed in seeds[kind]:
            row = run_one(kind, seed, args.apex_envs, args.breakout_one_step)
            rows.append(row)
            print(
                f"{kind} seed {seed}: greedy eval mean {row['eval_mean']:.1f} "
                f"(min {row['eval_min']:.0f}) | wall {row['wall_s']:.1f} s = train loop "
                f"{row['train_s']:.1f} s (incl. first-call compile {row['compile_s']:.1f} s) "
                f"+ setup/eval {row['wall_s'] - row['train_s']:.1f} s | "
                f"{row['env_sps']:.0f} env steps/s, {row['sgd_sps']:.0f} SGD steps/s | "
                f"{row['env_steps']:.0f} env steps, {row['sgd_steps']:.0f} SGD steps | {load()}",
                flush=True,
            )
        passed = sum(r["eval_mean"] >= TARGETS[kind] for r in rows)
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(
            f"{kind} summary over {len(rows)} run(s): eval >= {TARGETS[kind]:g} in {passed}/"
            f"{len(rows)}; median wall {med['wall_s']:.1f} s, median train loop "
            f"{med['train_s']:.1f} s, median {med['env_sps']:.0f} env steps/s, median "
            f"{med['sgd_sps']:.0f} SGD steps/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
