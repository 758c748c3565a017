"""Agents built on replaygpu's public API, one package per algorithm on shared parts.

- `registry`: every algorithm by name (config, training module, served builder) and the demos.
- Algorithms, each a config without TensorFlow (``config.py``) beside an agent that reads top to
  bottom: `dqn` (``agent.py`` on vectors, ``atari.py`` on Atari frames, each with its served
  Ape-X form), `sac`, `r2d2`.
- `distributed`: the learner service that serves any algorithm to actor processes, the actors
  (no TensorFlow), their fleet and Ray, and the ``learner`` and ``actor`` commands.
- Shared parts: `envs`, `rollouts`, `networks`, `policies` (numpy acting), `runs` (checkpoints,
  resumes, stop signals), `progress` (recorders), `configs` and `config_fields`, `demos`.

The agents' subcommands join ``replaygpu`` through entry points (`replaygpu.cli.COMMAND_GROUP`).
"""
