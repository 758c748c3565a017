"""A replay table sharded over two logical CPU devices (conftest splits the CPU).

Checks the promises of `rg.ShardedReplayTable`: appends split as stated (round-robin by row, or
by a stream field), a bad batch writes no shard, each replica samples only its own shard, the
data-parallel learner reaches the weights of the single-device learner on the same minibatches,
prioritized weights are those of the probabilities the shards sample with, checkpoints restore
onto the same number of shards only, and a served sharded table ingests over gRPC exactly.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from service_helpers import SPEC, columns

import replaygpu as rg
from replaygpu.agents.networks import Adam
from replaygpu.errors import BatchError, CheckpointMismatchError
from replaygpu.frames import frame_rows
from replaygpu.keys import IMPORTANCE_WEIGHTS, PRIORITIES
from replaygpu.samplers import Distribution, make_frame_spec
from replaygpu.samplers.distribution import Index
from replaygpu.sharded import mirrored_strategy, replica_index

DEVICES = ["/cpu:0", "/cpu:1"]


@pytest.fixture(scope="module")
def strategy():
    return mirrored_strategy(DEVICES)  # one per process: see mirrored_strategy


def shard_ids(table):
    return [shard.storage["id"].numpy()[: shard.size].tolist() for shard in table.shards]


def test_rows_are_dealt_round_robin_across_appends_of_any_size(strategy):
    table = rg.ShardedReplayTable(SPEC, 20, strategy)
    table.append(columns([0, 1, 2]))
    table.append(columns([3]))
    table.append(columns([4, 5, 6, 7, 8]))
    assert shard_ids(table) == [[0, 2, 4, 6, 8], [1, 3, 5, 7]]
    assert (table.size, table.total_inserted, table.shard_sizes) == (9, 9, [5, 4])
    assert "CPU:0" in table.shards[0].device and "CPU:1" in table.shards[1].device
    obs = table.shards[1].storage["obs"].numpy()[:4]
    np.testing.assert_array_equal(obs, np.repeat([[1], [3], [5], [7]], 4, axis=1))


def test_each_shard_is_a_ring_of_capacity_over_replicas(strategy):
    table = rg.ShardedReplayTable(SPEC, 6, strategy)
    table.append(columns(range(10)))
    assert table.size == 6 and table.total_inserted == 10
    assert [sorted(ids) for ids in shard_ids(table)] == [[4, 6, 8], [5, 7, 9]]


def test_rows_follow_their_stream_field_modulo_the_replicas(strategy):
    spec = {**SPEC, "stream": tf.TensorSpec([], tf.int64)}
    table = rg.ShardedReplayTable(spec, 20, strategy, shard_by="stream")
    batch = columns([10, 11, 12, 13, 14])
    batch["stream"] = np.array([3, 4, 3, -1, 4], np.int64)
    table.append(batch)
    assert shard_ids(table) == [[11, 14], [10, 12, 13]]  # -1 % 2 == 1


def test_a_bad_batch_writes_no_shard(strategy):
    table = rg.ShardedReplayTable(SPEC, 20, strategy)
    table.append(columns([0, 1]))
    bad = columns([2, 3])
    bad["obs"] = bad["obs"][:, :3]
    with pytest.raises(BatchError, match=r"field 'obs': expected shape \[None, 4\]"):
        table.append(bad)
    assert shard_ids(table) == [[0], [1]] and table.total_inserted == 2


def test_bad_configurations_are_refused_with_the_fix(strategy):
    with pytest.raises(rg.ConfigError, match=r"multiple of the 2 replicas.*try 10"):
        rg.ShardedReplayTable(SPEC, 11, strategy)
    with pytest.raises(rg.ConfigError, match=r"integer scalar field.*fields: \['id', 'obs'\]"):
        rg.ShardedReplayTable(SPEC, 10, strategy, shard_by="obs")
    with pytest.raises(rg.ConfigError, match=r"expected a tf.distribute.Strategy"):
        rg.ShardedReplayTable(SPEC, 10, "mirrored")
    with strategy.scope(), pytest.raises(rg.ConfigError, match=r"outside the scope"):
        rg.ShardedReplayTable(SPEC, 10, strategy)
    table = rg.ShardedReplayTable(SPEC, 10, strategy)
    table.append(columns([0, 1]))
    with pytest.raises(rg.ConfigError, match=r"reads consecutive rows.*shard_by="):
        rg.Sampler(table, rg.Uniform(), rg.NStep(3))
    with pytest.raises(rg.ConfigError, match=r"batch_size: got 5, expected a multiple of"):
        rg.Learner(table, rg.Sampler(table), lambda b: {}, batch_size=5)
    with pytest.raises(rg.ConfigError, match=r"inside strategy.run"):
        rg.Sampler(table, seed=0).sample(4)
    with strategy.scope(), pytest.raises(rg.ConfigError, match=r"outside the scope"):
        rg.Sampler(table, rg.Prioritized())


def sample_in_replicas(strategy, sampler, batch_size, draws):
    """``draws`` samples of each replica, as (ids per replica, importance weights per replica)."""

    @tf.function
    def draw():
        def replica():
            _, batch = sampler.sample(batch_size)
            weights = batch.get(IMPORTANCE_WEIGHTS, tf.ones_like(batch["obs"][:, 0]))
            return batch["id"], weights

        return strategy.run(replica)

    ids, weights = [[], []], [[], []]
    for _ in range(draws):
        got_ids, got_weights = draw()
        for i, (a, w) in enumerate(
            zip(
                strategy.experimental_local_results(got_ids),
                strategy.experimental_local_results(got_weights),
                strict=True,
            )
        ):
            ids[i].append(a.numpy())
            weights[i].append(w.numpy())
    return [np.concatenate(x) for x in ids], [np.concatenate(x) for x in weights]


def test_each_replica_samples_its_own_shard_uniformly(strategy):
    from scipy import stats

    table = rg.ShardedReplayTable(SPEC, 40, strategy)
    table.append(columns(range(40)))
    sampler = rg.Sampler(table, seed=3)
    ids, _ = sample_in_replicas(strategy, sampler, 64, 50)
    assert set(ids[0]) == set(range(0, 40, 2)) and set(ids[1]) == set(range(1, 40, 2))
    for got in ids:
        counts = np.unique(got, return_counts=True)[1]
        assert stats.chisquare(counts).pvalue > 1e-3
    assert not np.array_equal(ids[0] + 1, ids[1])  # the shards' streams are not the same


def test_prioritized_weights_are_those_of_the_probabilities_sampled_with(strategy):
    table = rg.ShardedReplayTable(SPEC, 8, strategy)
    table.append(columns(range(8)))  # shard 0: ids 0 2 4 6, shard 1: 1 3 5 7
    sampler = rg.Sampler(table, rg.Prioritized(alpha=1.0, beta=0.5, epsilon=1e-9), seed=0)
    priority = {0: 1.0, 2: 1.0, 4: 1.0, 6: 1.0, 1: 1.0, 3: 2.0, 5: 4.0, 7: 8.0}
    for shard, index in zip(table.shards, sampler.indexes, strict=True):
        ids = shard.storage["id"].numpy()
        values = tf.constant([priority[i] for i in ids], tf.float64)

        @tf.function
        def set_priorities(index=index, values=values):
            index.sync(sampler.view)
            index.write(tf.range(4, dtype=tf.int64), values)

        set_priorities()
    ids, weights = sample_in_replicas(strategy, sampler, 64, 20)
    # per-draw probability of row i of shard s is p_i / (R * T_s); T_0 = 4, T_1 = 15
    totals = [4.0, 15.0]
    prob = {i: priority[i] / (2 * totals[i % 2]) for i in priority}
    max_weight = max(p**-0.5 for p in prob.values())
    for replica in range(2):
        want = np.array([prob[i] ** -0.5 / max_weight for i in ids[replica]])
        np.testing.assert_allclose(weights[replica], want, rtol=1e-5)
        rows = np.unique(ids[replica], return_counts=True)
        if replica == 1:  # ids 1 3 5 7 in proportion 1:2:4:8 (stratified draws, so close)
            np.testing.assert_allclose(
                rows[1] / rows[1].sum(), [1 / 15, 2 / 15, 4 / 15, 8 / 15], atol=0.03
            )


class CyclicIndex(Index):
    """Rows ``0, 1, 2, ...`` of a shard in order (wrapping)."""

    def __init__(self, table):
        super().__init__(name="cyclic_index")
        self.table = table
        with tf.device(table.device):
            self.next_row = tf.Variable(0, dtype=tf.int64, trainable=False)

    def draw(self, batch_size, stratified=True):
        start = self.next_row.assign_add(batch_size) - batch_size
        return (start + tf.range(batch_size, dtype=tf.int64)) % self.table.size_var, None


@dataclasses.dataclass(frozen=True)
class Cyclic(Distribution):
    """Deterministic minibatches for comparisons: a distribution of one's own."""

    def build(self, table, seed, num_shards):
        return CyclicIndex(table)


