"""Rate limiters: how many SGD steps the learner may take now, computed inside the graph.

They never block and never busy-wait: the learner asks for k steps and runs
``min(k, allowed_steps)``. Callers that get fewer steps than asked simply insert more data
(or do other work) and call again. The rule itself is `SampleToInsertRule`, shared with the
actors' insert side.
"""

from __future__ import annotations

import tensorflow as tf

from replaygpu.learner.ratio import SampleToInsertRule


class SampleToInsertRatio(tf.Module):
    """Keeps the number of sampled transitions near ``samples_per_insert`` x inserted ones.

    Counting samples in transitions (a step of batch size B samples B transitions), sampling is
    allowed while the table holds at least ``min_size_to_sample`` rows and::

        sampled + B <= samples_per_insert * (inserted - min_size_to_sample) + error_buffer

    so that ``allowed_steps = floor(rule.sample_room(inserted, sampled) / B)``
    (`SampleToInsertRule`). This is Reverb's SampleToInsertRatio seen from the sampling side;
    actors apply the same rule on the insert side (`ReplayClient.wait_for_insert_room`).

    Args:
        samples_per_insert: the target replay ratio (e.g. 8: each transition is sampled 8 times
            on average).
        min_size_to_sample: no step runs before the table holds this many rows.
        error_buffer: slack in transitions; it must allow at least one minibatch.

    Raises:
        ConfigError: for out-of-range values.
    """

    def __init__(
        self, samples_per_insert: float, min_size_to_sample: int, error_buffer: float
    ) -> None:
        super().__init__(name="sample_to_insert_ratio")
        self.rule = SampleToInsertRule(samples_per_insert, min_size_to_sample, error_buffer)
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = int(min_size_to_sample)
        self.error_buffer = float(error_buffer)
        self.sampled = tf.Variable(0, dtype=tf.int64, trainable=False, name="sampled")

    def allowed_steps(self, inserted: tf.Tensor, size: tf.Tensor, batch_size: int) -> tf.Tensor:
        """Steps of ``batch_size`` allowed now, as an int64 scalar >= 0 (a graph function)."""
        room = self.rule.sample_room(
            tf.cast(inserted, tf.float64), tf.cast(self.sampled, tf.float64)
        )
        steps = tf.maximum(tf.cast(tf.math.floor(room / batch_size), tf.int64), 0)
        return tf.where(size >= self.min_size_to_sample, steps, tf.zeros_like(steps))

    def record(self, num_samples: tf.Tensor) -> None:
        """Count ``num_samples`` transitions as sampled."""
        self.sampled.assign_add(num_samples)
