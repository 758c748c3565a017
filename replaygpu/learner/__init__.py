"""The learner: the fused multi-step training loop and its rate limiter."""

from replaygpu.learner.learner import Learner
from replaygpu.learner.rate_limiter import SampleToInsertRatio

__all__ = ["Learner", "SampleToInsertRatio"]