def cyclic_sampler(table):
    return rg.Sampler(table, Cyclic())


def make_regression(scope, max_grad_norm=None):
    """A linear model, its Adam (which all-reduces inside strategy.run) and update_fn."""
    with scope:
        w = tf.Variable(tf.zeros([4, 1]), name="w")
        b = tf.Variable(tf.zeros([1]), name="b")
        opt = Adam([w, b], 0.05, max_grad_norm)

    def update(batch):
        target = tf.cast(batch["id"], tf.float32)[:, None] * 0.1 - 1.0
        with tf.GradientTape() as tape:
            pred = tf.matmul(tf.sin(batch["obs"]), w) + b
            loss = tf.reduce_mean(tf.square(pred - target))
        grads = tape.gradient(loss, [w, b])
        opt.apply(grads)
        return {"loss": loss, "grad_norm": tf.linalg.global_norm(grads)}

    return [w, b, *(v.value for v in opt.keras.variables)], update  # Adam's moments too


# a clip at 0.5 binds on the first steps: the clipped norm must be the mean gradient's
@pytest.mark.parametrize("max_grad_norm", [None, 0.5])
def test_sharded_learner_reaches_the_single_device_weights_on_the_same_minibatches(
    strategy, max_grad_norm
):
    # Shard 0 holds the even rows and shard 1 the odd ones; cycling 4 rows a replica, the two
    # replicas together draw exactly the 8 rows the single learner's cycle of 8 draws.
    single_table = rg.ReplayTable(SPEC, 32, device="/cpu:0")
    single_table.append(columns(range(32)))
    single_vars, single_update = make_regression(tf.name_scope("single"), max_grad_norm)
    single = rg.Learner(single_table, cyclic_sampler(single_table), single_update, batch_size=8)

    table = rg.ShardedReplayTable(SPEC, 32, strategy)
    table.append(columns(range(32)))
    sharded_vars, sharded_update = make_regression(strategy.scope(), max_grad_norm)
    sharded = rg.Learner(table, cyclic_sampler(table), sharded_update, batch_size=8)

    norms = []
    for _ in range(3):
        got_single, got_sharded = single.train(40), sharded.train(40)
        assert got_sharded["steps"] == got_single["steps"] == 40
        assert got_sharded["loss"] == pytest.approx(got_single["loss"], rel=1e-4)
        norms.append(got_single["grad_norm"])
    assert max_grad_norm is None or norms[0] > max_grad_norm  # the clip binds
    for want, var in zip(single_vars, sharded_vars, strict=True):
        copies = [v.numpy() for v in strategy.experimental_local_results(var)]
        np.testing.assert_allclose(copies[0], copies[1])  # replicas stay in sync
        np.testing.assert_allclose(copies[0], want.numpy(), rtol=1e-4, atol=1e-5)
    assert abs(single_vars[0].numpy()).sum() > 0.1  # it learned something
    assert sharded.steps.numpy() == 120 and sharded.trace_count == 1


