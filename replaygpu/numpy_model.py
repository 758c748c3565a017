"""Acting without TensorFlow: a Keras policy's forward pass in numpy, from its published weights.

An eager Keras call costs a TensorFlow dispatch per layer; acting one env step at a time pays it
every step, and an actor process that imports no TensorFlow cannot pay it at all. A
`NumpyModel` runs the same arithmetic in numpy::

    policy = NumpyModel.from_keras(actor)           # reads actor's layers (Keras, once)
    action = policy(obs[None])[0]                   # was actor(obs[None], training=False)[0]
    policy.set_weights(actor.get_weights())         # embedded: after each training call
    policy.refresh(client)                          # an actor: a newer published version, if any

Why this shape:

- ``from_keras`` reads the model once, when the policy is made, into a `LayerPlan`: the layer
  kinds, activations and settings (strides, padding, epsilon, ...) and which entry of
  ``model.get_weights()`` each layer reads. A layer or setting it cannot run is refused there,
  in one line, so a policy that exists runs. The plan is plain data and the class is made from
  it (``NumpyModel(plan, weights)``), so a process without Keras makes one too: unpickled, or
  written out, as `replaygpu.agents.policies` writes its networks' plans.
- Calling it is calling the model: ``[B, ...] -> [B, ...]`` numpy, batch first, so it replaces
  ``model(x, training=False)`` where it stands; the call path is numpy only (`numpy_layers`).
- Weights come as the learner publishes them: `set_weights` takes ``model.get_weights()`` (or
  what ``ReplayClient.get_weights`` returns) and checks their shapes against the model's;
  `refresh` asks a `Learner`, its `WeightStore` or a `ReplayClient` for a version other than the
  one held, as actors pull (``get_weights(newer_than=version)``): nothing when it is the same
  one, and a restarted learner's lower versions are taken.

Reads ``keras.Sequential`` and functional models that are a chain: one input, each layer fed by
the one before (nested models inlined), one output. Layers: `SUPPORTED_LAYERS`; arithmetic with
a number (``2.0 * x``, ``x / 255.0``), ``keras.ops.cast`` and ``keras.ops.transpose``;
activations: `numpy_layers.ACTIVATIONS`. ``LSTM`` runs a sequence from the zero state, as
``model(x)`` does; a state carried across calls is not covered.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from replaygpu import numpy_layers as nl
from replaygpu.errors import ConfigError
from replaygpu.learner.weights import WeightStore

if TYPE_CHECKING:
    import keras

    from replaygpu.learner.learner import Learner
    from replaygpu.service.actor.client import ReplayClient


class NumpyModel:
    """A forward pass in numpy: ``policy(x [B, ...]) -> [B, ...]``.

    Args:
        plan: what it computes (`read_plan` of a Keras model, or written out).
        weights: the arrays the plan reads, in ``model.get_weights()`` order.
        version: the published version they are (0: none).

    Raises:
        ConfigError: weights that are not the plan's (count or shapes).
    """

    def __init__(self, plan: nl.LayerPlan, weights: nl.Weights, version: int = 0) -> None:
        self.plan = plan
        self.version = 0
        self.weights: tuple[np.ndarray, ...] = ()
        self.set_weights(weights, version)

    @classmethod
    def from_keras(cls, model: keras.Model) -> NumpyModel:
        """The forward pass of a Keras model, with its weights now.

        Raises:
            ConfigError: a layer, activation or setting it cannot run (the message names it),
                or a model that is not a chain of layers; nothing is built.
        """
        return cls(read_plan(model), model.get_weights())

    def __call__(self, x: Any) -> np.ndarray:
        """The model's output for ``x`` ``[B, ...]`` (as ``model(x, training=False)``)."""
        weights = self.weights
        for layer in self.plan.layers:
            x = layer(x, weights)
        return x

    def set_weights(
        self, weights: nl.Weights | Mapping[str, Any], version: int | None = None
    ) -> None:
        """Act with ``weights`` from now on: ``model.get_weights()``, or what a learner published
        (a mapping's values in its order); ``version`` the published version they are (None:
        keep the number held). Arrays are used as given, not copied.

        Raises:
            ConfigError: another count or shape than the model's; nothing changes.
        """
        arrays = tuple(
            np.asarray(w) for w in (weights.values() if isinstance(weights, Mapping) else weights)
        )
        shapes = self.plan.weight_shapes
        if shapes is not None:
            got = tuple(a.shape for a in arrays)
            if got != shapes:
                raise ConfigError(
                    f"NumpyModel.set_weights: got {len(got)} arrays of shapes {_brief(got)}, "
                    f"expected the model's {len(shapes)}: {_brief(shapes)}; pass "
                    "model.get_weights() (or publish the model) of the model it was made from"
                )
        elif len(arrays) < (needed := self.plan.weights_read()):
            raise ConfigError(
                f"NumpyModel.set_weights: got {len(arrays)} arrays, expected {needed} (the plan "
                "reads that many); pass the weights of the network the plan describes"
            )
        self.weights = arrays
        if version is not None:
            self.version = int(version)

    def refresh(self, source: Learner | WeightStore | ReplayClient) -> bool:
        """Take the latest published weights from ``source`` unless they are the version held:
        a `Learner` (``publish_weights``), its `WeightStore`, or a `ReplayClient` (an actor's).
        True when the weights changed.

        Raises:
            ConfigError: another kind of ``source``, or published weights of another model.
        """
        store = getattr(source, "weight_store", source)
        if isinstance(store, WeightStore):
            snapshot = store.latest(newer_than=self.version)
            got = None if snapshot is None else (snapshot.version, snapshot.arrays)
        else:
            from replaygpu.service.actor.client import ReplayClient

            if not isinstance(source, ReplayClient):
                raise ConfigError(
                    f"NumpyModel.refresh: got {type(source).__name__}, expected a Learner, a "
                    "WeightStore or a ReplayClient; for weights in hand call set_weights"
                )
            got = source.get_weights(newer_than=self.version)
        if got is None:
            return False
        self.set_weights(got[1], version=got[0])
        return True


