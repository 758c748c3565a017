"""The envs the agents make, and the checks a config runs on them before TensorFlow loads.

Agents step a `gymnasium.vector.SyncVectorEnv` with same-step autoreset (`OneEnv` for one env):
at an episode's end ``step`` returns the next one's first observation and puts the true last one
in ``info["final_obs"]``, so every step yields one valid transition per env. Transitions go to
the table one `ReplayTable.append` per chunk, never per step. Importing this module registers
``CartPoleNoVelocity-v1``, so every agent and actor can make it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

import replaygpu as rg


def make_vector_env(env_id: str, num_envs: int, seed: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``env_id`` stepped in-process, reset with seeds ``seed + i``.
    Raises ConfigError when num_envs < 1 or the id is not a registered gymnasium env."""
    if num_envs < 1:
        raise rg.ConfigError(f"num_envs: got {num_envs}, expected >= 1")
    require_env_id(env_id)
    if num_envs == 1:
        env: gym.vector.VectorEnv = OneEnv(gym.make(env_id))
    else:
        env = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        )
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


class OneEnv(gym.vector.VectorEnv):
    """One env as a vector env of size 1, stepping as ``SyncVectorEnv`` with same-step autoreset
    does (a test steps both side by side) without its per-step batching through the space, deep
    copy and empty-info merging: about 45 us a step, twice CartPole's own step."""

    def __init__(self, env: gym.Env) -> None:
        self.env = env
        self.num_envs = 1
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space
        self.observation_space = gym.vector.utils.batch_space(env.observation_space, 1)
        self.action_space = gym.vector.utils.batch_space(env.action_space, 1)
        self.metadata = {**env.metadata, "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self.spec = env.spec
        self._box = isinstance(env.observation_space, gym.spaces.Box)
        # a batch of these spaces is one array: its first row is the env's action
        self._row_action = isinstance(env.action_space, (gym.spaces.Discrete, gym.spaces.Box))
        self.closed = False

    def _batch(self, obs: Any) -> Any:
        if self._box:  # a copy, as SyncVectorEnv's: an env may reuse its array
            return np.array(obs, self.single_observation_space.dtype)[None]
        return gym.vector.utils.concatenate(
            self.single_observation_space,
            [obs],
            gym.vector.utils.create_empty_array(self.single_observation_space, 1),
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return self._batch(obs), self._add_info({}, info, 0)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self._row_action:
            action = actions[0]
        else:
            action = next(iter(gym.vector.utils.iterate(self.action_space, actions)))
        obs, reward, terminated, truncated, info = self.env.step(action)
        out: dict[str, Any] = {}
        if terminated or truncated:
            out = self._add_info(out, {"final_obs": obs, "final_info": info}, 0)
            obs, info = self.env.reset()
        if info:
            out = self._add_info(out, info, 0)
        return (
            self._batch(obs),
            np.array([reward], np.float64),
            np.array([terminated], bool),
            np.array([truncated], bool),
            out,
        )

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.env.close()
            self.closed = True


def make_atari_env(
    env_id: str, seed: int, repeat_action_probability: float = 0.25, noop_max: int = 30
) -> gym.Env:
    """An ALE game with the standard DQN preprocessing: ``[84, 84]`` uint8 grey frames,
    max-pooled frame skip of 4, up to ``noop_max`` no-ops at reset, raw rewards (training clips).

    It never ends an episode on a life loss: the training loop marks those terminal itself
    (``info["lives"]``) and plays on, as SB3's ``EpisodicLifeEnv`` does (the wrapper's own
    ``terminal_on_life_loss`` would reset the whole game). Games that wait for FIRE to start a
    life (Breakout) get `FireToLaunch`. Raises ConfigError when ale-py is not installed or
    ``env_id`` is not an ALE game.
    """
    try:
        import ale_py
    except ImportError:
        raise rg.ConfigError(
            "the Atari demos need ale-py (which ships the ROMs) and opencv; install them with: "
            'pip install "replaygpu[atari]"'
        ) from None
    from gymnasium.wrappers import AtariPreprocessing

    gym.register_envs(ale_py)
    if env_id not in gym.registry or not env_id.startswith("ALE/"):
        raise rg.ConfigError(
            f"env id: got {env_id!r}, expected an ALE game id such as 'ALE/Breakout-v5' "
            "(see gymnasium.pprint_registry())"
        )
    env = gym.make(env_id, frameskip=1, repeat_action_probability=repeat_action_probability)
    env = AtariPreprocessing(
        env, noop_max=noop_max, frame_skip=4, screen_size=84, grayscale_obs=True
    )
    if env.unwrapped.get_action_meanings()[1:2] == ["FIRE"]:
        env = FireToLaunch(env)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


#: the masked CartPole's id; observations are ``[x, theta]``
CARTPOLE_NO_VELOCITY = "CartPoleNoVelocity-v1"


class KeepObservations(gym.ObservationWrapper):
    """Keeps only the entries ``keep`` (indices, in order) of a 1-D Box observation."""

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


class FireToLaunch(gym.Wrapper):
    """Presses FIRE (action 1) after a reset and after each lost life, within the same step.

    Breakout waits for FIRE at the start of every life; without this (as SB3's FireResetEnv over
    EpisodicLifeEnv does) a near-greedy policy that has not learned to fire stands still until
    the time limit, and Ape-X actors with small epsilons sent thousands of useless frames. A step
    that loses a life returns the observation after the FIRE, both rewards and the lower
    ``lives``, so the training loop still sees the life loss (a terminal transition).
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


def require_env_id(env_id: str) -> None:
    """``env_id`` is a registered gymnasium id (``ALE/...`` too with ale-py; without it left to
    `atari_env`, which says which extra to install)."""
    import difflib

    example = "'CartPole-v1'"
    if env_id.startswith("ALE/"):
        try:
            import ale_py
        except ImportError:
            return
        gym.register_envs(ale_py)
        example = "'ALE/Breakout-v5'"
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise rg.ConfigError(
            f"env_id: got {env_id!r}, which gymnasium does not know; {hint}expected a registered "
            f"id such as {example} (see gymnasium.pprint_registry())"
        )


def discrete_actions_env(env_id: str) -> Any:
    """Make ``env_id`` (close it) and raise ConfigError unless its actions are Discrete (DQN,
    Ape-X, R2D2); an unknown id raises gymnasium's own error."""
    env = gym.make(env_id)
    if not isinstance(env.action_space, gym.spaces.Discrete):
        env.close()
        raise rg.ConfigError(
            f"env {env_id}: got action space {env.action_space}, expected Discrete; use the "
            "SAC agent for Box actions"
        )
    return env


def box_actions_env(env_id: str) -> Any:
    """As `discrete_actions_env`, for SAC: bounded Box actions and Box observations. MuJoCo's
    envs (HalfCheetah-v5, ...) need ``replaygpu[mujoco]``."""
    try:
        env = gym.make(env_id)
    except gym.error.DependencyNotInstalled as err:
        raise rg.ConfigError(
            f"env {env_id}: {err}; for MuJoCo's envs: pip install 'replaygpu[mujoco]'"
        ) from None
    space = env.action_space
    if not (isinstance(space, gym.spaces.Box) and space.is_bounded()):
        env.close()
        raise rg.ConfigError(
            f"env {env_id}: got action space {space}, expected a bounded Box; use the DQN "
            "agent for Discrete actions"
        )
    if not isinstance(env.observation_space, gym.spaces.Box):
        env.close()
        raise rg.ConfigError(
            f"env {env_id}: got observation space {env.observation_space}, expected a Box (the SAC "
            "networks take flat vectors); flatten a Dict or Tuple space with "
            "gymnasium.wrappers.FlattenObservation, or use the DQN agent, which takes them"
        )
    return env


def atari_env(env_id: str) -> gym.Env:
    """Make the preprocessed ALE game ``env_id`` (`make_atari_env`, same errors); close it."""
    return make_atari_env(env_id, seed=0)