def test_rate_limiter_counts_the_whole_table_and_every_shard_must_hold_rows(strategy):
    table = rg.ShardedReplayTable(SPEC, 64, strategy)
    _, update = make_regression(strategy.scope())
    limiter = rg.SampleToInsertRatio(samples_per_insert=4.0, min_size_to_sample=1, error_buffer=8)
    learner = rg.Learner(table, rg.Sampler(table, seed=1), update, 8, rate_limiter=limiter)
    table.append(columns([0]))  # one shard is still empty: no step
    assert learner.train(100)["steps"] == 0
    table.append(columns(range(1, 32)))
    ran = learner.train(100)["steps"]
    assert 0 < ran < 100
    assert limiter.sampled.numpy() == ran * 8
    assert ran * 8 <= 4.0 * 32 + 8


def test_prioritized_nstep_learner_runs_on_streams_sharded_by_actor(strategy):
    spec = {
        "id": tf.TensorSpec([], tf.int64),
        "obs": tf.TensorSpec([4], tf.float32),
        "reward": tf.TensorSpec([], tf.float32),
        "next_obs": tf.TensorSpec([4], tf.float32),
        "terminated": tf.TensorSpec([], tf.bool),
        "truncated": tf.TensorSpec([], tf.bool),
        "stream": tf.TensorSpec([], tf.int64),
    }
    table = rg.ShardedReplayTable(spec, 64, strategy, shard_by="stream")
    n = 32
    batch = columns(range(n))
    batch.update(
        reward=np.ones(n, np.float32),
        next_obs=batch["obs"] + 1,
        terminated=np.zeros(n, bool),
        truncated=np.zeros(n, bool),
        stream=np.arange(n, dtype=np.int64) // 8,  # four actors' chunks of 8 rows
    )
    table.append(batch)
    assert table.shard_sizes == [16, 16]
    sampler = rg.Sampler(table, rg.Prioritized(), seed=0).with_view(
        rg.NStep(3, gamma=0.5, stream_field="stream")
    )
    assert sampler.keeps_priorities and len(sampler.indexes) == 2

    def update(b):
        return {
            "ret": tf.reduce_mean(b["reward"]),
            "ret_max": tf.reduce_max(b["reward"]),
            PRIORITIES: b["reward"] * 0 + 2.0,
        }

    learner = rg.Learner(table, sampler, update, batch_size=8)
    out = learner.train(10)
    # each stream continues in its shard: 3-step returns 1 + 0.5 + 0.25, shorter only at the
    # last two rows of a stream (12 of 16 rows in each shard give 1.75; dealt round-robin,
    # every neighbour would be another stream's and each return 1.0)
    assert out["steps"] == 10 and out["ret_max"] == pytest.approx(1.75)
    assert 1.5 < out["ret"] <= 1.75
    assert all(index.sample_count.numpy() > 0 for index in sampler.indexes)


