"""Target-network updates, in the graph: Polyak averaging and the hard copy, XLA-safe."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from replaygpu.errors import ConfigError


def variables_of(network: Any) -> list[tf.Variable]:
    """The variables of a Keras model or layer (``weights``: trainable and not, such as batch
    norm statistics), a `tf.Module` (``variables``), or a list of variables, in order."""
    if isinstance(network, (list, tuple)):
        return list(network)
    for name in ("weights", "variables"):
        found = getattr(network, name, None)
        if found is not None:
            return list(found)
    raise ConfigError(
        f"network: got {type(network).__name__}, expected a Keras model, a tf.Module or a list "
        "of variables"
    )


def update_target(target: Any, source: Any, tau: float | tf.Tensor = 1.0) -> None:
    """``target <- tau * source + (1 - tau) * target``, variable by variable; ``tau`` 1 (the
    default) copies (DQN's periodic sync), a small ``tau`` such as 0.005 averages (DDPG, TD3,
    SAC). Call it inside ``update_fn`` or any ``tf.function``, XLA included, or eagerly.

    Args:
        target: the network that moves towards ``source``; of the same architecture (see
            `variables_of`), e.g. two Keras models made by one function; build both before the
            first call.
        source: the network whose variables are read.
        tau: the source's share, in ``(0, 1]``.

    Raises:
        ConfigError: the two hold different numbers of variables, or shapes differ; ``tau``
            (a Python number) is outside ``(0, 1]``.
    """
    targets, sources = variables_of(target), variables_of(source)
    if len(targets) != len(sources) or not targets:
        raise ConfigError(
            f"update_target: the target has {len(targets)} variables and the source "
            f"{len(sources)}; expected the same architecture, both built (call each once)"
        )
    for t, s in zip(targets, sources, strict=True):
        if t.shape != s.shape:
            raise ConfigError(
                f"update_target: variable {t.name} has shape {t.shape}, its source {s.name} "
                f"{s.shape}; expected networks of one architecture, variables in one order"
            )
    number = isinstance(tau, (int, float))
    if number and not 0.0 < tau <= 1.0:
        raise ConfigError(f"tau: got {tau}, expected 0 < tau <= 1 (1: a copy)")
    copy = number and tau == 1.0
    for t, s in zip(targets, sources, strict=True):
        if copy or not tf.as_dtype(t.dtype).is_floating:  # counters and seeds are copied
            t.assign(s)
        else:
            t.assign(tau * s + (1.0 - tau) * t)
