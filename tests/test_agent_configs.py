"""Agent configs reject out-of-range values with the field, the value and the expected range."""

import pytest

import replaygpu as rg
from replaygpu.agents.distributed.actor_config import ActorConfig
from replaygpu.agents.dqn.agent import DQNConfig
from replaygpu.agents.dqn.config import ApexConfig
from replaygpu.agents.sac.agent import SACConfig


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
    from replaygpu.agents.sac.config import SACLearnerConfig

    assert ApexConfig(steps=0).learning_rate_schedule == ApexConfig().learning_rate
    assert SACLearnerConfig(steps=0).steps == 0
    for config_cls in (ApexConfig, SACLearnerConfig):
        with pytest.raises(rg.ConfigError, match="steps: got -1"):
            config_cls(steps=-1)
    with pytest.raises(rg.ConfigError, match="batch_size: got 0"):
        SACLearnerConfig(steps=0, batch_size=0)  # the other fields are still checked


@pytest.mark.parametrize("config_cls", [DQNConfig, ApexConfig])
def test_learning_rate_floor_must_be_positive_and_at_most_the_start(config_cls):
    for final in (0.0, 1.0):
        with pytest.raises(rg.ConfigError, match=f"final_learning_rate: got {final}, expected"):
            config_cls(final_learning_rate=final)


def test_dqn_learning_rate_decays_over_the_run_sgd_steps_and_follows_a_longer_run():
    from replaygpu.agents.configs import training_calls

    assert DQNConfig().learning_rate_schedule == DQNConfig().learning_rate  # rl-zoo3: constant
    sizes = dict(learning_starts=1000, train_freq=256, gradient_steps=128)
    config = DQNConfig(steps=3000, final_learning_rate=2.3e-5, **sizes)
    # chunks end at 256, ..., 2816 and a last one of 184 steps at 3000 (92 SGD steps); those
    # ending past 1000 train
    assert training_calls(config) == [128] * 8 + [92]
    schedule = config.learning_rate_schedule
    assert schedule.steps == config.total_sgd_steps == 8 * 128 + 92
    assert (schedule.start, schedule.end) == (config.learning_rate, config.final_learning_rate)
    longer = DQNConfig(steps=6000, final_learning_rate=2.3e-5, **sizes)
    assert longer.learning_rate_schedule.steps == sum(training_calls(longer)) > schedule.steps