def test_checkpoint_restores_onto_the_same_number_of_shards_only(strategy, tmp_path):
    table = rg.ShardedReplayTable(SPEC, 20, strategy)
    sampler = rg.Sampler(table, seed=5)
    table.append(columns(range(13)))
    rg.Checkpointer(tmp_path, table=table, sampler=sampler).save()

    fresh = rg.ShardedReplayTable(SPEC, 20, strategy)
    fresh_sampler = rg.Sampler(fresh, seed=99)
    rg.Checkpointer(tmp_path, table=fresh, sampler=fresh_sampler).restore()
    assert shard_ids(fresh) == shard_ids(table)
    assert (fresh.size, fresh.total_inserted) == (13, 13)
    a, _ = sample_in_replicas(strategy, sampler, 16, 2)
    b, _ = sample_in_replicas(strategy, fresh_sampler, 16, 2)
    np.testing.assert_array_equal(np.concatenate(a), np.concatenate(b))  # same random streams
    fresh.append(columns([13]))  # the round-robin continues where it stopped
    assert shard_ids(fresh)[1][-1] == 13

    one = rg.ShardedReplayTable(SPEC, 20, mirrored_strategy(["/cpu:0"]))
    one.append(columns([7]))
    with pytest.raises(CheckpointMismatchError, match=r"holds 2 shards.*has 1"):
        rg.Checkpointer(tmp_path, table=one).restore()
    assert one.shards[0].storage["id"].numpy()[0] == 7 and one.total_inserted == 1
    plain = rg.ReplayTable(SPEC, 20)
    with pytest.raises(CheckpointMismatchError, match=r"holds 2 shards.*has 1"):
        rg.Checkpointer(tmp_path, table=plain).restore()


