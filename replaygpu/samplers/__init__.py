"""Samplers: pure graph functions that draw minibatches from a `ReplayTable`."""

from replaygpu.samplers.base import Sampler
from replaygpu.samplers.uniform import UniformSampler

__all__ = ["Sampler", "UniformSampler"]
