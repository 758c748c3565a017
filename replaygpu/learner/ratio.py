"""The samples-per-insert rule, written once for both sides of the wire (no TensorFlow).

Plain arithmetic, so the same expressions run on Python numbers in an actor
(`ReplayClient.wait_for_insert_room`) and on float64 tensors in the learner's graph.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TypeVar

from replaygpu.errors import ConfigError

#: A Python float or a float64 tensor: the rule only uses + - * /.
Number = TypeVar("Number")


@dataclass(frozen=True)
class SampleToInsertRule:
    """Keeps ``diff = samples_per_insert * inserted - sampled`` inside a band.

    The band is ``spi * min_size_to_sample +- error_buffer`` (samples counted in transitions):
    sampling may take ``diff`` to its floor, inserting push it to its ceiling (as Reverb's).

    Attributes:
        samples_per_insert: the target replay ratio (8: each row is sampled 8 times on average).
        min_size_to_sample: no step runs before the table holds this many rows.
        error_buffer: the band's half width, in transitions.
    """

    samples_per_insert: float
    min_size_to_sample: int
    error_buffer: float

    def __post_init__(self) -> None:
        spi = self.samples_per_insert
        if not (isinstance(spi, numbers.Real) and math.isfinite(spi) and spi > 0):
            raise ConfigError(f"samples_per_insert: got {spi!r}, expected a finite number > 0")
        if not isinstance(self.min_size_to_sample, numbers.Integral) or self.min_size_to_sample < 1:
            raise ConfigError(
                f"min_size_to_sample: got {self.min_size_to_sample!r}, expected an integer >= 1 "
                "(a table needs a row before it can be sampled)"
            )
        if not (math.isfinite(self.error_buffer) and self.error_buffer >= 0):
            raise ConfigError(f"error_buffer: got {self.error_buffer!r}, expected >= 0")

    def sample_room(self, inserted: Number, sampled: Number) -> Number:
        """``spi * (inserted - min_size_to_sample) + error_buffer - sampled``: transitions that
        may be sampled now (negative: none)."""
        spi = self.samples_per_insert
        return spi * inserted - sampled - (spi * self.min_size_to_sample - self.error_buffer)

    def insert_room(self, inserted: Number, sampled: Number) -> Number:
        """``min_size_to_sample + (error_buffer + sampled) / spi - inserted``: rows that may be
        inserted before sampling must catch up (negative: none)."""
        spi = self.samples_per_insert
        ceiling = spi * self.min_size_to_sample + self.error_buffer
        return (ceiling - (spi * inserted - sampled)) / spi
