"""Agent configs reject out-of-range values with the field, the value and the expected range."""

import pytest

import replaygpu as rg
from replaygpu.agents.actor_config import ActorConfig
from replaygpu.agents.apex import ApexConfig
from replaygpu.agents.dqn import DQNConfig
from replaygpu.agents.sac import SACConfig


@pytest.mark.parametrize(
    ("config", "kwargs", "message"),
    [
        (DQNConfig, {"steps": 0}, "steps: got 0, expected >= 1"),
        (DQNConfig, {"gamma": 1.5}, r"gamma: got 1.5, expected in \[0, 1\]"),
        (DQNConfig, {"learning_starts": -1}, "learning_starts: got -1, expected >= 0"),
        (DQNConfig, {"hidden_sizes": ()}, r"hidden_sizes: got \(\), expected positive widths"),
        (DQNConfig, {"train_freq": 5, "num_envs": 2}, "multiple of num_envs"),
        (SACConfig, {"tau": -0.1}, r"tau: got -0.1, expected in \[0, 1\]"),
        (SACConfig, {"initial_alpha": 0.0}, "initial_alpha: got 0.0, expected > 0"),
        (ApexConfig, {"samples_per_insert": 0}, "samples_per_insert: got 0, expected > 0"),
        (ActorConfig, {"epsilon_base": 2.0}, r"epsilon_base: got 2.0, expected in \[0, 1\]"),
        (ActorConfig, {"send_interval": 0}, "send_interval: got 0, expected >= 1"),
    ],
)
def test_config_rejects_out_of_range_value_naming_it(config, kwargs, message):
    with pytest.raises(rg.ConfigError, match=message):
        config(**kwargs)


def test_default_configs_are_valid():
    for config in (DQNConfig, SACConfig, ApexConfig, ActorConfig):
        config()


def test_a_learner_without_an_end_takes_steps_0_and_a_constant_learning_rate():
    from replaygpu.agents.learner import SACLearnerConfig

    assert ApexConfig(steps=0).learning_rate_schedule == ApexConfig().learning_rate
    assert SACLearnerConfig(steps=0).steps == 0
    for config_cls in (ApexConfig, SACLearnerConfig):
        with pytest.raises(rg.ConfigError, match="steps: got -1"):
            config_cls(steps=-1)
    with pytest.raises(rg.ConfigError, match="batch_size: got 0"):
        SACLearnerConfig(steps=0, batch_size=0)  # the other fields are still checked
