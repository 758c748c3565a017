"""What a Keras user meets inside ``update_fn``: errors that say what to do, a warning for the
``[B]`` against ``[B, 1]`` broadcast, and ``{}`` as a valid return."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.learner import update_checks

SPEC = {"obs": tf.TensorSpec([3], tf.float32), "reward": tf.TensorSpec([], tf.float32)}


def learner_with(update_fn, **kwargs):
    table = rg.ReplayTable(SPEC, 64, device="/CPU:0")
    rows = np.arange(16, dtype=np.float32)
    table.append({"obs": np.stack([rows, -rows, rows], 1), "reward": rows})
    return rg.Learner(table, rg.Sampler(table, seed=0), update_fn, batch_size=8, **kwargs)


def notes(err):
    return " | ".join(getattr(err, "__notes__", []))


def test_an_empty_dict_is_a_valid_return_and_none_says_so():
    assert learner_with(lambda batch: {}).train(3) == {"steps": 3.0}
    with pytest.raises(rg.ConfigError, match=r"or \{\} for no metrics; got NoneType"):
        learner_with(lambda batch: None).train(1)


def test_eager_only_calls_get_a_note_that_update_fn_runs_in_a_graph():
    with pytest.raises(AttributeError, match="numpy") as err:
        learner_with(lambda batch: {"m": tf.constant(batch["reward"].numpy().mean())}).train(1)
    assert "runs inside a tf.function graph" in notes(err.value)
    assert "not .numpy()" in notes(err.value)


def test_variables_made_on_every_trace_get_a_note_to_make_them_once():
    def update(batch):  # a new variable per call: the probe trace and the loop trace each make one
        scale = tf.Variable(2.0)
        return {"m": scale * tf.reduce_mean(batch["reward"])}

    with pytest.raises(ValueError) as err:
        learner_with(update).train(1)
    assert "creates variables each time it is traced" in notes(err.value)


def test_a_keras_optimizer_built_in_a_failed_trace_is_named_when_later_code_fails():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(1e-3)

    def update(batch, fail):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(batch["obs"])[:, 0] - batch["reward"]))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return {"loss": batch["missing"] if fail else loss}

    with pytest.raises(KeyError):  # after apply_gradients built the optimizer in this trace
        learner_with(lambda batch: update(batch, fail=True)).train(1)
    with pytest.raises(tf.errors.OpError) as err:  # correct code, the optimizer left broken
        learner_with(lambda batch: update(batch, fail=False)).train(1)
    assert update_checks.BROKEN_BUILD in notes(err.value)
    # the remedy the note gives: an optimizer built before the learner traces anything
    fresh = keras.optimizers.Adam(1e-3)
    fresh.build(model.trainable_variables)
    optimizer = fresh
    assert learner_with(lambda batch: update(batch, fail=False)).train(2)["steps"] == 2.0


def test_a_reward_against_a_keras_output_broadcast_to_b_by_b_is_warned(caplog):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    def wrong(batch):  # [B] + [B, 1] -> [B, B]: trains on a wrong target without an error
        return {"target": tf.reduce_mean(batch["reward"] + 0.99 * model(batch["obs"]))}

    def right(batch):
        q = tf.squeeze(model(batch["obs"]), -1)
        return {"target": tf.reduce_mean(batch["reward"] + 0.99 * q)}

    with caplog.at_level(logging.WARNING, logger="replaygpu.learner.update_checks"):
        learner_with(right).train(1)
        assert not caplog.records
        learner_with(wrong).train(1)
    [record] = caplog.records
    assert "broadcast a [B] tensor against a [B, 1] one into [B, B] (B = 8)" in record.message
    assert "tf.squeeze" in record.message
