"""Rate limiters: how many SGD steps the learner may take now, computed inside the graph.

Never blocking: the learner runs ``min(k, allowed_steps)`` of k steps asked; callers given fewer
insert more and call again. The rule is `SampleToInsertRule`, shared with the insert side.
"""

from __future__ import annotations

import tensorflow as tf

from replaygpu.learner.ratio import SampleToInsertRule


class SampleToInsertRatio(tf.Module):
    """Keeps the number of sampled transitions near ``samples_per_insert`` x inserted ones.

    Reverb's SampleToInsertRatio from the sampling side: ``allowed_steps =
    floor(rule.sample_room(inserted, sampled) / B)``, with samples counted in transitions;
    actors apply the same rule when inserting (`ReplayClient.wait_for_insert_room`).
    `ConfigError` for out-of-range values.

    Args:
        samples_per_insert: sampled transitions per inserted one, as `SampleToInsertRule`'s.
        min_size_to_sample: rows the table holds before the first sample, as the rule's.
        error_buffer: slack in transitions; it must allow at least one minibatch.
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
