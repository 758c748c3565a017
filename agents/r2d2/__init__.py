"""R2D2: `config` (``R2D2Config``, ``R2D2LearnerConfig``; no TensorFlow) and `agent` (the LSTM
agent on stored-state sequences, ``demo r2d2-cartpole``, and its served builder)."""
