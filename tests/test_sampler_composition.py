"""Every index distribution under every view: what is drawn, how it is weighted, and that it
runs eagerly, in the fused loop, under XLA, sharded, and resumes from a checkpoint."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import replaygpu as rg
from replaygpu.agents.networks import Adam
from replaygpu.errors import BatchError
from replaygpu.frames import frame_rows
from replaygpu.keys import IMPORTANCE_WEIGHTS, MASK, PRIORITIES
from replaygpu.samplers import make_frame_spec
from replaygpu.sharded import mirrored_strategy

ALPHA, BETA, EPS = 1.0, 0.5, 1e-6
SEQ = 4
VECTOR_EPISODES = [7, 3, 11, 5, 9, 6]  # lengths; each ends terminated (odd) or truncated (even)
FRAME_EPISODES = [6, 4, 9, 5, 7]


def vector_table(episodes=VECTOR_EPISODES, streams=1, capacity=128):
    """Rows of one or more streams, each stream's episodes in order; row i has id i."""
    spec = {
        "id": tf.TensorSpec([], tf.int64),
        "episode": tf.TensorSpec([], tf.int64),
        "stream": tf.TensorSpec([], tf.int64),
        "obs": tf.TensorSpec([1], tf.float32),
        "action": tf.TensorSpec([], tf.int64),
        "reward": tf.TensorSpec([], tf.float32),
        "next_obs": tf.TensorSpec([1], tf.float32),
        "terminated": tf.TensorSpec([], tf.bool),
        "truncated": tf.TensorSpec([], tf.bool),
    }
    table = rg.ReplayTable(spec, capacity, "CPU")
    rows = []
    for e, length in enumerate(episodes):
        for t in range(length):
            last = t == length - 1
            rows.append((e, e % streams, t, last and e % 2 == 0, last and e % 2 == 1))
    n = len(rows)
    episode, stream, t, term, trunc = (np.array(c) for c in zip(*rows, strict=True))
    table.append(
        {
            "id": np.arange(n),
            "episode": episode,
            "stream": stream,
            "obs": t[:, None].astype(np.float32),
            "action": np.zeros(n, np.int64),
            "reward": np.ones(n, np.float32),
            "next_obs": t[:, None].astype(np.float32) + 1,
            "terminated": term.astype(bool),
            "truncated": trunc.astype(bool),
        }
    )
    return table, episode


def frame_table(episodes=FRAME_EPISODES, capacity=64, spec=None):
    """Frame rows of whole episodes; returns the table and the transition rows (not final)."""
    table = rg.ReplayTable(spec or make_frame_spec((2, 2)), capacity, "CPU")
    transitions, row = [], 0
    for e, length in enumerate(episodes):
        frames = (
            np.full((length + 1, 2, 2), e * 16) + np.arange(length + 1)[:, None, None]
        ).astype(np.uint8)
        ends = np.zeros(length, bool)
        ends[-1] = True
        term, trunc = (ends, ~ends & False) if e % 2 == 0 else (ends & False, ends)
        rows = frame_rows(frames, np.zeros(length, np.int64), np.ones(length), term, trunc, True)
        table.append(rows)
        transitions.extend(range(row, row + length))
        row += length + 1  # the final row
    return table, np.array(transitions)


def sequence_starts(episode_of_row, length):
    """Starts whose window of ``length`` rows stays in one episode (the table's rows)."""
    n = len(episode_of_row)
    return np.array(
        [s for s in range(n - length + 1) if len(set(episode_of_row[s : s + length])) == 1]
    )


def case(view_name):
    """``(table, view, rows every draw must come from, rows that must hold no priority)``."""
    if view_name == "transition":
        table, episode = vector_table()
        return table, rg.Transition(), np.arange(len(episode)), np.array([], int)
    if view_name == "nstep":
        table, episode = vector_table()
        return table, rg.NStep(3, 0.9), np.arange(len(episode)), np.array([], int)
    if view_name == "frames":
        table, transitions = frame_table()
        finals = np.setdiff1d(np.arange(table.size), transitions)
        return table, rg.FrameStack(4, n_step=3, gamma=0.9), transitions, finals
    table, episode = vector_table()
    valid = sequence_starts(episode, SEQ)
    last_episode = np.flatnonzero(episode == episode[-1])
    # starts whose window crosses into a later episode: settled, never drawable
    dead = np.setdiff1d(np.arange(len(episode)), np.concatenate([valid, last_episode]))
    return table, rg.Sequence(SEQ, burn_in=2), valid, dead


VIEWS = ["transition", "nstep", "frames", "sequence"]


def priorities_for(rows):
    return (rows % 5 + 1).astype(np.float64)