def _brief(shapes: Sequence[tuple[int, ...]]) -> str:
    text = ", ".join(str(tuple(s)) for s in shapes)
    return text if len(text) < 200 else text[:200] + "..."


# -- reading a Keras model ------------------------------------------------------------------------


def read_plan(model: keras.Model) -> nl.LayerPlan:
    """The `LayerPlan` of a Keras ``Sequential`` or functional chain of layers (Keras is used
    here, not when the plan runs).

    Raises:
        ConfigError: what it cannot run, in one line naming the layer; nothing is built.
    """
    import keras

    if not _is_graph(model, keras):
        raise ConfigError(
            f"NumpyModel: got {type(model).__name__}, expected a keras.Sequential or a functional "
            "keras.Model (a subclassed model's call() cannot be read); rebuild it as one"
        )
    if not model.built:
        raise ConfigError(
            f"NumpyModel: model {model.name!r} is not built (it has no inputs); give it a "
            "keras.Input or call model.build(input_shape) first"
        )
    reader = _Reader(keras, model.weights)
    layers = (nl.Cast(str(model.inputs[0].dtype)), *reader.model(model))  # the input
    return nl.LayerPlan(layers, tuple(tuple(v.shape) for v in model.weights))


def _is_graph(model: Any, keras: Any) -> bool:
    """A Sequential or functional model: layers in a graph, not a subclass's ``call``."""
    from keras.src.models.functional import Functional

    return isinstance(model, (keras.Sequential, Functional))


