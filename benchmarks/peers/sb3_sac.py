"""Stable-Baselines3 SAC on a MuJoCo env with rl-zoo3's hyperparameters, then a greedy
evaluation. Runs in the peers venv (``bash benchmarks/peers/setup.sh`` plus ``mujoco``), started
by ``mujoco_sb3.py`` as a whole process. Prints one JSON line: ``{"seed", "train_s",
"eval_mean", "eval_min", "episodes"}``, ``episodes`` the training episodes as ``[unix time at
its end, return]``.

    benchmarks/peers/.venv-peers/bin/python benchmarks/peers/sb3_sac.py --seed 0 --steps 100000
    ... --train-freq 64 --gradient-steps 64    # replaygpu's chunking (the default: SB3's 1/1)
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
from sb3_dqn import EpisodeTimes, evaluate
from stable_baselines3 import SAC

# rl-zoo3 hyperparams/sac.yml, HalfCheetah/Hopper/Walker2d (mujoco defaults): SB3's defaults
# (lr 3e-4, buffer 1e6, batch 256, tau 0.005, gamma 0.99, 256x256, auto entropy) and
# learning_starts 10000; n_timesteps 1e6 there
ZOO_MUJOCO = {"policy": "MlpPolicy", "learning_starts": 10_000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--train-freq", type=int, default=1)
    parser.add_argument("--gradient-steps", type=int, default=1)
    parser.add_argument("--episodes", type=int, default=10)
    args = parser.parse_args()
    env = EpisodeTimes(gym.make(args.env))
    model = SAC(
        env=env,
        seed=args.seed,
        device="cpu",
        train_freq=args.train_freq,
        gradient_steps=args.gradient_steps,
        **ZOO_MUJOCO,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=args.steps)
    train_s = time.perf_counter() - start
    returns = evaluate(model, args.episodes, seed=10_000, env_id=args.env)
    result = {
        "seed": args.seed,
        "train_s": train_s,
        "eval_mean": float(returns.mean()),
        "eval_min": float(returns.min()),
        "episodes": env.episodes,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