def prioritized(table, view, seed=0):
    """A prioritized sampler whose drawable rows hold priority ``row % 5 + 1``."""
    sampler = rg.Sampler(table, rg.Prioritized(ALPHA, BETA, epsilon=EPS), view, seed=seed)
    alive = np.flatnonzero(sampler.probabilities() > 0)
    sampler.update_priorities(alive, priorities_for(alive))
    return sampler, alive


def draw_rows(sampler, batches=60, batch_size=256):
    return np.concatenate([sampler.sample(batch_size)[0].numpy() for _ in range(batches)])


@pytest.mark.parametrize("view_name", VIEWS)
@pytest.mark.parametrize("distribution", ["uniform", "prioritized"])
def test_rows_are_drawn_in_proportion_to_priority_over_the_rows_the_view_accepts(
    distribution, view_name
):
    table, view, valid, dead = case(view_name)
    if distribution == "uniform":
        sampler = rg.Sampler(table, rg.Uniform(), view, seed=1)
        weight = np.ones(len(valid))
    else:
        sampler, alive = prioritized(table, view, seed=1)
        # rows the view can never draw hold no priority; every drawable row holds one
        assert not np.intersect1d(alive, dead).size and np.isin(valid, alive).all()
        weight = (priorities_for(valid) + EPS) ** ALPHA
    rows = draw_rows(sampler)
    assert np.isin(rows, valid).all(), np.setdiff1d(rows, valid)
    counts = np.array([np.sum(rows == r) for r in valid])
    expected = weight / weight.sum() * len(rows)
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    assert int(sampler.invalid_draws.numpy()) == 0


@pytest.mark.parametrize("view_name", VIEWS)
def test_importance_weights_are_exact(view_name):
    table, view, _, _ = case(view_name)
    sampler, alive = prioritized(table, view)
    p = (priorities_for(alive) + EPS) ** ALPHA
    for _ in range(5):
        rows, batch = sampler.sample(64)
        got = batch[IMPORTANCE_WEIGHTS].numpy()
        want = ((priorities_for(rows.numpy()) + EPS) ** ALPHA / p.min()) ** -BETA
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("distribution", [rg.Uniform(), rg.Prioritized()], ids=["uni", "pri"])
def test_sequences_never_cross_an_episode_or_a_stream(distribution, pad):
    # Two streams whose episodes interleave episode by episode, as two actors appending whole
    # episodes do; episodes 1 and 3 are of stream 1, the others of stream 0.
    table, _ = vector_table(streams=2)
    view = rg.Sequence(SEQ, burn_in=3, pad=pad, stream_field="stream")
    sampler = rg.Sampler(table, distribution, view, seed=2)
    for _ in range(20):
        starts, batch = sampler.sample(64)
        mask = batch[MASK].numpy().astype(bool)
        episode, stream = batch["episode"].numpy(), batch["stream"].numpy()
        ids = batch["id"].numpy()
        np.testing.assert_array_equal(ids[:, 3], starts.numpy())  # the start follows burn-in
        assert mask[:, 3].all() and (pad or mask[:, 3:].all())
        for b in range(len(starts)):
            kept = mask[b]
            assert len(set(episode[b][kept])) == 1 and len(set(stream[b][kept])) == 1
            # masked steps are zeros; real steps are consecutive rows
            assert (ids[b][~kept] == 0).all() and (np.diff(ids[b][kept]) == 1).all()


def learner_update(prioritized_run):
    w = tf.Variable(0.0)

    def update(batch):
        obs = tf.cast(batch["obs"], tf.float32)
        x = tf.reduce_mean(tf.reshape(obs, [tf.shape(obs)[0], -1]), axis=1)
        with tf.GradientTape() as tape:
            err = (
                w * x - tf.reshape(tf.cast(batch["reward"], tf.float32), [tf.shape(x)[0], -1])[:, 0]
            )
            loss = tf.reduce_mean(tf.square(err))
        w.assign_sub(1e-3 * tape.gradient(loss, w))
        out = {"loss": loss}
        if prioritized_run:
            out[PRIORITIES] = tf.abs(err) + 0.5
        return out

    return update


@pytest.mark.parametrize("view_name", VIEWS)
@pytest.mark.parametrize("distribution", [rg.Uniform(), rg.Prioritized()], ids=["uni", "pri"])
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_every_combination_trains_in_the_fused_loop(view_name, distribution, jit_compile):
    table, view, _, _ = case(view_name)
    sampler = rg.Sampler(table, distribution, view, seed=0)
    update = learner_update(distribution.keeps_priorities)
    learner = rg.Learner(table, sampler, update, batch_size=16, jit_compile=jit_compile)
    out = learner.train(20)
    assert out["steps"] == 20 and np.isfinite(out["loss"])
    if distribution.keeps_priorities:  # the loop wrote the update's priorities back
        probs = sampler.probabilities()
        assert len(np.unique(np.round(probs[probs > 0], 12))) > 1