class _Reader:
    """Turns Keras operations into `numpy_layers` steps, weights by index into ``weights``."""

    def __init__(self, keras: Any, weights: Sequence[Any]) -> None:
        self.keras = keras
        self.index = {id(v): i for i, v in enumerate(weights)}
        self.read_ids: set[int] = set()  # of the layer being read
        layers = keras.layers
        self.layers: dict[type, Callable[[Any], tuple[nl.Layer, ...]]] = {
            layers.Dense: self.dense,
            layers.Conv2D: self.conv2d,
            layers.LSTM: self.lstm,
            layers.LayerNormalization: self.layer_norm,
            layers.BatchNormalization: self.batch_norm,
            layers.Activation: lambda layer: (nl.Activation(self.activation(layer)),),
            layers.ReLU: self.relu,
            layers.Softmax: self.softmax,
            layers.Flatten: self.flatten,
            layers.Reshape: lambda layer: (nl.Reshape(tuple(layer.target_shape)),),
            layers.Permute: lambda layer: (nl.Transpose((0, *layer.dims)),),
            layers.Rescaling: self.rescaling,
            layers.Dropout: lambda layer: (nl.Identity(),),
        }

    # -- graphs

    def model(self, model: Any) -> tuple[nl.Layer, ...]:
        if isinstance(model, self.keras.Sequential):
            return tuple(step for layer in model.layers for step in self.operation(layer, None))
        if len(model.inputs) != 1 or len(model.outputs) != 1:
            raise ConfigError(
                f"NumpyModel: model {model.name!r} has {len(model.inputs)} inputs and "
                f"{len(model.outputs)} outputs; it runs a chain of layers from one input to one "
                "output (a policy network); act with the Keras model itself"
            )
        chain, tensor = [], model.outputs[0]
        while True:
            operation, node_index, _ = tensor._keras_history
            node = operation._inbound_nodes[node_index]
            if node.is_input:
                break
            if len(node.input_tensors) != 1:
                raise ConfigError(
                    f"NumpyModel: layer {operation.name!r} ({type(operation).__name__}) takes "
                    f"{len(node.input_tensors)} tensors; it runs a chain of layers, each fed by "
                    "the one before (no branches or skips); act with the Keras model itself"
                )
            chain.append((operation, node))
            tensor = node.input_tensors[0]
        return tuple(step for op, node in reversed(chain) for step in self.operation(op, node))

    def operation(self, op: Any, node: Any) -> tuple[nl.Layer, ...]:
        """The steps of one operation of a graph (``node``: its call there; None in a
        Sequential)."""
        if _is_graph(op, self.keras):
            return self.model(op)
        read = self.layers.get(type(op))
        if read is None:
            is_op = type(op).__module__.startswith("keras.src.ops")
            read_op = _OPS.get(type(op).__name__) if is_op and node is not None else None
            if read_op is None:
                _refuse(op, "is not a layer it runs", f"supported: {SUPPORTED_LAYERS}")
            return read_op(op, node)
        policy = getattr(op, "dtype_policy", None)
        if policy is not None and policy.compute_dtype != policy.variable_dtype:
            problem = f"computes in {policy.compute_dtype} (dtype policy {policy.name})"
            _refuse(op, problem, "it runs layers that compute in their weights' dtype")
        self.read_ids = set()
        steps = read(op)
        unread = [v.path for v in op.weights if id(v) not in self.read_ids]
        if unread:
            problem = f"has weights it does not read ({', '.join(unread)}): LoRA or quantized?"
            _refuse(op, problem, "it runs plain float layers")
        return steps

    # -- weights and settings

    def weight(self, variable: Any) -> int | None:
        if variable is None:
            return None
        self.read_ids.add(id(variable))
        return self.index[id(variable)]

    def activation(self, layer: Any, key: str = "activation") -> str:
        function = getattr(layer, key)
        for name in nl.ACTIVATIONS:
            if self.keras.activations.get(name) is function:
                return name
        shown = getattr(function, "__name__", type(function).__name__)
        _refuse(layer, f"has {key} {shown!r}", f"supported: {', '.join(nl.ACTIVATIONS)}")

    @staticmethod
    def require(layer: Any, **settings: Any) -> dict[str, Any]:
        config = layer.get_config()
        for key, allowed in settings.items():
            value = config.get(key)
            if value not in allowed:
                wanted = " or ".join(repr(a) for a in allowed)
                _refuse(layer, f"has {key}={value!r}", f"it runs {key}={wanted}")
        return config

    # -- layers

    def dense(self, layer: Any) -> tuple[nl.Layer, ...]:
        kernel, bias = self.weight(layer.kernel), self.weight(layer.bias)
        return (nl.Dense(kernel, bias, self.activation(layer)),)

    def conv2d(self, layer: Any) -> tuple[nl.Layer, ...]:
        config = self.require(
            layer,
            data_format=["channels_last"],
            dilation_rate=[(1, 1)],
            groups=[1],
            padding=["valid", "same"],
        )
        kernel, bias = self.weight(layer.kernel), self.weight(layer.bias)
        strides = tuple(int(s) for s in config["strides"])
        return (nl.Conv2D(kernel, bias, strides, config["padding"], self.activation(layer)),)

    def lstm(self, layer: Any) -> tuple[nl.Layer, ...]:
        config = self.require(layer, return_state=[False], go_backwards=[False], stateful=[False])
        cell = layer.cell
        return (
            nl.LSTM(
                self.weight(cell.kernel),
                self.weight(cell.recurrent_kernel),
                self.weight(cell.bias),
                self.activation(layer),
                self.activation(layer, "recurrent_activation"),
                bool(config["return_sequences"]),
            ),
        )

    def layer_norm(self, layer: Any) -> tuple[nl.Layer, ...]:
        config = self.require(layer, rms_scaling=[False])  # deprecated in Keras
        gamma, beta = self.weight(layer.gamma), self.weight(layer.beta)
        axes = tuple(int(a) for a in np.atleast_1d(layer.axis))
        return (nl.LayerNorm(axes, float(config["epsilon"]), gamma, beta),)

    def batch_norm(self, layer: Any) -> tuple[nl.Layer, ...]:
        mean, variance = self.weight(layer.moving_mean), self.weight(layer.moving_variance)
        gamma, beta = self.weight(layer.gamma), self.weight(layer.beta)
        epsilon = float(layer.get_config()["epsilon"])
        return (nl.BatchNorm(int(layer.axis), epsilon, mean, variance, gamma, beta),)

    def relu(self, layer: Any) -> tuple[nl.Layer, ...]:
        self.require(layer, max_value=[None], negative_slope=[0.0], threshold=[0.0])
        return (nl.Activation("relu"),)

    def softmax(self, layer: Any) -> tuple[nl.Layer, ...]:
        self.require(layer, axis=[-1])
        return (nl.Activation("softmax"),)

    def flatten(self, layer: Any) -> tuple[nl.Layer, ...]:
        self.require(layer, data_format=["channels_last", None])
        return (nl.Flatten(),)

    def rescaling(self, layer: Any) -> tuple[nl.Layer, ...]:
        config = layer.get_config()
        if not all(_is_number(config[k]) for k in ("scale", "offset")):
            _refuse(layer, "has a per-channel scale or offset", "it runs scalar ones")
        return (nl.Rescale(float(config["scale"]), float(config["offset"]), layer.compute_dtype),)


