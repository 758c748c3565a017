"""Partially observed variants of gymnasium's classic-control envs, registered by id.

``CartPoleNoVelocity-v1`` is CartPole-v1 with the two velocities taken out of the observation
(it shows ``[cart position, pole angle]``): a policy must infer the velocities from the
recent past, which a feed-forward Q-network cannot, and a recurrent one (R2D2) can. Importing
this module registers the ids, so ``gym.make("CartPoleNoVelocity-v1")`` works in any process
that imported it (the R2D2 agent does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

#: the masked CartPole's id; observations are ``[x, theta]``
CARTPOLE_NO_VELOCITY = "CartPoleNoVelocity-v1"


class KeepObservations(gym.ObservationWrapper):
    """Keeps only the entries ``keep`` of a flat Box observation (masks the others out).

    Args:
        env: an env with a 1-D Box observation space.
        keep: indices of the entries to keep, in order.
    """

    def __init__(self, env: gym.Env, keep: Sequence[int]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"KeepObservations: got {space}, expected a 1-D Box space")
        self.keep = np.asarray(keep, np.int64)
        self.observation_space = gym.spaces.Box(
            space.low[self.keep], space.high[self.keep], dtype=space.dtype
        )

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(observation)[self.keep]


def make_cartpole_no_velocity(**kwargs: Any) -> gym.Env:
    """CartPole-v1 (500 steps) showing ``[cart position, pole angle]`` only."""
    return KeepObservations(gym.make("CartPole-v1", **kwargs), keep=(0, 2))


if CARTPOLE_NO_VELOCITY not in gym.registry:
    gym.register(CARTPOLE_NO_VELOCITY, entry_point=make_cartpole_no_velocity)
