"""Stable-Baselines3 DQN (CnnPolicy) on ALE/Breakout-v5 for a fixed number of agent steps.

Runs in the peers venv (``bash benchmarks/peers/setup.sh``), started by ``breakout_sb3.py`` as
a whole process. The env is the one ``replaygpu demo breakout`` trains on: ALE v5 with sticky
actions (``--sticky``, 0.25 by default), gymnasium's ``AtariPreprocessing`` (frame skip 4, 84x84
grey, up to 30 no-ops), FIRE pressed after a reset and after each lost life (as the demo's
``FireToLaunch`` does), 4 stacked frames. Training also uses SB3's own ``EpisodicLifeEnv``
(a lost life ends the training episode; the game plays on) and ``ClipRewardEnv`` (sign of the
reward), as the demo does in its loop; one difference: after a lost life, ``EpisodicLifeEnv``'s
reset plays one extra NOOP step (4 frames) that the agent does not see, where the demo starts
the new stack from the frame after FIRE. Hyperparameters are rl-zoo3's Atari DQN, with
``learning_starts`` lowered so that a short run trains.

With ``--eval-episodes N`` it then plays N full games (no life-loss ends, raw rewards) at
epsilon ``--eval-epsilon``, as the demo's evaluation does. Prints one JSON line:
``{"steps", "sgd_steps", "learn_s", "train_s", "eval_returns"}`` (``train_s``: seconds inside
SB3's ``train`` calls, i.e. the SGD steps).

    benchmarks/peers/.venv-peers/bin/python benchmarks/peers/sb3_breakout.py --steps 5000
"""

from __future__ import annotations
import __future__

import argparse
import ast
import json
import time
from pathlib import Path
from typing import Any

import ale_py
import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation
from stable_baselines3 import DQN
from stable_baselines3.common.atari_wrappers import ClipRewardEnv, EpisodicLifeEnv


def _fire_to_launch() -> type:
    """The demo's own ``FireToLaunch`` (``agents/envs.py``, gymnasium only), its class read from
    the file and run alone: this venv has neither replaygpu nor TensorFlow."""
    path = Path(__file__).resolve().parents[2] / "agents" / "envs.py"
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FireToLaunch")
    namespace = {"gym": gym, "Any": Any}
    flags = __future__.annotations.compiler_flag
    exec(compile(ast.Module([node], []), str(path), "exec", flags=flags), namespace)
    return namespace["FireToLaunch"]


FireToLaunch = _fire_to_launch()


def make_env(seed: int, sticky: float, training: bool) -> gym.Env:
    gym.register_envs(ale_py)
    env = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=sticky)
    env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
    env = FireToLaunch(env)
    if training:
        env = ClipRewardEnv(EpisodicLifeEnv(env))
    env = FrameStackObservation(env, 4)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def evaluate(model: DQN, episodes: int, epsilon: float, seed: int, sticky: float) -> list[float]:
    env, rng = make_env(seed, sticky, training=False), np.random.default_rng(seed)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done, total = False, 0.0
        while not done:
            if rng.random() < epsilon:
                action = int(rng.integers(env.action_space.n))
            else:
                action = int(model.predict(np.asarray(obs), deterministic=True)[0])
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--learning-starts", type=int, default=1000)
    parser.add_argument("--sticky", type=float, default=0.25, help="repeat_action_probability")
    parser.add_argument("--eval-episodes", type=int, default=0)
    parser.add_argument("--eval-epsilon", type=float, default=0.05)
    args = parser.parse_args()
    model = DQN(
        "CnnPolicy",
        make_env(args.seed, args.sticky, training=True),
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
    returns = evaluate(
        model, args.eval_episodes, args.eval_epsilon, args.seed + 10_000, args.sticky
    )
    print(
        json.dumps(
            {
                "steps": args.steps,
                "sgd_steps": timed["steps"],
                "learn_s": learn_s,
                "train_s": timed["s"],
                "eval_returns": returns,
            }
        )
    )


if __name__ == "__main__":
    main()
