"""NumpyModel: a Keras model's forward pass in numpy equals Keras's to 1e-5 for every layer kind
it reads, refuses what it cannot run in one line when made, takes a newly published version
(and not the one it holds), and calls no TensorFlow."""

from __future__ import annotations

import pickle
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents.networks import mlp, nature_cnn
from replaygpu.agents.policies import NATURE_CNN, mlp_plan
from replaygpu.learner.weights import WeightStore
from replaygpu.numpy_layers import ACTIVATIONS, Cast
from replaygpu.numpy_model import NumpyModel, read_plan


def randomized(model: keras.Model, seed: int = 0, scale: float = 0.5) -> keras.Model:
    """``model`` with every weight drawn at random (biases too, so every term counts);
    variances positive."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        values = rng.normal(0.0, scale, v.shape)
        v.assign((np.abs(values) + 0.1 if "variance" in v.path else values).astype(np.float32))
    return model


def assert_matches_keras(model: keras.Model, x: np.ndarray) -> np.ndarray:
    got = NumpyModel.from_keras(model)(x)
    expected = np.asarray(model(x, training=False))
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    return got


def sequential(input_shape, *layers, dtype="float32") -> keras.Model:
    return randomized(keras.Sequential([keras.Input(input_shape, dtype=dtype), *layers]))


def inputs(shape, seed=1) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 1.5, shape).astype(np.float32)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_dense_equals_keras_for_every_activation(activation):
    model = sequential((6,), keras.layers.Dense(5, activation=activation))
    assert_matches_keras(model, inputs((4, 6)))


@pytest.mark.parametrize(
    "layer",
    [
        keras.layers.Activation("softmax"),
        keras.layers.Activation("sigmoid"),
        keras.layers.ReLU(),
        keras.layers.Softmax(),
        keras.layers.Dropout(0.5),
        keras.layers.Rescaling(1 / 255.0, offset=-0.5),
        keras.layers.Dense(4, use_bias=False),
        keras.layers.LayerNormalization(),
        keras.layers.LayerNormalization(epsilon=1e-5, center=False, scale=False),
        keras.layers.BatchNormalization(),
    ],
    ids=lambda layer: f"{type(layer).__name__}-{layer.name}",
)
def test_each_vector_layer_equals_keras(layer):
    model = sequential((6,), keras.layers.Dense(6), layer)
    assert_matches_keras(model, inputs((4, 6)))


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("strides", [1, 2, (2, 3)])
def test_conv2d_equals_keras_for_valid_and_same_padding_and_strides(padding, strides):
    model = sequential(
        (13, 16, 3),
        keras.layers.Conv2D(4, 3, strides=strides, padding=padding, activation="relu"),
        keras.layers.Conv2D(2, (2, 4), padding=padding, use_bias=False),
        keras.layers.Flatten(),
    )
    assert_matches_keras(model, inputs((2, 13, 16, 3)))


def test_image_layers_normalize_reshape_and_permute_as_keras_does():
    model = sequential(
        (6, 5, 4),
        keras.layers.LayerNormalization(axis=[1, 2]),
        keras.layers.Permute((3, 1, 2)),
        keras.layers.Reshape((4, 30)),
        keras.layers.BatchNormalization(axis=1),
    )
    assert_matches_keras(model, inputs((3, 6, 5, 4)))


@pytest.mark.parametrize("return_sequences", [False, True])
def test_lstm_equals_keras_on_sequences_with_its_gate_order(return_sequences):
    model = sequential(
        (7, 5),
        keras.layers.LSTM(16, return_sequences=return_sequences),
        keras.layers.Dense(3),
    )
    got = assert_matches_keras(model, inputs((4, 7, 5)))
    assert got.shape == ((4, 7, 3) if return_sequences else (4, 3))


def test_an_lstm_with_other_activations_equals_keras():
    lstm = keras.layers.LSTM(8, activation="relu", recurrent_activation="tanh")
    assert_matches_keras(sequential((5, 3), lstm), inputs((2, 5, 3), seed=4))


def test_keras_ops_on_a_tensor_and_a_number_equal_keras():
    x = keras.Input((4, 3), dtype="uint8")
    y = keras.ops.cast(x, "float32") / 255.0
    y = 1.0 - keras.ops.transpose(y, [0, 2, 1])
    y = keras.layers.Flatten()(2.0 * y + 0.5)
    model = randomized(keras.Model(x, keras.layers.Dense(3)(y)))
    frames = np.random.default_rng(0).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    assert_matches_keras(model, frames)


def test_a_nested_sequential_runs_inline_with_its_weights_in_keras_order():
    head = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="tanh")])
    x = keras.Input((4,))
    model = randomized(keras.Model(x, keras.layers.Dense(2)(head(keras.layers.Dense(8)(x)))))
    assert_matches_keras(model, inputs((3, 4)))


def test_the_ddpg_actor_of_the_recipes_equals_keras():
    obs = keras.Input((3,))
    h = keras.layers.Dense(256, activation="relu")(obs)
    h = keras.layers.Dense(256, activation="relu")(h)
    actor = keras.Model(obs, 2.0 * keras.layers.Dense(1, activation="tanh")(h))
    action = assert_matches_keras(randomized(actor, scale=0.1), inputs((8, 3)))
    assert np.all(np.abs(action) <= 2.0)


def test_the_nature_cnn_equals_keras_on_uint8_frame_stacks():
    net = randomized(nature_cnn((4, 84, 84), 6, seed=3), scale=0.05)
    frames = np.random.default_rng(0).integers(0, 256, (3, 4, 84, 84), dtype=np.uint8)
    assert_matches_keras(net, frames)


def test_the_agents_mirrors_are_the_plans_read_from_their_keras_networks():
    cnn_plan = read_plan(nature_cnn((4, 84, 84), 6, seed=0))
    assert cnn_plan.layers[0] == Cast("uint8") and cnn_plan.layers[1:] == NATURE_CNN.layers
    assert read_plan(mlp([4, 64, 64, 2], seed=0)).layers[1:] == mlp_plan(3).layers


#: a model of a layer it cannot run -> what the refusal names
REFUSED = {
    "Embedding": (((3,), keras.layers.Embedding(10, 4, name="emb")), "'emb' (Embedding) is not"),
    "activation": (((3,), keras.layers.Dense(4, activation="mish")), "has activation 'mish'"),
    "dilation": (((8, 8, 3), keras.layers.Conv2D(2, 3, dilation_rate=2)), "dilation_rate=(2, 2)"),
    "return_state": (((5, 3), keras.layers.LSTM(4, return_state=True)), "return_state=True"),
    "go_backwards": (((5, 3), keras.layers.LSTM(4, go_backwards=True)), "go_backwards=True"),
    "capped_relu": (((3,), keras.layers.ReLU(max_value=6.0)), "has max_value=6.0"),
}


@pytest.mark.parametrize("model, named", REFUSED.values(), ids=REFUSED)
def test_a_layer_it_cannot_run_is_refused_in_one_line_naming_it(model, named):
    shape, layer = model
    with pytest.raises(rg.ConfigError) as refused:
        NumpyModel.from_keras(keras.Sequential([keras.Input(shape), layer]))
    message = str(refused.value)
    assert "\n" not in message and named in message and f"({type(layer).__name__})" in message
    assert "supported: " in message or "it runs " in message
    assert message.endswith("change the layer, or act with the Keras model itself")


def test_a_model_that_is_not_a_chain_is_refused_in_one_line():
    x = keras.Input((4,))
    h = keras.layers.Dense(4)(x)
    model = keras.Model(x, keras.layers.Add(name="skip")([h, x]))
    with pytest.raises(rg.ConfigError, match=r"'skip' \(Add\) .*chain of layers") as refused:
        NumpyModel.from_keras(model)
    assert "\n" not in str(refused.value)

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(rg.ConfigError, match=r"expected a keras\.Sequential or a functional"):
        NumpyModel.from_keras(Subclassed())


def test_weights_of_another_model_are_refused_and_the_held_ones_kept():
    model = sequential((3,), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2))
    policy = NumpyModel.from_keras(model)
    x = inputs((2, 3))
    before = policy(x)
    other = mlp([3, 5, 2], seed=0).get_weights()
    with pytest.raises(rg.ConfigError, match=r"expected the model's 4: \(3, 4\), \(4,\)"):
        policy.set_weights(other, version=9)
    np.testing.assert_array_equal(policy(x), before)
    assert policy.version == 0


def test_refresh_takes_a_newly_published_version_and_not_the_one_it_holds():
    table = rg.ReplayTable({"obs": tf.TensorSpec([3], tf.float32)}, capacity=8, device="/CPU:0")
    learner = rg.Learner(table, rg.Sampler(table, seed=0), lambda b: {}, batch_size=2)
    model = sequential((3,), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2))
    policy, x = NumpyModel.from_keras(model), inputs((2, 3))
    assert policy.version == 0 and not policy.refresh(learner)  # nothing published yet

    randomized(model, seed=5)
    assert learner.publish_weights(model) == 1
    assert policy.refresh(learner) and policy.version == 1
    np.testing.assert_allclose(policy(x), np.asarray(model(x)), atol=1e-5)
    held = policy.weights
    assert not policy.refresh(learner) and policy.weights is held  # the same version: kept
    assert not policy.refresh(learner.weight_store)

    randomized(model, seed=6)
    learner.publish_weights(model)
    with rg.serve(learner, "127.0.0.1:0") as server, rg.ReplayClient(server.address) as client:
        assert policy.refresh(client) and policy.version == 2  # as an actor pulls
        np.testing.assert_allclose(policy(x), np.asarray(model(x)), atol=1e-5)
        assert not policy.refresh(client)


def test_refresh_refuses_a_source_that_publishes_nothing():
    policy = NumpyModel.from_keras(sequential((3,), keras.layers.Dense(2)))
    store = WeightStore()
    assert not policy.refresh(store)
    with pytest.raises(rg.ConfigError, match="expected a Learner, a WeightStore or a Replay"):
        policy.refresh(object())


def test_calling_it_imports_no_tensorflow(tmp_path):
    net = randomized(nature_cnn((4, 84, 84), 6, seed=1), scale=0.05)
    frames = np.random.default_rng(2).integers(0, 256, (2, 4, 84, 84), dtype=np.uint8)
    (tmp_path / "policy.pkl").write_bytes(pickle.dumps(NumpyModel.from_keras(net)))
    np.save(tmp_path / "frames.npy", frames)
    code = (
        "import pickle, sys\n"
        "import numpy as np\n"
        f"policy = pickle.loads(open({str(tmp_path / 'policy.pkl')!r}, 'rb').read())\n"
        f"q = policy(np.load({str(tmp_path / 'frames.npy')!r}))\n"
        f"np.save({str(tmp_path / 'q.npy')!r}, q)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras'))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    np.testing.assert_allclose(np.load(tmp_path / "q.npy"), np.asarray(net(frames)), atol=1e-5)
