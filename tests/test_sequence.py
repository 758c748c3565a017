"""The Sequence view: windows stay inside one episode and inside the written rows."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import replaygpu as rg

SPEC = {
    "step": tf.TensorSpec([], tf.int64),
    "episode": tf.TensorSpec([], tf.int64),
    "reward": tf.TensorSpec([], tf.float32),
    "terminated": tf.TensorSpec([], tf.bool),
    "truncated": tf.TensorSpec([], tf.bool),
}


def episodes_data(lengths, rng, last_open=True):
    step, episode, term, trunc = [], [], [], []
    for e, length in enumerate(lengths):
        step += list(range(length))
        episode += [e] * length
        end_term = bool(rng.integers(2))
        open_end = last_open and e == len(lengths) - 1
        term += [False] * (length - 1) + [end_term and not open_end]
        trunc += [False] * (length - 1) + [(not end_term) and not open_end]
    n = len(step)
    return {
        "step": np.array(step, np.int64),
        "episode": np.array(episode, np.int64),
        "reward": np.arange(1, n + 1, dtype=np.float32),
        "terminated": np.array(term),
        "truncated": np.array(trunc),
    }


def valid_starts(stored, capacity, newest, length):
    """Brute force: starts whose T rows are one episode, consecutive and not past the newest."""
    out = []
    for s in range(capacity):
        ahead = (newest - s) % capacity
        rows = [(s + t) % capacity for t in range(length)]
        if ahead >= length - 1 and len({int(stored["episode"][r]) for r in rows}) == 1:
            out.append(s)
    return out


def test_sampled_windows_never_cross_a_boundary_and_cover_valid_starts_uniformly():
    rng = np.random.default_rng(3)
    data = episodes_data(rng.integers(1, 12, size=30), rng)
    total = len(data["step"])
    capacity = total - 13  # the ring wraps
    table = rg.ReplayTable(SPEC, capacity=capacity, device="CPU")
    table.append(data)
    length = 4
    sampler = rg.Sampler(table, rg.Uniform(), rg.Sequence(length), seed=1)
    starts_seen = []
    for _ in range(30):
        starts, batch = sampler.sample(256)
        ep = batch["episode"].numpy()
        steps = batch["step"].numpy()
        assert np.all(ep == ep[:, :1]), "a window crossed an episode boundary"
        assert np.all(np.diff(steps, axis=1) == 1), "rows of a window are not consecutive steps"
        done = batch["terminated"].numpy() | batch["truncated"].numpy()
        assert not done[:, :-1].any(), "an episode end inside a window"
        assert np.all(batch["mask"].numpy() == 1.0)
        starts_seen.append(starts.numpy())
    assert int(sampler.invalid_draws.numpy()) == 0
    stored = {k: v.numpy() for k, v in table.storage.items()}
    valid = valid_starts(stored, capacity, (total - 1) % capacity, length)
    counts = np.bincount(np.concatenate(starts_seen), minlength=capacity)
    assert set(np.flatnonzero(counts)) <= set(valid)
    _, p = stats.chisquare(counts[valid])
    assert p > 1e-3, f"valid windows not drawn uniformly: p={p:.2e}"


def test_padded_windows_mask_and_zero_the_steps_after_the_episode():
    rng = np.random.default_rng(5)
    data = episodes_data([3, 5, 2, 6], rng)
    table = rg.ReplayTable(SPEC, capacity=32, device="CPU")
    table.append(data)
    sampler = rg.Sampler(table, rg.Uniform(), rg.Sequence(4, pad=True), seed=2)
    starts, batch = sampler.sample(512)
    starts, mask = starts.numpy(), batch["mask"].numpy()
    n = len(data["step"])
    for b, s in enumerate(starts):
        want = [float(s + t < n and data["episode"][s + t] == data["episode"][s]) for t in range(4)]
        want = np.minimum.accumulate(want)
        np.testing.assert_array_equal(mask[b], want)
        keep = want.astype(bool)
        np.testing.assert_array_equal(
            batch["reward"].numpy()[b][keep], data["reward"][s : s + 4][: keep.sum()]
        )
        assert np.all(batch["reward"].numpy()[b][~keep] == 0.0)
    assert set(starts) == set(range(n)), "pad=True draws start rows over all rows"


def test_explicit_start_field_splits_episodes_without_done_flags():
    spec = dict(SPEC, episode_start=tf.TensorSpec([], tf.bool))
    data = episodes_data([6, 6], np.random.default_rng(0))
    data["terminated"][:] = False  # e.g. an actor restarted mid-episode: no terminal flag
    data["truncated"][:] = False
    data["episode_start"] = data["step"] == 0
    table = rg.ReplayTable(spec, capacity=16, device="CPU")
    table.append(data)
    sampler = rg.Sampler(table, rg.Uniform(), rg.Sequence(3, start_field="episode_start"), seed=4)
    _, batch = sampler.sample(256)
    ep = batch["episode"].numpy()
    assert np.all(ep == ep[:, :1])
    derived = rg.Sampler(table, rg.Uniform(), rg.Sequence(3), seed=4)  # no done flags: would cross
    _, batch = derived.sample(256)
    ep = batch["episode"].numpy()
    assert not np.all(ep == ep[:, :1])


def test_episodes_shorter_than_the_window_are_padded_and_counted():
    data = episodes_data([2, 2, 2], np.random.default_rng(1), last_open=False)
    table = rg.ReplayTable(SPEC, capacity=8, device="CPU")
    table.append(data)
    sampler = rg.Sampler(table, rg.Uniform(), rg.Sequence(4), seed=0, spare_draws=3)
    _, batch = sampler.sample(8)
    assert int(sampler.invalid_draws.numpy()) == 8
    assert np.all(batch["mask"].numpy()[:, 2:] == 0.0)


def test_runs_inside_the_xla_learner_loop():
    data = episodes_data([20, 20, 20], np.random.default_rng(2))
    table = rg.ReplayTable(SPEC, capacity=64, device="CPU")
    table.append(data)
    sampler = rg.Sampler(table, rg.Uniform(), rg.Sequence(5), seed=3)

    def update(batch):
        steps = tf.cast(batch["step"], tf.float32)
        gaps = steps[:, 1:] - steps[:, :-1]
        return {"max_gap": tf.reduce_max(gaps), "min_gap": tf.reduce_min(gaps)}

    out = rg.Learner(table, sampler, update, batch_size=32, jit_compile=True).train(40)
    assert out == {"steps": 40.0, "max_gap": 1.0, "min_gap": 1.0}


def test_rejects_bad_parameters_with_clear_errors():
    table = rg.ReplayTable(SPEC, capacity=8, device="CPU")
    with pytest.raises(rg.ConfigError, match="length: got 9"):
        rg.Sampler(table, rg.Uniform(), rg.Sequence(9))
    with pytest.raises(rg.ConfigError, match="lacks field"):
        rg.Sampler(table, rg.Uniform(), rg.Sequence(2, start_field="episode_start"))
    with pytest.raises(rg.ConfigError, match="expected bool"):
        rg.Sampler(table, rg.Uniform(), rg.Sequence(2, start_field="episode"))


def state_table(lengths, period, capacity=64):
    """Episodes whose row i stores state [i, -i] every ``period`` steps (zeros elsewhere)."""
    spec = dict(
        SPEC,
        state=tf.TensorSpec([2], tf.float32),
        stored=tf.TensorSpec([], tf.bool),
    )
    data = episodes_data(lengths, np.random.default_rng(4), last_open=False)
    n = len(data["step"])
    data["stored"] = data["step"] % period == 0
    ids = np.arange(n, dtype=np.float32)
    data["state"] = np.stack([ids, -ids], 1) * data["stored"][:, None]
    table = rg.ReplayTable(spec, capacity=capacity, device="CPU")
    table.append(data)
    return table, data


@pytest.mark.parametrize("distribution", [rg.Uniform(), rg.Prioritized()], ids=["uni", "pri"])
def test_the_stored_state_comes_once_per_window_from_its_first_real_row(distribution):
    burn_in, length, period = 3, 4, 3
    table, data = state_table([7, 11, 2, 9, 10], period)
    view = rg.Sequence(length, burn_in, pad=True, state_field="state", state_start_field="stored")
    sampler = rg.Sampler(table, distribution, view, seed=5)
    episode = data["episode"]
    # brute force: the first real row is the oldest of start - burn_in .. start in the episode
    first = {
        s: max(s - burn_in, int(np.flatnonzero(episode == episode[s])[0]))
        for s in range(len(episode))
    }
    drawable = sorted(s for s, f in first.items() if data["stored"][f])
    seen = set()
    for _ in range(10):
        starts, batch = sampler.sample(64)
        assert batch["state"].shape == (64, 2)  # once per window, not [B, L, 2]
        assert batch["step"].shape == (64, burn_in + length)
        for b, s in enumerate(starts.numpy()):
            np.testing.assert_array_equal(batch["state"].numpy()[b], [first[s], -first[s]])
            real = batch["mask"].numpy()[b].astype(bool)
            assert batch["step"].numpy()[b][real][0] == data["step"][first[s]]
            seen.add(int(s))
    assert seen == set(drawable)  # every start whose first real row holds a state, only those
    assert int(sampler.invalid_draws.numpy()) == 0
    if distribution.keeps_priorities:  # the others hold priority 0: never drawn, never redrawn
        probs = sampler.probabilities()[: len(episode)]
        np.testing.assert_array_equal(np.flatnonzero(probs > 0), drawable)


def test_state_settings_are_checked_against_the_table():
    table, _ = state_table([5, 5], period=2)
    with pytest.raises(rg.ConfigError, match=r"^state_field: table .* has no field 'core'"):
        rg.Sampler(table, rg.Uniform(), rg.Sequence(3, pad=True, state_field="core"))
    with pytest.raises(rg.ConfigError, match=r"^state_start_field 'step': got int64"):
        rg.Sampler(
            table,
            rg.Uniform(),
            rg.Sequence(3, pad=True, state_field="state", state_start_field="step"),
        )
    with pytest.raises(rg.ConfigError, match=r"^state_start_field: got 'stored' without"):
        rg.Sequence(3, state_start_field="stored")
