"""What the learner checks of a user's ``update_fn`` when it first traces it, and how it explains
a failure there.

``update_fn`` runs inside a ``tf.function`` (many SGD steps per graph call), which surprises
code written for eager Keras: a tensor has no value yet, variables must be made once, and a
``[B]`` field against a ``[B, 1]`` model output broadcasts to ``[B, B]`` without an error. These
checks turn the commonest such mistakes into a message that says what to do.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from replaygpu.errors import ConfigError
from replaygpu.keys import PRIORITIES

logger = logging.getLogger(__name__)

#: prefix of every note this module adds to an exception from TensorFlow or the user's code
NOTE = "replaygpu: "
GRAPH = (
    "update_fn runs inside a tf.function graph (Learner.train fuses many SGD steps into one "
    "call), where tensors have no value yet"
)
#: (a text of the error, what to do), matched in order against a failed trace's message
HINTS = (
    (
        "predict",
        f"{GRAPH}: call the model (model(x, training=False)), not model.predict, which runs "
        "its own eager loop",
    ),
    (
        "numpy",
        f"{GRAPH}: use TensorFlow or keras.ops on tensors, not .numpy(), float() or numpy "
        "functions; return tensors and read their values from train()'s dict",
    ),
    (
        "singleton tf.Variable",
        "update_fn creates variables each time it is traced (a tf.Variable, layer, model or "
        "optimizer made inside it); make them once outside update_fn, and build models and "
        "optimizers before the Learner (model.build(...), optimizer.build(variables))",
    ),
    (
        "branch outputs of cond",
        f"{GRAPH}, so a Python `if` on a tensor becomes tf.cond and every branch must give the "
        "same values: return the metrics dict once, after the if, not from one branch",
    ),
)
#: noted on a failure of the first train call after an update_fn trace failed in this process
BROKEN_BUILD = (
    "an earlier update_fn trace failed in this process; a Keras optimizer or model first built "
    "inside a failed trace keeps broken variables: make new ones, or build them before making "
    "the Learner (optimizer.build(model.trainable_variables)) so that no trace builds them"
)
#: element-wise ops whose broadcasting of [B] against [B, 1] is reported
ELEMENTWISE = frozenset(
    ("AddV2", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "SquaredDifference", "Pow")
)


#: whether a learner's first train call (its traces) failed in this process
_failed_before = False


def explain_first_call_error(err: BaseException) -> None:
    """Add notes saying what to do to ``err``, raised by a learner's first train call (where
    ``update_fn`` is traced): the first of `HINTS` whose text the message holds, and
    `BROKEN_BUILD` after an earlier failure. The exception keeps its type and message."""
    global _failed_before
    text = str(err)
    hint = next((hint for needle, hint in HINTS if needle in text), None)
    if hint is not None:
        err.add_note(NOTE + hint)
    if _failed_before:
        err.add_note(NOTE + BROKEN_BUILD)
    _failed_before = _failed_before or not isinstance(err, ConfigError)


def check_outputs(out: Any, keeps_priorities: bool, sampler_name: str) -> list[str]:
    """Check what ``update_fn`` returned when traced; the sorted metric names.

    Raises:
        ConfigError: not a dict (``None`` included), priorities without a prioritized
            sampler, or a metric that is not a scalar.
    """
    if not isinstance(out, Mapping):
        raise ConfigError(
            f"update_fn must return a dict of scalar tensors, e.g. {{'loss': loss}}, or {{}} "
            f"for no metrics; got {type(out).__name__}"
        )
    if PRIORITIES in out and not keeps_priorities:
        raise ConfigError(
            f"update_fn returned '{PRIORITIES}' but {sampler_name} keeps no "
            "priorities; sample with rg.Prioritized() or drop the key"
        )
    for name, value in out.items():
        if name != PRIORITIES and getattr(value, "shape", None) != ():
            raise ConfigError(
                f"update_fn output '{name}': got shape {getattr(value, 'shape', value)}, "
                f"expected a scalar metric (only '{PRIORITIES}' may be [B]); reduce it "
                "with tf.reduce_mean"
            )
    return sorted(k for k in out if k != PRIORITIES)


def warn_outer_broadcasts(graph: tf.Graph, batch_size: int) -> list[str]:
    """Log a warning for each element-wise op in ``graph`` that takes a ``[B]`` and a ``[B, 1]``
    tensor (B the batch size), giving ``[B, B]``: a reward or done field against a Keras model's
    ``[B, 1]`` output, the commonest way to train on a wrong target without an error. Returns
    the names of those ops (gradient ops left out)."""
    found: list[str] = []
    if batch_size == 1:  # [1] against [1, 1] gives [1, 1]: the same values
        return found
    for op in graph.get_operations():
        if op.type not in ELEMENTWISE or len(op.inputs) != 2 or "gradient" in op.name:
            continue
        shapes = sorted(tuple(t.shape.as_list()) if t.shape.rank else () for t in op.inputs)
        if shapes == [(batch_size,), (batch_size, 1)]:
            found.append(op.name)
    if found:
        logger.warning(
            "update_fn: %s broadcast a [B] tensor against a [B, 1] one into [B, B] (B = %d): a "
            "batch field such as reward is [B] while a Keras model's output is [B, 1]; squeeze "
            "the output (tf.squeeze(q, -1)) or reshape the field (reward[:, None])",
            ", ".join(found),
            batch_size,
        )
    return found