def test_a_served_sharded_table_ingests_over_grpc_exactly(strategy):
    table = rg.ShardedReplayTable(SPEC, 1000, strategy)
    with rg.serve(table) as server:
        clients = [rg.ReplayClient(server.address, actor_id=f"a{i}") for i in range(2)]
        for i, client in enumerate(clients):
            for start in range(0, 150, 30):
                client.add_batch(columns(np.arange(start, start + 30) + 1000 * i))
        for client in clients:
            client.flush(timeout=30)
            client.close()
        with rg.ReplayClient(server.address, actor_id="reader") as reader:
            info = reader.info().tables[0]
        assert (info.size, info.inserted, info.capacity) == (300, 300, 1000)
        assert "CPU:0" in info.device and "CPU:1" in info.device
    assert table.total_inserted == 300 and table.shard_sizes == [150, 150]
    stored = sorted(np.concatenate([np.array(ids) for ids in shard_ids(table)]).tolist())
    assert stored == list(range(150)) + list(range(1000, 1150))


def test_replica_index_is_refused_outside_the_strategy(strategy):
    with pytest.raises(rg.ConfigError, match=r"inside strategy.run"):
        replica_index(strategy)


def draw_batches(strategy, sampler, batch_size, draws):
    """``draws`` batches of each replica, as numpy dicts per replica."""

    @tf.function
    def draw():
        return strategy.run(lambda: sampler.sample(batch_size)[1])

    out = [[], []]
    for _ in range(draws):
        per_replica = {k: strategy.experimental_local_results(v) for k, v in draw().items()}
        for i in range(2):
            out[i].append({k: v[i].numpy() for k, v in per_replica.items()})
    return out


def test_sequence_and_frame_stack_samplers_read_each_stream_within_its_shard(strategy):
    # sequences: 4 streams append whole episodes of 6 steps; ids count per stream
    spec = {
        "id": tf.TensorSpec([], tf.int64),
        "stream": tf.TensorSpec([], tf.int64),
        "terminated": tf.TensorSpec([], tf.bool),
        "truncated": tf.TensorSpec([], tf.bool),
    }
    table = rg.ShardedReplayTable(spec, 96, strategy, shard_by="stream")
    for episode in range(2):
        for stream in range(4):
            t = np.arange(6)
            table.append({
                "id": stream * 1000 + episode * 6 + t,
                "stream": np.full(6, stream),
                "terminated": t == 5,
                "truncated": np.zeros(6, bool),
            })  # fmt: skip
    sampler = rg.Sampler(table, rg.Uniform(), rg.Sequence(3), seed=0)
    for replica in draw_batches(strategy, sampler, 16, 4):
        for batch in replica:
            ids = batch["id"]
            assert (np.diff(ids, axis=1) == 1).all()  # consecutive steps of one stream
            assert ((ids % 1000 % 6)[:, 0] <= 3).all()  # never across an episode end

    # frame stacks: frames of stream s step t hold 50 * s + t; shards hold streams 0/2 and 1/3
    frame_spec = {**make_frame_spec((2, 2)), "stream": tf.TensorSpec([], tf.int64)}
    frames_table = rg.ShardedReplayTable(frame_spec, 64, strategy, shard_by="stream")
    for stream in range(4):
        frames = np.repeat((50 * stream + np.arange(6))[:, None, None], 4).reshape(6, 2, 2)
        rows = frame_rows(
            frames.astype(np.uint8),
            np.zeros(5, np.int64),
            np.ones(5, np.float32),
            np.arange(5) == 4,
            np.zeros(5, bool),
            first=True,
        )
        rows["stream"] = np.full(len(rows["frame"]), stream)
        frames_table.append(rows)
    stacker = rg.Sampler(frames_table, rg.Uniform(), rg.FrameStack(3), seed=1)
    for replica, streams in zip(
        draw_batches(strategy, stacker, 8, 4), ((0, 2), (1, 3)), strict=True
    ):
        for batch in replica:
            obs, next_obs = batch["obs"][:, :, 0, 0].astype(int), batch["next_obs"][:, :, 0, 0]
            assert set(obs[:, -1] // 50) <= set(streams)
            np.testing.assert_array_equal(next_obs[:, -1], obs[:, -1] + 1)
            steps = np.diff(obs, axis=1)
            assert ((steps == 1) | (steps == 0)).all()  # in order; the reset frame repeated
