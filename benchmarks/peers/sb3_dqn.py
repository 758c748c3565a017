"""Stable-Baselines3 DQN on CartPole-v1 with rl-zoo3's hyperparameters, then a greedy evaluation.

Runs in the peers venv (``bash benchmarks/peers/setup.sh``), started by ``cartpole_sb3.py`` as a
whole process, so its wall-clock counts the imports as the replaygpu demo's does. Prints one
JSON line: ``{"seed", "train_s", "eval_mean", "eval_min", "episodes"}``, ``episodes`` the
training episodes as ``[unix time at its end, return]`` (for the learning-curve figure).

    benchmarks/peers/.venv-peers/bin/python benchmarks/peers/sb3_dqn.py --seed 0
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3 import DQN

# rl-zoo3 hyperparams/dqn.yml, CartPole-v1 (n_timesteps 5e4).
ZOO_CARTPOLE = {
    "policy": "MlpPolicy",
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}
STEPS = 50_000


def evaluate(model: Any, episodes: int, seed: int, env_id: str = "CartPole-v1") -> np.ndarray:
    """Greedy (deterministic) returns of an SB3 ``model`` over ``episodes`` episodes of
    ``env_id``, env seeds ``seed + i`` (as `replaygpu eval`); `sb3_sac.py` uses it too."""
    env = gym.make(env_id)
    returns = np.zeros(episodes)
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            action = action if action.shape else int(action)  # Discrete: a 0-d array, as an int
            obs, reward, terminated, truncated, _ = env.step(action)
            returns[ep] += float(reward)
            done = terminated or truncated
    env.close()
    return returns


class EpisodeTimes(gym.Wrapper):
    """Records ``[unix time, return]`` at the end of each training episode."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.episodes: list[list[float]] = []
        self._return = 0.0

    def step(self, action: Any) -> tuple[Any, ...]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        if terminated or truncated:
            self.episodes.append([time.time(), self._return])
            self._return = 0.0
        return obs, reward, terminated, truncated, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=20)
    args = parser.parse_args()
    env = EpisodeTimes(gym.make("CartPole-v1"))
    model = DQN(env=env, seed=args.seed, device="cpu", **ZOO_CARTPOLE)
    start = time.perf_counter()
    model.learn(total_timesteps=STEPS)
    train_s = time.perf_counter() - start
    returns = evaluate(model, args.episodes, seed=10_000)
    print(
        json.dumps(
            {
                "seed": args.seed,
                "train_s": train_s,
                "eval_mean": float(returns.mean()),
                "eval_min": float(returns.min()),
                "episodes": env.episodes,
            }
        )
    )


if __name__ == "__main__":
    main()
