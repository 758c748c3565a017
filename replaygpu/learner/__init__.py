"""The learner: the fused multi-step loop (`learner`), its rate limiter (`rate_limiter`, with
the TF-free rule in `ratio`) and the published weights (`weights`).

Re-exports nothing: import from the modules, or use ``replaygpu.Learner`` and friends, so that
the TF-free modules (`ratio`, `weights`) can be imported by actors without TensorFlow.
"""
