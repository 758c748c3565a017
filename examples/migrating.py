"""The migration guide's program (docs/migrating.md): a TF-Agents `TFUniformReplayBuffer` agent's
and a Reverb agent's replay moved to replaygpu, step by step. The guide shows each section
beside the code it replaces; run in order, they are one program.
"""

# --8<-- [start:setup]
import numpy as np
import tensorflow as tf

import replaygpu as rg

spec = {
    "obs": tf.TensorSpec([4], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "reward": tf.TensorSpec([], tf.float32),
    "next_obs": tf.TensorSpec([4], tf.float32),
    "terminated": tf.TensorSpec([], tf.bool),
    "truncated": tf.TensorSpec([], tf.bool),
}


def env_steps(n, seed=0):
    """n transitions as columns {field: [n, ...]} (an env loop's collected steps)."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n + 1, 4)).astype(np.float32)
    return {
        "obs": obs[:-1],
        "action": rng.integers(0, 2, n),
        "reward": np.ones(n, np.float32),
        "next_obs": obs[1:],
        "terminated": rng.random(n) < 0.05,
        "truncated": np.zeros(n, bool),
    }


q_net = tf.keras.Sequential(
    [tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(2)]
)
q_net.build([None, 4])
optimizer = tf.keras.optimizers.Adam(1e-3)
optimizer.build(q_net.trainable_variables)  # before the Learner: it refuses an unbuilt one


def td_errors(batch):
    """[B] one-step TD errors of q_net (no target network, to keep the guide short)."""
    not_done = 1.0 - tf.cast(batch["terminated"], tf.float32)
    target = batch["reward"] + 0.99 * not_done * tf.reduce_max(q_net(batch["next_obs"]), axis=1)
    q_a = tf.gather(q_net(batch["obs"]), batch["action"], batch_dims=1)
    return q_a - tf.stop_gradient(target)


def update_fn(batch):
    """One SGD step on a batch {field: [B, ...]}; returns scalar metrics."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(td_errors(batch)))
    grads = tape.gradient(loss, q_net.trainable_variables)
    optimizer.apply_gradients(zip(grads, q_net.trainable_variables, strict=True))
    return {"loss": loss}


# --8<-- [end:setup]

# --8<-- [start:tf_agents_writes]
table = rg.ReplayTable(spec, capacity=1_000)  # device=None: the first GPU, else the CPU
table.append(env_steps(8))  # e.g. one step of 8 vector envs; validated, all or nothing
table.append(env_steps(100, seed=1))  # or a chunk of steps collected in numpy
assert table.size == 108
# --8<-- [end:tf_agents_writes]

# --8<-- [start:tf_agents_dataset]
table = rg.ReplayTable(spec, capacity=1_000)
table.append(env_steps(200))
sampler = rg.Sampler(table, rg.Uniform(), rg.Transition(), seed=0)
train_step = tf.function(update_fn)

iterator = iter(sampler.as_dataset(64))
for _ in range(5):
    indices, batch = next(iterator)  # indices [64] int64; batch["obs"] [64, 4]
    metrics = train_step(batch)
# --8<-- [end:tf_agents_dataset]

# --8<-- [start:tf_agents_learner]
table = rg.ReplayTable(spec, capacity=1_000)
table.append(env_steps(200))
sampler = rg.Sampler(table, rg.Uniform(), rg.Transition(), seed=0)
learner = rg.Learner(table, sampler, update_fn, batch_size=64, jit_compile=True)
metrics = learner.train(20)  # one graph call: 20 SGD steps -> {"steps": 20.0, "loss": ...}
assert metrics["steps"] == 20
# --8<-- [end:tf_agents_learner]

# --8<-- [start:tf_agents_checkpoints]
table = rg.ReplayTable(spec, capacity=1_000)
table.append(env_steps(50))
sampler = rg.Sampler(table, rg.Uniform(), rg.Transition(), seed=0)
learner = rg.Learner(table, sampler, update_fn, batch_size=16)
learner.train(2)
checkpointer = rg.Checkpointer(
    "ckpt", table=table, sampler=sampler, learner=learner, q_net=q_net, optimizer=optimizer
)
path = checkpointer.save()

restored = rg.ReplayTable(spec, capacity=1_000)  # e.g. in a new process
restored_sampler = rg.Sampler(restored, rg.Uniform(), rg.Transition(), seed=123)
restored_learner = rg.Learner(restored, restored_sampler, update_fn, batch_size=16)
rg.Checkpointer(
    "ckpt",
    table=restored,
    sampler=restored_sampler,
    learner=restored_learner,
    q_net=q_net,
    optimizer=optimizer,
).restore()  # the newest checkpoint in the folder; None when there is none
assert restored.size == 50
np.testing.assert_array_equal(sampler.sample(8)[0].numpy(), restored_sampler.sample(8)[0].numpy())
# --8<-- [end:tf_agents_checkpoints]

# --8<-- [start:reverb_serve]
table = rg.ReplayTable(spec, capacity=1_000)
sampler = rg.Sampler(table, rg.Prioritized(alpha=0.6, beta=0.4), seed=0)
limiter = rg.SampleToInsertRatio(8.0, min_size_to_sample=100, error_buffer=1_000)
learner = rg.Learner(table, sampler, update_fn, batch_size=32, rate_limiter=limiter)

with rg.serve(table, "127.0.0.1:0") as server:  # a bare table: committed as it arrives
    with rg.ReplayClient(server.address, actor_id="actor-0") as client:  # actor side
        client.add_batch(env_steps(150))  # columns {field: [n, ...]}, buffered and streamed
        client.add({k: v[0] for k, v in env_steps(1).items()})  # or one transition at a time
        client.flush(timeout=30)  # wait for the server's acknowledgement
    assert table.size == 151
    metrics = learner.train(10)  # allowed: (8 * (151 - 100) + 1000) // 32 = 44 steps
    assert metrics["steps"] == 10
# --8<-- [end:reverb_serve]

# --8<-- [start:reverb_dataset]
table = rg.ReplayTable(spec, capacity=1_000)
table.append(env_steps(200))
sampler = rg.Sampler(table, rg.Prioritized(alpha=0.6, beta=0.4), seed=0)

for indices, batch in sampler.as_dataset(32).take(5):
    weights = batch["importance_weights"]  # [32] float32, (N P(i))**-beta / max
    td_error = td_errors(batch)
    sampler.update_priorities(indices, tf.abs(td_error))  # stored as (|p| + eps)**alpha
# --8<-- [end:reverb_dataset]

# --8<-- [start:reverb_learner]
from replaygpu.keys import PRIORITIES
from replaygpu.samplers import LinearSchedule

table = rg.ReplayTable(spec, capacity=1_000)
table.append(env_steps(200))
sampler = rg.Sampler(table, rg.Prioritized(alpha=0.6, beta=LinearSchedule(0.4, 1.0, 10_000)))


def prioritized_update(batch):
    with tf.GradientTape() as tape:
        td_error = td_errors(batch)
        loss = tf.reduce_mean(batch["importance_weights"] * tf.square(td_error))
    grads = tape.gradient(loss, q_net.trainable_variables)
    optimizer.apply_gradients(zip(grads, q_net.trainable_variables, strict=True))
    return {"loss": loss, PRIORITIES: tf.abs(td_error)}


learner = rg.Learner(table, sampler, prioritized_update, batch_size=32, jit_compile=True)
metrics = learner.train(20)
# --8<-- [end:reverb_learner]

# --8<-- [start:reverb_served_checkpoints]
from replaygpu.service.server.ledger import SequenceLedger

table = rg.ReplayTable(spec, capacity=1_000)
sampler = rg.Sampler(table, rg.Prioritized(), seed=0)
with rg.serve(table, "127.0.0.1:0") as server:
    with rg.ReplayClient(server.address, actor_id="actor-0") as client:
        client.add_batch(env_steps(64))
        client.flush(timeout=30)
    checkpointer = rg.Checkpointer(
        "served_ckpt", table=table, sampler=sampler, ledger=server.ledger
    )
    path = server.save(checkpointer)

# a restarted learner process
restored = rg.ReplayTable(spec, capacity=1_000)
restored_sampler = rg.Sampler(restored, rg.Prioritized(), seed=0)
ledger = SequenceLedger()
rg.Checkpointer("served_ckpt", table=restored, sampler=restored_sampler, ledger=ledger).restore()
with rg.serve(restored, "127.0.0.1:0", ledger=ledger) as server:
    assert restored.size == 64
# --8<-- [end:reverb_served_checkpoints]

# --8<-- [start:reverb_weights]
import threading

from replaygpu.service.server import loop

table = rg.ReplayTable(spec, capacity=1_000)
learner = rg.Learner(table, rg.Sampler(table, seed=0), update_fn, batch_size=32)
with rg.serve(learner, "127.0.0.1:0") as server:
    # The learner's loop (its process's main loop in practice): commit what actors sent,
    # train k=10 steps per call, publish q_net's weights after each call; here until 30 steps.
    training = threading.Thread(
        target=loop.run,
        args=(server, learner, 10),
        kwargs={"weights": q_net, "max_steps": 30},
    )
    training.start()
    with rg.ReplayClient(server.address, actor_id="actor-0") as client:  # an actor process
        client.add_batch(env_steps(100))
        client.flush(timeout=30)  # acknowledged once the learner's loop committed it
        training.join(timeout=60)
        got = client.get_weights(newer_than=0)  # None when nothing newer was published
        assert got is not None
        version, weights = got  # numpy arrays, for the actor's numpy copy of the policy
        assert client.get_weights(newer_than=version) is None
# --8<-- [end:reverb_weights]
