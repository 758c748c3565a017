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
    for final, why in ((0.0, "never trains at rate 0"), (1.0, "decays, it does not grow")):
        with pytest.raises(rg.ConfigError, match=f"final_learning_rate: got {final}, expected"):
            config_cls(final_learning_rate=final)
        with pytest.raises(rg.ConfigError, match=why):
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


def _config_classes() -> list[type]:
    from replaygpu.agents.dqn import config as dqn
    from replaygpu.agents.r2d2 import config as r2d2
    from replaygpu.agents.sac import config as sac

    return [
        *[dqn.DQNConfig, dqn.AtariDQNConfig, dqn.ApexConfig, dqn.ApexAtariConfig],
        *[sac.SACConfig, sac.SACLearnerConfig, r2d2.R2D2Config, r2d2.R2D2LearnerConfig],
    ]


def test_no_config_declares_again_a_group_field_with_the_groups_help():
    """A row of a config that a group already declares with the same help is a copy:
    the config should name the group through `defaults` (issue 34, shared fields once)."""
    import dataclasses
    from inspect import get_annotations

    from replaygpu.agents import config_fields

    groups = [
        g
        for g in vars(config_fields).values()
        if isinstance(g, type) and issubclass(g, config_fields.Group)
    ]
    declared = {}
    for group in groups:
        for f in dataclasses.fields(group):
            if f.name in get_annotations(group):
                declared.setdefault((f.name, f.metadata.get("help")), group.__name__)
    copies = [
        f"{config.__name__}.{f.name} (as in {declared[(f.name, f.metadata['help'])]})"
        for config in _config_classes()
        for f in dataclasses.fields(config)
        if f.name in get_annotations(config) and (f.name, f.metadata.get("help")) in declared
    ]
    assert not copies, f"rows that repeat a group's field: {copies}"


def test_defaults_changes_a_groups_defaults_and_keeps_help_type_and_order():
    import dataclasses

    from replaygpu.agents.config_fields import Replay, defaults

    changed = defaults(Replay, batch_size=64)
    before, after = dataclasses.fields(Replay), dataclasses.fields(changed)
    assert [f.name for f in after] == [f.name for f in before]
    assert [(f.type, f.metadata) for f in after] == [(f.type, f.metadata) for f in before]
    assert changed().batch_size == 64 and Replay().batch_size == 32
    with pytest.raises(TypeError, match=r"Replay has no fields \['batch'\]"):
        defaults(Replay, batch=64)


def test_apex_atari_update_takes_every_shared_field_but_the_target_sync_interval():
    """`ApexAtariConfig.dqn_config` carries each field the two configs share, but
    target_update_interval (SGD steps there, env steps in `AtariDQNConfig`, which only the
    single-process loop reads), with at least one evaluation game."""
    import dataclasses

    from replaygpu.agents.dqn.config import ApexAtariConfig, AtariDQNConfig

    apex = ApexAtariConfig(
        env_id="ALE/Pong-v5",
        seed=7,
        steps=30_000,
        learning_rate=3e-4,
        batch_size=16,
        buffer_size=40_000,
        learning_starts=3000,
        gamma=0.98,
        n_step=2,
        prioritized=False,
        priority_alpha=0.5,
        priority_beta=0.3,
        frame_stack=3,
        max_grad_norm=5.0,
        double_q=False,
        repeat_action_probability=0.0,
        terminal_on_life_loss=False,
        clip_rewards=False,
        eval_episodes=0,
        eval_epsilon=0.01,
        jit_compile="off",
        device="/cpu:0",
        target_update_interval=99,
    )
    dqn = apex.dqn_config
    shared = {f.name for f in dataclasses.fields(AtariDQNConfig)} & {
        f.name for f in dataclasses.fields(ApexAtariConfig)
    }
    assert shared - {"target_update_interval", "eval_episodes"} == {
        "env_id", "seed", "steps", "learning_rate", "batch_size", "buffer_size",
        "learning_starts", "gamma", "n_step", "prioritized", "priority_alpha", "priority_beta",
        "frame_stack", "max_grad_norm", "double_q", "repeat_action_probability",
        "terminal_on_life_loss", "clip_rewards", "eval_epsilon", "jit_compile", "device",
    }  # fmt: skip
    for name in shared - {"target_update_interval", "eval_episodes"}:
        assert getattr(dqn, name) == getattr(apex, name), name
    assert dqn.eval_episodes == 1
    assert dqn.target_update_interval == AtariDQNConfig().target_update_interval
