"""Shared test setup: quiet TensorFlow logs, and two logical CPU devices for sharded tables.

The CPU is split into two logical devices before TensorFlow initialises its runtime (which it
does at the first op, after which the split is refused), so the `tf.distribute` tests can
build a `MirroredStrategy` over ``/CPU:0`` and ``/CPU:1``. Everything else keeps running on
``/CPU:0`` as before.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import tensorflow as tf

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)
