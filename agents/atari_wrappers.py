"""Atari env wrappers that need gymnasium only (no TensorFlow, no replaygpu), so the peers'
benchmarks can load this file by path and run the very wrapper the demos use."""

from __future__ import annotations

from typing import Any

import gymnasium as gym


class FireToLaunch(gym.Wrapper):
    """Presses FIRE (action 1) after a reset and after each lost life, within the same step.

    Breakout waits for FIRE to launch the ball at the start of every life. SB3's AtariWrapper
    does the same (FireResetEnv over EpisodicLifeEnv): without it a near-greedy policy that has
    not learned to fire yet stands still until the episode's time limit, which made Ape-X
    actors with small epsilons send thousands of useless frames. A step that loses a life
    returns the observation after the FIRE, with both steps' rewards and the lower ``lives``,
    so the training loop still sees the life loss (and treats the transition as terminal).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._lives = 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:  # cannot happen in Breakout; start over as SB3 does
            obs, info = self.env.reset(**kwargs)
        self._lives = int(info.get("lives", 0))
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = int(info.get("lives", 0))
        if lives < self._lives and not (terminated or truncated):
            obs, more, terminated, truncated, info = self.env.step(1)
            reward = float(reward) + float(more)
        self._lives = int(info.get("lives", lives))
        return obs, reward, terminated, truncated, info
