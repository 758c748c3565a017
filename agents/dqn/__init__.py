"""DQN: `config` (``DQNConfig``, ``AtariDQNConfig``, and the Ape-X learners' ``ApexConfig`` and
``ApexAtariConfig``; no TensorFlow), `agent` (DQN on vector observations, ``demo cartpole``, and
its served Ape-X builder) and `atari` (the Nature DQN on a frame table, ``demo breakout``, and
its served builder)."""
