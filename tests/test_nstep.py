"""The NStep view: discounted sums stop at episode ends; terminated does not bootstrap,
truncated does; windows never read past the newest row."""

import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.samplers.prioritized import PrioritizedIndex

SPEC = {
    "obs": tf.TensorSpec([1], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "reward": tf.TensorSpec([], tf.float32),
    "next_obs": tf.TensorSpec([1], tf.float32),
    "terminated": tf.TensorSpec([], tf.bool),
    "truncated": tf.TensorSpec([], tf.bool),
}


def rows_from_episodes(episodes):
    """Episodes as (rewards, end) with end in {"term", "trunc", None}; obs = global step."""
    rewards, term, trunc = [], [], []
    for ep_rewards, end in episodes:
        rewards += list(ep_rewards)
        term += [False] * (len(ep_rewards) - 1) + [end == "term"]
        trunc += [False] * (len(ep_rewards) - 1) + [end == "trunc"]
    n = len(rewards)
    t = np.arange(n, dtype=np.float32)
    return {
        "obs": t[:, None],
        "action": np.arange(n, dtype=np.int64),
        "reward": np.array(rewards, np.float32),
        "next_obs": (t + 100.0)[:, None],  # next_obs of row r is 100 + r: tells which row
        "terminated": np.array(term),
        "truncated": np.array(trunc),
    }


def all_rows(sampler: rg.Sampler, rows: list[int]) -> dict[str, np.ndarray]:
    idx = tf.constant(rows, tf.int64)
    out = sampler.view.accumulate(sampler.table.shards[0], idx, sampler.table.gather(idx))
    return {k: v.numpy() for k, v in out.items()}


def test_hand_computed_targets_with_termination_and_truncation():
    # Episode A: rewards 1, 2, 3, terminated.  Episode B: 1, 1, truncated.  Episode C: 5, 7
    # still running (the last row is the newest in the table).
    table = rg.ReplayTable(SPEC, capacity=16, device="CPU")
    table.append(rows_from_episodes([([1, 2, 3], "term"), ([1, 1], "trunc"), ([5, 7], None)]))
    sampler = rg.Sampler(table, rg.Uniform(), rg.NStep(3, gamma=0.5), seed=0)
    out = all_rows(sampler, list(range(7)))
    np.testing.assert_allclose(out["reward"], [2.75, 3.5, 3.0, 1.5, 1.0, 8.5, 7.0])
    np.testing.assert_allclose(out["discount"], [0.0, 0.0, 0.0, 0.25, 0.5, 0.25, 0.5])
    np.testing.assert_array_equal(out["nstep"], [3, 2, 1, 2, 1, 2, 1])
    np.testing.assert_allclose(out["next_obs"][:, 0], [102, 102, 102, 104, 104, 106, 106])
    np.testing.assert_array_equal(out["terminated"], [1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(out["truncated"], [0, 0, 0, 1, 1, 0, 0])
    np.testing.assert_allclose(out["obs"][:, 0], np.arange(7))  # obs/action of the drawn row
    np.testing.assert_array_equal(out["action"], np.arange(7))


def reference(data, i, n, gamma, newest, capacity):
    ret, k = 0.0, 0
    for j in range(n):
        r = (i + j) % capacity
        ret += gamma**j * float(data["reward"][r])
        k = j
        if data["terminated"][r]:
            return ret, 0.0, r, j + 1
        if data["truncated"][r] or r == newest or j == n - 1:
            break
    return ret, gamma ** (k + 1), (i + k) % capacity, k + 1


def test_random_episodes_match_reference_across_the_ring_wrap():
    rng = np.random.default_rng(7)
    episodes = []
    for _ in range(12):
        length = int(rng.integers(1, 7))
        end = rng.choice(["term", "trunc"])
        episodes.append((rng.normal(size=length).round(2), end))
    episodes.append((rng.normal(size=3).round(2), None))
    data = rows_from_episodes(episodes)
    total = len(data["reward"])
    capacity = total - 9  # the first 9 rows are overwritten: the ring wraps
    table = rg.ReplayTable(SPEC, capacity=capacity, device="CPU")
    table.append(data)
    stored = {k: v.numpy() for k, v in table.storage.items()}
    newest = (total - 1) % capacity
    gamma = 0.9
    for n in (1, 2, 4):
        sampler = rg.Sampler(table, rg.Uniform(), rg.NStep(n, gamma=gamma))
        out = all_rows(sampler, list(range(capacity)))
        for i in range(capacity):
            ret, disc, last, steps = reference(stored, i, n, gamma, newest, capacity)
            assert out["reward"][i] == pytest.approx(ret, rel=1e-5, abs=1e-6), (n, i)
            assert out["discount"][i] == pytest.approx(disc, rel=1e-6), (n, i)
            assert out["nstep"][i] == steps, (n, i)
            assert out["next_obs"][i, 0] == stored["next_obs"][last, 0], (n, i)


def test_stream_field_stops_at_rows_of_another_actor():
    spec = dict(SPEC, actor=tf.TensorSpec([], tf.int64))
    table = rg.ReplayTable(spec, capacity=16, device="CPU")
    data = rows_from_episodes([([1, 1, 1, 1, 1, 1], None)])
    data["actor"] = np.array([0, 0, 1, 0, 1, 1], np.int64)  # interleaved appends
    table.append(data)
    sampler = rg.Sampler(table, rg.Uniform(), rg.NStep(3, gamma=0.5, stream_field="actor"))
    out = all_rows(sampler, [0, 1, 2, 4])
    np.testing.assert_array_equal(out["nstep"], [2, 1, 1, 2])
    np.testing.assert_allclose(out["reward"], [1.5, 1.0, 1.0, 1.5])
    np.testing.assert_allclose(out["next_obs"][:, 0], [101, 101, 102, 105])


def test_prioritized_nstep_runs_in_the_xla_learner_loop():
    table = rg.ReplayTable(SPEC, capacity=64, device="CPU")
    table.append(rows_from_episodes([([1.0] * 10, "term")] * 5))
    base = rg.Sampler(table, rg.Prioritized(alpha=0.6, beta=0.4), seed=1)
    sampler = base.with_view(rg.NStep(3, gamma=0.9))

    def update(batch):
        target = batch["reward"] + batch["discount"] * 10.0
        return {
            "target": tf.reduce_mean(target),
            "weight": tf.reduce_mean(batch["importance_weights"]),
            "priorities": target,
        }

    learner = rg.Learner(table, sampler, update, batch_size=16, jit_compile=True)
    out = learner.train(50)
    assert out["steps"] == 50 and np.isfinite(out["target"])
    assert 0.0 < out["weight"] <= 1.0
    assert int(base.index.sample_count.numpy()) == 50


def test_rejects_tables_without_the_fields_and_bad_parameters():
    table = rg.ReplayTable({"obs": tf.TensorSpec([1], tf.float32)}, 4, "CPU")
    with pytest.raises(rg.ConfigError, match="lacks field"):
        rg.Sampler(table, rg.Uniform(), rg.NStep())
    table = rg.ReplayTable(SPEC, 4, "CPU")
    with pytest.raises(rg.ConfigError, match="n: got 0"):
        rg.Sampler(table, rg.Uniform(), rg.NStep(0))
    with pytest.raises(rg.ConfigError, match=r"gamma: got 1\.5"):
        rg.Sampler(table, rg.Uniform(), rg.NStep(gamma=1.5))
    with pytest.raises(rg.ConfigError, match="keeps no priorities"):
        rg.Sampler(table, rg.Uniform(), rg.NStep()).update_priorities(
            tf.constant([0], tf.int64), tf.constant([1.0])
        )


class CountingIndex(PrioritizedIndex):
    """A real `PrioritizedIndex` that counts how many times its ``sync`` runs in a graph."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.sync_runs = tf.Variable(0, dtype=tf.int64, trainable=False, name="sync_runs")

    def sync(self, view) -> None:
        self.sync_runs.assign_add(1)
        super().sync(view)


class CountingPrioritized(rg.Prioritized):
    """`rg.Prioritized` whose indexes count their syncs (a distribution of one's own)."""

    def build(self, table, seed, num_shards):
        return CountingIndex(table, self, seed, num_shards)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_wrapped_prioritized_sampler_syncs_once_per_train_call_not_per_step(jit_compile):
    table = rg.ReplayTable(SPEC, capacity=256, device="CPU")
    table.append(rows_from_episodes([([1.0, -2.0, 0.5, 3.0, -1.0], "term")] * 8))
    distribution = CountingPrioritized(alpha=0.6, beta=0.4)
    sampler = rg.Sampler(table, distribution, rg.NStep(3, gamma=0.9), seed=1)
    base = sampler.index
    assert sampler.keeps_priorities

    def update(batch):
        return {"reward": tf.reduce_mean(batch["reward"]), "priorities": tf.abs(batch["reward"])}

    learner = rg.Learner(table, sampler, update, batch_size=16, jit_compile=jit_compile)
    for call in range(1, 4):
        before = int(base.sync_runs.numpy())
        out = learner.train(50)
        assert out["steps"] == 50 and np.isfinite(out["reward"])
        assert int(base.sync_runs.numpy()) - before == 1, f"train call {call}"
        # The one sync per call gave every row appended before it a priority.
        assert int(base.synced.numpy()) == int(table.inserted_var.numpy())
        table.append(rows_from_episodes([([2.0, 1.0], "trunc")]))
    assert int(base.sample_count.numpy()) == 150


def test_priorities_without_a_prioritized_sampler_raise_config_error():
    table = rg.ReplayTable(SPEC, capacity=16, device="CPU")
    table.append(rows_from_episodes([([1.0, 2.0, 3.0], "term")]))
    uniform = rg.Sampler(table, seed=0)
    nstep = uniform.with_view(rg.NStep(2))
    assert not uniform.keeps_priorities and not nstep.keeps_priorities
    message = r"Sampler\(Uniform x NStep\) keeps no priorities"
    with pytest.raises(rg.ConfigError, match=message):
        nstep.update_priorities(tf.constant([0], tf.int64), tf.constant([1.0]))

    def update(batch):
        return {"reward": tf.reduce_mean(batch["reward"]), "priorities": tf.abs(batch["reward"])}

    for sampler in (uniform, nstep):
        learner = rg.Learner(table, sampler, update, batch_size=4)
        with pytest.raises(rg.ConfigError, match="priorities"):
            learner.train(5)