@pytest.mark.parametrize("view_name", VIEWS)
@pytest.mark.parametrize("distribution", [rg.Uniform(), rg.Prioritized()], ids=["uni", "pri"])
def test_a_checkpoint_of_every_combination_resumes_the_same_random_stream(
    view_name, distribution, tmp_path
):
    table, view, _, _ = case(view_name)
    sampler = rg.Sampler(table, distribution, view, seed=3)
    sampler.sample(8)
    rg.Checkpointer(tmp_path, table=table, sampler=sampler).save()
    want = [sampler.sample(8) for _ in range(3)]

    fresh, _, _, _ = case(view_name)
    other = rg.Sampler(fresh, distribution, view, seed=99)
    rg.Checkpointer(tmp_path, table=fresh, sampler=other).restore()
    for rows, batch in want:
        got_rows, got = other.sample(8)
        np.testing.assert_array_equal(got_rows.numpy(), rows.numpy())
        for key in batch:
            np.testing.assert_array_equal(got[key].numpy(), batch[key].numpy())


def test_a_sharded_prioritized_frame_stack_learner_trains_on_two_logical_cpus():
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])
    spec = {**make_frame_spec((2, 2)), "actor": tf.TensorSpec([], tf.int64)}
    table = rg.ShardedReplayTable(spec, 128, strategy, shard_by="actor")
    for e, length in enumerate([6, 4, 9, 5, 7, 8]):  # whole episodes, actors 0 and 1 in turn
        frames = (
            np.full((length + 1, 2, 2), e * 16) + np.arange(length + 1)[:, None, None]
        ).astype(np.uint8)
        ends = np.arange(length) == length - 1
        rows = frame_rows(
            frames, np.zeros(length, np.int64), np.ones(length), ends, ~ends & False, True
        )
        rows["actor"] = np.full(len(rows["frame"]), e % 2, np.int64)
        table.append(rows)
    assert table.shard_sizes == [6 + 9 + 7 + 3, 4 + 5 + 8 + 3]
    sampler = rg.Sampler(table, rg.Prioritized(), rg.FrameStack(4, n_step=3), seed=0)
    with strategy.scope():
        w = tf.Variable(tf.zeros([1]))
        opt = Adam([w], 0.01)

    def update(batch):
        x = tf.reduce_mean(tf.cast(batch["obs"], tf.float32), axis=[1, 2, 3]) / 64.0
        with tf.GradientTape() as tape:
            err = w[0] * x - batch["reward"]
            loss = tf.reduce_mean(batch[IMPORTANCE_WEIGHTS] * tf.square(err))
        opt.apply(tape.gradient(loss, [w]))
        return {"loss": loss, PRIORITIES: tf.abs(err)}

    learner = rg.Learner(table, sampler, update, batch_size=16)
    first = learner.train(30)
    last = learner.train(60)
    assert first["steps"] == 30 and last["steps"] == 60
    assert last["loss"] < first["loss"]  # it learns
    for shard, index in zip(table.shards, sampler.indexes, strict=True):
        leaves = index.tree.leaves().numpy()[: shard.size]
        finals = shard.read("final", tf.range(shard.size, dtype=tf.int64)).numpy()
        assert (leaves[finals] == 0).all() and (leaves[~finals] > 0).all()
        assert int(index.sample_count.numpy()) == 90
        assert len(np.unique(leaves[~finals])) > 2  # the update's priorities came back


def test_a_view_of_consecutive_rows_on_a_round_robin_sharded_table_is_refused():
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])
    spec = {**make_frame_spec((2, 2)), "actor": tf.TensorSpec([], tf.int64)}
    table = rg.ShardedReplayTable(spec, 16, strategy)  # round-robin: no shard_by
    for view in (rg.FrameStack(4), rg.NStep(3), rg.Sequence(4)):
        with pytest.raises(rg.ConfigError, match=r"^view: .* reads consecutive rows.*shard_by="):
            rg.Sampler(table, rg.Prioritized(), view)
    assert table.size == 0
    rg.Sampler(table, rg.Prioritized(), rg.Transition())  # rows of any stream: fine


