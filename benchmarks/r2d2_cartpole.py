"""R2D2 against a feed-forward DQN on CartPole with the velocities masked (issue 25, item 3).

``CartPoleNoVelocity-v1`` shows ``[cart position, pole angle]`` only. Per seed this trains

  r2d2  ``replaygpu demo r2d2-cartpole``'s agent with its defaults (`R2D2Config`: 100k env
        steps, LSTM 64 on prioritized 30-step sequences with a 10-step burn-in, states stored
        every 10 steps, 5-step double Q with value rescaling);
  dqn   the feed-forward double DQN of ``demo cartpole`` (rl-zoo3's CartPole hyperparameters,
        MLP 256x256) on the same masked env and the same env-step budget;

and prints each one's greedy evaluation (20 episodes, mean and min), env steps, SGD steps and
wall-clock seconds (setup, XLA compilation, acting and training; not the final evaluation or
the import). Target: R2D2 greedy mean >= 475 for every seed. Run:

    python benchmarks/r2d2_cartpole.py                    # seeds 1 2 3, both agents
    python benchmarks/r2d2_cartpole.py --seeds 4 --only r2d2
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from replaygpu.agents.dqn import agent as dqn
from replaygpu.agents.dqn.config import DQNConfig
from replaygpu.agents.envs import CARTPOLE_NO_VELOCITY
from replaygpu.agents.r2d2 import agent as r2d2
from replaygpu.agents.r2d2.config import R2D2Config


def run(name: str, seed: int, steps: int) -> str:
    """Train one agent for ``steps`` env steps; its result line."""
    if name == "r2d2":
        module, config = r2d2, R2D2Config(seed=seed, steps=steps)
    else:
        config = DQNConfig(env_id=CARTPOLE_NO_VELOCITY, seed=seed, steps=steps)
        module = dqn
    began = time.perf_counter()
    result = module.train(config)
    wall = time.perf_counter() - began
    returns = result.eval_returns
    return (
        f"{name:5s} seed {seed}: greedy mean {returns.mean():6.1f} min {returns.min():6.1f} | "
        f"{result.env_steps} env steps, {result.sgd_steps} SGD steps, {result.train_seconds:.0f} s "
        f"training ({result.compile_seconds:.0f} s of it the first, compiling call), "
        f"{wall:.0f} s with the evaluation"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=R2D2Config().steps)
    parser.add_argument("--only", choices=["r2d2", "dqn"], default=None)
    args = parser.parse_args()
    names = [args.only] if args.only else ["r2d2", "dqn"]
    for seed in args.seeds:
        for name in names:
            print(run(name, seed, args.steps), flush=True)


if __name__ == "__main__":
    main()
