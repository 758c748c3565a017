"""The agents' one registry: every algorithm's config, module and builder resolve, a config
names its algorithm, ``replaygpu learner --agent`` picks by env, and run.json stores the name."""

import dataclasses
import importlib
import json
import os

import pytest

import replaygpu as rg
from replaygpu.agents.registry import (
    ALGORITHMS,
    DEMOS,
    RUN_FILE,
    algorithm,
    builder_for,
    name_of,
    read_run_file,
    served,
)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_resolves_and_its_config_names_it(name):
    entry = ALGORITHMS[name]
    config = entry.config_class()()
    assert name_of(config) == name
    module = importlib.import_module(entry.module)
    assert callable(module.make_agent), name  # what `replaygpu eval` rebuilds
    assert hasattr(module, "greedy_policy") or hasattr(module, "evaluate_agent"), name
    if entry.builder:
        assert type(builder_for(config)).__name__ == entry.builder.rpartition(".")[2]
    else:
        with pytest.raises(rg.ConfigError, match="does not serve"):
            builder_for(config)


def test_every_demo_runs_an_algorithm_whose_config_takes_its_preset():
    for name, demo in DEMOS.items():
        config_cls = algorithm(demo.algorithm).config_class()
        config_cls(**demo.preset)  # the preset's fields exist and pass the checks
        module = algorithm(demo.algorithm).load()
        assert callable(module.train) and callable(config_cls.ENV_CHECK), name


def test_the_learner_picks_frames_for_an_ale_game_and_refuses_an_unknown_agent():
    assert served("dqn", "CartPole-v1") == "apex"
    assert served("dqn", "ALE/Breakout-v5") == "apex-atari"
    assert served("sac", "Pendulum-v1") == "served-sac"
    assert served("r2d2", None) == "served-r2d2"
    with pytest.raises(rg.ConfigError, match=r"agent: got 'ppo', expected one of \['dqn'"):
        served("ppo", "CartPole-v1")
    with pytest.raises(rg.ConfigError, match=r"algorithm: got .replaygpu\.agents\.dqn."):
        algorithm("replaygpu.agents.dqn.agent")  # what run.json held before it stored names


def test_a_run_file_stores_the_algorithm_name_and_reads_back(tmp_path):
    import tensorflow as tf

    from replaygpu.agents.dqn.config import DQNConfig
    from replaygpu.agents.runs import RunControl

    folder = tmp_path / "run" / "checkpoints"
    config = DQNConfig(steps=1000)
    run = RunControl(str(folder), 3600.0, config)
    run.attach(counter=tf.Variable(1, dtype=tf.int64))
    run.save()
    saved = json.loads((folder / RUN_FILE).read_text())
    assert saved == {
        "algorithm": "dqn",
        "config": json.loads(json.dumps(dataclasses.asdict(config))),
    }
    assert read_run_file(str(tmp_path / "run")) == ("dqn", saved["config"], str(folder))
    with pytest.raises(rg.ConfigError, match=r"no run\.json in it"):
        read_run_file(os.fspath(tmp_path))
