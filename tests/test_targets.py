"""update_target: Polyak averaging and the hard copy of target networks, in the graph and
under XLA, for Keras models, tf.Modules and variable lists."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.targets import update_target


def mlp(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    return model


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_polyak_average_of_keras_models_inside_a_compiled_function(jit_compile):
    online, target = mlp(0), mlp(1)
    before = [w.numpy() for w in target.weights]
    tf.function(lambda: update_target(target, online, 0.25), jit_compile=jit_compile)()
    for got, old, new in zip(target.weights, before, online.weights, strict=True):
        np.testing.assert_allclose(got.numpy(), 0.25 * new.numpy() + 0.75 * old, rtol=1e-6)


def test_tau_one_copies_and_lists_of_variables_work():
    online, target = mlp(0), mlp(1)
    update_target(target.trainable_variables, online.trainable_variables)
    for got, want in zip(target.weights, online.weights, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_mismatched_networks_and_bad_tau_are_refused_and_change_nothing():
    online, target = mlp(0), mlp(1)
    before = [w.numpy() for w in target.weights]
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5), keras.layers.Dense(1)])
    with pytest.raises(rg.ConfigError, match="expected networks of one architecture"):
        update_target(target, other)
    with pytest.raises(rg.ConfigError, match="the target has 4 variables and the source 2"):
        update_target(target, online.layers[0])
    with pytest.raises(rg.ConfigError, match=r"tau: got 1\.5"):
        update_target(target, online, 1.5)
    for got, old in zip(target.weights, before, strict=True):
        np.testing.assert_array_equal(got.numpy(), old)
