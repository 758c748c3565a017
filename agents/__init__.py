"""Agents built on replaygpu's public API: DQN (on vectors and on Atari frames), SAC, R2D2 and
distributed Ape-X, their demos, the learner service and the actors.

`registry` is the index: every algorithm by name (its config, the module that trains it, the
builder that serves it) and the demos. Each algorithm module reads top to bottom (``dqn.py``,
``atari.py``, ``sac.py``, ``r2d2.py``) beside its config (``*_config.py``, no TensorFlow);
``learner.py`` and ``builders.py`` serve any of them to actor processes (``actor.py``, no
TensorFlow); shared parts live beside them (``envs.py``, ``networks.py``, ``policies.py``,
``runs.py``, ``progress.py``, ``flags.py``). The agents' subcommands of ``replaygpu`` are added
through entry points (`replaygpu.cli.COMMAND_GROUP`).
"""
