"""Stable-Baselines3 DQN (CnnPolicy) on ALE/Breakout-v5 for a fixed number of agent steps.

Runs in the peers venv (``bash benchmarks/peers/setup.sh``), started by ``breakout_sb3.py`` as
a whole process. The env is the one ``replaygpu demo breakout`` trains on: ALE v5 with sticky
actions 0.25, gymnasium's ``AtariPreprocessing`` (frame skip 4, 84x84 grey, up to 30 no-ops),
4 stacked frames; SB3's ``AtariWrapper`` would add FIRE on reset, which the demo does not do.
Life loss is not made terminal here (SB3's EpisodicLifeEnv needs the NoFrameskip stack); this
changes no timing. Hyperparameters are rl-zoo3's Atari DQN, with ``learning_starts`` lowered so
that a short run trains. Prints one JSON line: ``{"steps", "sgd_steps", "learn_s", "train_s"}``
(``train_s``: seconds inside SB3's ``train`` calls, i.e. the SGD steps).

    benchmarks/peers/.venv-peers/bin/python benchmarks/peers/sb3_breakout.py --steps 5000
"""

from __future__ import annotations

import argparse
import json
import time

import ale_py
import gymnasium as gym
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation
from stable_baselines3 import DQN


def make_env(seed: int) -> gym.Env:
    gym.register_envs(ale_py)
    env = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.25)
    env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
    env = FrameStackObservation(env, 4)
    env.reset(seed=seed)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--learning-starts", type=int, default=1000)
    args = parser.parse_args()
    model = DQN(
        "CnnPolicy",
        make_env(args.seed),
        learning_rate=1e-4,
        buffer_size=100_000,
        learning_starts=args.learning_starts,
        batch_size=32,
        gamma=0.99,
        train_freq=4,
        gradient_steps=1,
        target_update_interval=1000,
        exploration_fraction=0.1,
        exploration_final_eps=0.01,
        optimize_memory_usage=False,
        seed=args.seed,
        device="cpu",
    )
    timed = {"s": 0.0, "steps": 0}
    train = model.train

    def timed_train(gradient_steps: int, batch_size: int = 100) -> None:
        start = time.perf_counter()
        train(gradient_steps=gradient_steps, batch_size=batch_size)
        timed["s"] += time.perf_counter() - start
        timed["steps"] += gradient_steps

    model.train = timed_train
    start = time.perf_counter()
    model.learn(total_timesteps=args.steps)
    learn_s = time.perf_counter() - start
    print(
        json.dumps(
            {
                "steps": args.steps,
                "sgd_steps": timed["steps"],
                "learn_s": learn_s,
                "train_s": timed["s"],
            }
        )
    )


if __name__ == "__main__":
    main()
