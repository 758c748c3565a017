"""Choosing the one device that holds a table and runs its learner."""

from __future__ import annotations

import tensorflow as tf

from replaygpu.errors import ConfigError


def resolve_device(device: str | None = None) -> str:
    """The canonical name ("/job:localhost/replica:0/task:0/device:GPU:0") of ``device``
    ("/GPU:0", "GPU", ...; None: the first GPU, else the CPU); `ConfigError` if it does not exist
    on this machine."""
    if device is None:
        device = "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"
    names = [d.name for d in tf.config.list_logical_devices()]
    spec = tf.DeviceSpec.from_string(device if device.startswith("/") else f"/{device}:0")
    for name in names:
        have = tf.DeviceSpec.from_string(name)
        if have.device_type == spec.device_type and have.device_index == (spec.device_index or 0):
            return name
    raise ConfigError(
        f"device: got {device!r}, expected one of {names}; pass device=None to pick the first "
        "GPU, else the CPU"
    )
