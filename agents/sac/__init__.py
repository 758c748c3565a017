"""SAC: `config` (``SACConfig``, ``SACLearnerConfig``; no TensorFlow) and `agent` (the agent,
``demo pendulum``, and its served builder)."""