def _arithmetic(operator: str) -> Callable[[Any, Any], tuple[nl.Layer, ...]]:
    def read(op: Any, node: Any) -> tuple[nl.Layer, ...]:
        args = node.arguments.args
        constants = [a for a in args if a is not node.input_tensors[0]]
        if len(args) != 2 or len(constants) != 1 or not _is_number(constants[0]):
            problem = "is arithmetic with something other than one number"
            _refuse(op, problem, "it runs x op number (2.0 * x, x / 255.0)")
        dtype = str(node.output_tensors[0].dtype)
        return (nl.Arithmetic(operator, constants[0], args[0] is constants[0], dtype),)

    return read


def _transpose(op: Any, node: Any) -> tuple[nl.Layer, ...]:
    axes = op.axes
    if axes is None:
        axes = range(len(node.input_tensors[0].shape) - 1, -1, -1)
    return (nl.Transpose(tuple(int(a) for a in axes)),)


#: keras.ops applied to a Keras tensor in a functional model -> its reader
_OPS: dict[str, Callable[[Any, Any], tuple[nl.Layer, ...]]] = {
    "Add": _arithmetic("add"),
    "Subtract": _arithmetic("subtract"),
    "Multiply": _arithmetic("multiply"),
    "TrueDivide": _arithmetic("divide"),
    "Divide": _arithmetic("divide"),
    "Cast": lambda op, node: (nl.Cast(str(op.dtype)),),
    "Transpose": _transpose,
}

#: the Keras layers `read_plan` reads, for the messages and the docs
SUPPORTED_LAYERS = (
    "Dense, Conv2D, LSTM, LayerNormalization, BatchNormalization, Activation, ReLU, Softmax, "
    "Flatten, Reshape, Permute, Rescaling, Dropout, nested Sequential/functional models, and "
    "keras.ops "
    f"{', '.join(_OPS)} with a number"
)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _refuse(layer: Any, problem: str, expected: str) -> NoReturn:
    raise ConfigError(
        f"NumpyModel: layer {layer.name!r} ({type(layer).__name__}) {problem}; {expected}; "
        "change the layer, or act with the Keras model itself"
    )
