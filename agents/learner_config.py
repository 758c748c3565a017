"""Which config ``replaygpu learner --agent AGENT --env ENV_ID`` runs, without TensorFlow, so
its flags are built and checked before TensorFlow is imported."""

from __future__ import annotations

import gymnasium as gym

from replaygpu.agents.apex_atari_config import ApexAtariConfig
from replaygpu.agents.apex_config import ApexConfig
from replaygpu.agents.r2d2_learner_config import R2D2LearnerConfig
from replaygpu.agents.sac_config import SACLearnerConfig


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` is an ALE game (its frames go into a frame table)."""
    try:
        entry_point = str(gym.spec(env_id).entry_point)
    except gym.error.Error:
        return env_id.startswith("ALE/")
    return "ale_py" in entry_point


def config_class(agent: str, env_id: str | None) -> type:
    """The config of ``replaygpu learner --agent AGENT --env ENV_ID``: SAC's, R2D2's, or DQN's on
    vector observations, or on Atari frames for an ALE game."""
    if agent == "sac":
        return SACLearnerConfig
    if agent == "r2d2":
        return R2D2LearnerConfig
    return ApexAtariConfig if env_id and is_atari(env_id) else ApexConfig
