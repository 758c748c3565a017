"""What the learner checks of a user's ``update_fn`` when it first traces it, and how it explains
a failure there.

``update_fn`` runs inside a ``tf.function`` (many SGD steps per graph call), which surprises
code written for eager Keras: a tensor has no value yet, variables must be made once, and a
``[B]`` field against a ``[B, 1]`` model output broadcasts to ``[B, B]`` without an error. These
checks turn the commonest such mistakes into a message that says what to do.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from replaygpu.errors import BroadcastWarning, ConfigError
from replaygpu.keys import PRIORITIES

#: the library's folder: warnings point at the first frame outside it (the user's call)
_LIBRARY = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

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
        f"{GRAPH}: use TensorFlow or keras.ops on tensors, not .numpy(), float(), numpy "
        "functions or model.get_weights() (use model.trainable_variables); return tensors and "
        "read their values from train()'s dict",
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
        if name == PRIORITIES or getattr(value, "shape", None) == ():
            continue
        if not isinstance(value, tf.Tensor | tf.Variable):
            raise ConfigError(
                f"update_fn output '{name}': got a {type(value).__name__} ({value!r:.60}), "
                "expected a scalar tensor (a Python value is a constant of the trace, the "
                "same at every step); return the tensor it was computed from"
            )
        raise ConfigError(
            f"update_fn output '{name}': got a tensor of shape {value.shape}, expected a scalar "
            f"metric (only '{PRIORITIES}' may be [B]); reduce it with tf.reduce_mean"
        )
    return sorted(k for k in out if k != PRIORITIES)


def warn_outer_broadcasts(graph: tf.Graph, batch_size: int, strict: bool = False) -> list[str]:
    """Warn (`BroadcastWarning`) of each element-wise op in ``graph`` that takes a ``[B]`` and a
    ``[B, 1]`` tensor (B the batch size), giving ``[B, B]``: a reward or done field against a
    Keras model's ``[B, 1]`` output. Returns the names of those ops (gradient ops left out).

    Raises:
        ConfigError: with ``strict``, instead of the warning.
    """
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
        message = (
            f"update_fn: {', '.join(found)} broadcast a [B] tensor against a [B, 1] one into "
            f"[B, B] (B = {batch_size}): a batch field such as reward is [B] while a Keras "
            "model's output is [B, 1]; squeeze the output (tf.squeeze(q, -1)) or reshape the "
            "field (reward[:, None])"
        )
        if strict:
            raise ConfigError(message + " (Learner strict=True)")
        warnings.warn(message, BroadcastWarning, stacklevel=_caller_level())
    return found


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside the library, for `warnings.warn` called
    by the function that calls this."""
    level, frame = 1, inspect.currentframe().f_back  # the caller of warnings.warn
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY):
        level, frame = level + 1, frame.f_back
    return level


def unbuilt_optimizers(update_fn: Callable[..., Any]) -> list[str]:
    """Keras optimizers reachable from ``update_fn`` (its closure, the globals it names, a bound
    method's object and their attributes, a few levels deep) that are not built, by where they
    were found (``"update_fn.opt"``). Built in a trace that fails, an optimizer keeps broken
    variables, so the learner refuses them before it traces anything."""
    optimizer_type = tf.keras.optimizers.Optimizer
    found: list[str] = []
    seen: set[int] = set()

    def visit(obj: Any, where: str, depth: int) -> None:
        if id(obj) in seen or depth > 4 or isinstance(obj, _LEAVES):
            return
        seen.add(id(obj))
        if isinstance(obj, optimizer_type):
            if not obj.built:
                found.append(f"{where} ({type(obj).__name__})")
            return
        if isinstance(obj, types.MethodType):
            visit(obj.__self__, f"{where}.__self__", depth + 1)
            visit(obj.__func__, where, depth)
        elif isinstance(obj, types.FunctionType):
            for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or (), strict=True):
                with contextlib.suppress(ValueError):  # a cell not filled yet
                    visit(cell.cell_contents, f"{where}.{name}", depth + 1)
            for name in _global_names(obj.__code__):
                if name in obj.__globals__:
                    visit(obj.__globals__[name], name, depth + 1)
        elif isinstance(obj, Mapping):
            for key, value in list(obj.items())[:64]:
                visit(value, f"{where}[{key!r}]", depth + 1)
        elif isinstance(obj, list | tuple):
            for i, value in enumerate(obj[:64]):
                visit(value, f"{where}[{i}]", depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type | types.ModuleType):
            for name, value in list(vars(obj).items())[:64]:
                visit(value, f"{where}.{name}", depth + 1)

    visit(update_fn, "update_fn", 0)
    return found


#: values never searched for optimizers: numbers, strings, arrays, tensors and variables
_LEAVES = (str, bytes, int, float, complex, bool, type(None), tf.Tensor, tf.Variable)


def _global_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the functions defined in it load."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names