def test_priorities_for_rows_the_view_never_draws_are_refused_and_change_nothing():
    table, transitions = frame_table()
    sampler = rg.Sampler(table, rg.Prioritized(), rg.FrameStack(4))
    before = sampler.probabilities()
    final = int(np.setdiff1d(np.arange(table.size), transitions)[0])
    with pytest.raises(BatchError, match=rf"indices: rows \[{final}\] were never drawn"):
        sampler.update_priorities(np.array([0, final]), np.array([1.0, 2.0]))
    np.testing.assert_array_equal(sampler.probabilities(), before)


def test_bad_view_settings_name_the_argument():
    table, _ = vector_table()
    with pytest.raises(rg.ConfigError, match="length: got 0"):
        rg.Sequence(0)
    with pytest.raises(rg.ConfigError, match="burn_in: got -1"):
        rg.Sequence(4, burn_in=-1)
    with pytest.raises(rg.ConfigError, match=r"length: got 100 \(burn_in 40\)"):
        rg.Sampler(table, view=rg.Sequence(100, burn_in=40))
    with pytest.raises(rg.ConfigError, match="n_step: got 0"):
        rg.FrameStack(4, n_step=0)
    with pytest.raises(rg.ConfigError, match="lacks frame-table field"):
        rg.Sampler(table, view=rg.FrameStack(4))
    with pytest.raises(rg.ConfigError, match="alpha: got -1"):
        rg.Prioritized(alpha=-1)
    with pytest.raises(rg.ConfigError, match="view: got str"):
        rg.Sampler(table, rg.Uniform(), "frames")


def test_sharded_prioritized_sequences_with_a_stored_state_train_on_two_logical_cpus():
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])
    spec = {
        "id": tf.TensorSpec([], tf.int64),
        "actor": tf.TensorSpec([], tf.int64),
        "obs": tf.TensorSpec([1], tf.float32),
        "reward": tf.TensorSpec([], tf.float32),
        "terminated": tf.TensorSpec([], tf.bool),
        "truncated": tf.TensorSpec([], tf.bool),
        "state": tf.TensorSpec([2], tf.float32),
        "stored": tf.TensorSpec([], tf.bool),
    }
    table = rg.ShardedReplayTable(spec, 128, strategy, shard_by="actor")
    row = 0
    for e, length in enumerate([9, 6, 12, 7, 10, 8]):  # whole episodes, actors 0 and 1 in turn
        t = np.arange(length)
        ids = np.arange(row, row + length)
        table.append(
            {
                "id": ids,
                "actor": np.full(length, e % 2),
                "obs": t[:, None].astype(np.float32),
                "reward": np.ones(length, np.float32),
                "terminated": t == length - 1,
                "truncated": np.zeros(length, bool),
                "state": np.stack([ids, ids], 1).astype(np.float32),  # the row's id as state
                "stored": t % 2 == 0,
            }
        )
        row += length
    view = rg.Sequence(3, burn_in=2, pad=True, state_field="state", state_start_field="stored")
    sampler = rg.Sampler(table, rg.Prioritized(), view, seed=0)
    with strategy.scope():
        w = tf.Variable(tf.zeros([1]))
        opt = Adam([w], 0.01)

    def update(batch):
        mask = batch[MASK]
        # the state is the id of the window's first real row: the first unmasked id
        first = tf.argmax(mask, axis=1)
        first_id = tf.gather(batch["id"], first, batch_dims=1)
        state_ok = tf.reduce_all(tf.equal(tf.cast(batch["state"][:, 0], tf.int64), first_id))
        same_actor = tf.reduce_all(
            tf.equal(batch["actor"], batch["actor"][:, 2:3]) | tf.equal(mask, 0.0)
        )
        x = tf.reduce_sum(batch["obs"][..., 0] * mask, axis=1) / 10.0
        with tf.GradientTape() as tape:
            err = w[0] * x - tf.reduce_sum(batch["reward"] * mask, axis=1)
            loss = tf.reduce_mean(batch[IMPORTANCE_WEIGHTS] * tf.square(err))
        opt.apply(tape.gradient(loss, [w]))
        checks = tf.cast(state_ok & same_actor, tf.float32)
        return {"loss": loss, "checks": checks, PRIORITIES: tf.abs(err)}

    learner = rg.Learner(table, sampler, update, batch_size=16)
    first = learner.train(30)
    last = learner.train(60)
    assert first["checks"] == 1.0 and last["checks"] == 1.0
    assert last["loss"] < first["loss"]  # it learns
    for shard, index in zip(table.shards, sampler.indexes, strict=True):
        leaves = index.tree.leaves().numpy()[: shard.size]
        assert len(np.unique(leaves[leaves > 0])) > 2  # the update's priorities came back
        assert (leaves == 0).any()  # starts whose first real row holds no state
