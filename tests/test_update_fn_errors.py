"""What a Keras user meets inside ``update_fn``: errors that say what to do, a warning for the
``[B]`` against ``[B, 1]`` broadcast, and ``{}`` as a valid return."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.errors import BroadcastWarning
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


def test_a_keras_optimizer_left_unbuilt_is_refused_before_any_trace_with_the_fix():
    """Built inside a trace that fails, a Keras optimizer keeps broken variables, so correct
    code fails after it (``Read variable failure``); the learner finds it first, through
    closures and a bound method's object, and says how to build it."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(1e-3)

    def update(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(batch["obs"])[:, 0] - batch["reward"]))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return {"loss": loss}

    class Agent:
        def __init__(self):
            self.nets = {"q": model, "opt": optimizer}

        def update(self, batch):
            return update(batch)

    pattern = r"not built: update_fn\.update\.optimizer \(Adam\); build each before"
    with pytest.raises(rg.ConfigError, match=pattern):
        learner_with(lambda batch: update(batch))
    with pytest.raises(rg.ConfigError, match=r"update_fn\.__self__\.nets\['opt'\] \(Adam\)"):
        learner_with(Agent().update)
    assert not optimizer.built  # refused before anything traced or built it
    optimizer.build(model.trainable_variables)
    assert learner_with(Agent().update).train(2)["steps"] == 2.0


def test_a_first_call_failing_after_an_earlier_one_failed_says_broken_builds_are_kept():
    def failing(batch):
        return {"loss": batch["missing"]}

    with pytest.raises(KeyError):
        learner_with(failing).train(1)
    with pytest.raises(KeyError) as err:
        learner_with(failing).train(1)
    assert update_checks.BROKEN_BUILD in notes(err.value)


def test_model_get_weights_inside_update_fn_gets_the_graph_note():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    def update(batch):
        weights = model.get_weights()
        return {"m": tf.reduce_mean(batch["reward"]) * float(weights[1][0])}

    with pytest.raises(NotImplementedError) as err:
        learner_with(update).train(1)
    assert "runs inside a tf.function graph" in notes(err.value)
    assert "model.get_weights() (use model.trainable_variables)" in notes(err.value)


def test_a_python_number_returned_as_a_metric_is_named_by_its_type():
    with pytest.raises(rg.ConfigError, match=r"output 'lr': got a float \(0\.002\), expected"):
        learner_with(lambda batch: {"loss": tf.reduce_mean(batch["reward"]), "lr": 0.002}).train(1)


def test_a_reward_against_a_keras_output_broadcast_to_b_by_b_is_warned_or_refused():
    """A `BroadcastWarning` at the user's own ``train`` call, which a warnings filter or
    ``strict=True`` makes fatal."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    def wrong(batch):  # [B] + [B, 1] -> [B, B]: trains on a wrong target without an error
        return {"target": tf.reduce_mean(batch["reward"] + 0.99 * model(batch["obs"]))}

    def right(batch):
        q = tf.squeeze(model(batch["obs"]), -1)
        return {"target": tf.reduce_mean(batch["reward"] + 0.99 * q)}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        learner_with(right).train(1)
        assert not [w for w in caught if issubclass(w.category, BroadcastWarning)]
        learner_with(wrong).train(1)
    [warned] = [w for w in caught if issubclass(w.category, BroadcastWarning)]
    assert "broadcast a [B] tensor against a [B, 1] one into [B, B] (B = 8)" in str(warned.message)
    assert "tf.squeeze" in str(warned.message)
    assert warned.filename == __file__  # points at the caller's line, not the library's
    with warnings.catch_warnings():
        warnings.simplefilter("error", BroadcastWarning)
        with pytest.raises(BroadcastWarning):
            learner_with(wrong).train(1)
    strict = learner_with(wrong, strict=True)
    with pytest.raises(rg.ConfigError, match=r"into \[B, B\].*strict=True"):
        strict.train(1)
    assert strict.steps.numpy() == 0  # refused before any step ran
