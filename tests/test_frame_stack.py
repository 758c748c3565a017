"""Frame stacks rebuilt in the graph equal gymnasium's FrameStackObservation stacks."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from gymnasium.wrappers import FrameStackObservation

import replaygpu as rg
from replaygpu.errors import BatchError
from replaygpu.frames import frame_rows
from replaygpu.keys import DISCOUNT, NSTEP
from replaygpu.samplers import make_frame_spec, make_frame_table

STACK = 4


class FrameEnv(gym.Env):
    """Deterministic 84x84 uint8 frames; episode e lasts lengths[e] steps and ends with a
    termination or a truncation, alternating."""

    observation_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, lengths):
        self.lengths = list(lengths)
        self.episode = -1
        self.t = 0

    def frame(self):
        value = (self.episode * 41 + self.t * 7) % 256
        out = np.full((84, 84), value, np.uint8)
        out[self.t % 84, :] = 255 - value  # a moving line, so frames differ in more than level
        return out

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self.frame(), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.lengths[self.episode]
        terminated = end and self.episode % 2 == 0
        truncated = end and not terminated
        return self.frame(), float(self.t + action), terminated, truncated, {}


def record(lengths, chunk=3):
    """Play the wrapped env; return the appended rows and each transition's reference stacks."""
    env = FrameStackObservation(FrameEnv(lengths), STACK)  # default padding_type="reset"
    assert env.padding_type == "reset"
    rows, refs = [], []
    for _ in lengths:
        obs, _ = env.reset()
        frames, actions, rewards, terms, truncs, first = [obs[-1]], [], [], [], [], True
        while True:
            action = len(refs) % 3
            next_obs, reward, term, trunc, _ = env.step(action)
            refs.append((obs.copy(), next_obs.copy(), action, reward, term, trunc))
            frames.append(next_obs[-1])
            actions.append(action)
            rewards.append(reward)
            terms.append(term)
            truncs.append(trunc)
            if term or trunc or len(actions) == chunk:  # actors append in chunks
                rows.append(frame_rows(np.stack(frames), actions, rewards, terms, truncs, first))
                frames, actions, rewards, terms, truncs, first = (
                    [next_obs[-1]],
                    [],
                    [],
                    [],
                    [],
                    False,
                )
            if term or trunc:
                break
            obs = next_obs
    batch = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    return batch, refs


def transition_of_row(batch):
    """Map each table row (in append order) to its transition number, -1 for final rows."""
    out, n = [], 0
    for final in batch["final"]:
        out.append(-1 if final else n)
        n += 0 if final else 1
    return np.array(out)


def check_batch(rows, batch, row_to_ref, refs):
    for b, r in enumerate(rows):
        t = row_to_ref[r]
        assert t >= 0, "a final (frame-only) row was drawn"
        obs, next_obs, action, reward, term, trunc = refs[t]
        np.testing.assert_array_equal(batch["obs"][b], obs, err_msg=f"obs of transition {t}")
        np.testing.assert_array_equal(batch["next_obs"][b], next_obs, err_msg=f"next {t}")
        assert batch["action"][b] == action and batch["reward"][b] == reward
        assert batch["terminated"][b] == term and batch["truncated"][b] == trunc


def test_stacks_equal_gymnasium_frame_stack_with_reset_padding():
    lengths = [1, 2, 3, 5, 8, 2]
    data, refs = record(lengths)
    table = make_frame_table(capacity=64, device="CPU")
    table.append(data)
    sampler = rg.Sampler(table, rg.Uniform(), rg.FrameStack(STACK), seed=0)
    row_to_ref = transition_of_row(data)
    seen = set()
    for _ in range(4):
        rows, batch = sampler.sample(64)
        rows = rows.numpy()
        check_batch(rows, {k: v.numpy() for k, v in batch.items()}, row_to_ref, refs)
        seen |= set(rows.tolist())
    assert len(seen) == len(refs), "every transition row should be drawable"
    assert int(sampler.invalid_draws.numpy()) == 0


def test_ring_wrap_never_uses_overwritten_frames():
    lengths = [7, 9, 4, 6, 3]
    data, refs = record(lengths)
    n = len(data["frame"])
    capacity = n - 5  # the first 5 rows (part of episode 0) are overwritten
    table = make_frame_table(capacity=capacity, device="CPU")
    table.append(data)
    sampler = rg.Sampler(table, rg.Uniform(), rg.FrameStack(STACK), seed=1)
    row_to_ref = transition_of_row(data)
    # Table row r holds appended row a with a % capacity == r, the newest copy.
    appended = {a % capacity: a for a in range(n)}
    seen = set()
    for _ in range(4):
        rows, batch = sampler.sample(64)
        rows = [appended[int(r)] for r in rows.numpy()]
        check_batch(rows, {k: v.numpy() for k, v in batch.items()}, row_to_ref, refs)
        seen |= set(rows)
    # Rows 5, 6, 7 of episode 0 need frames of rows < 5 (overwritten): never drawn.
    assert not seen & {5, 6, 7}
    assert min(seen) == 8


def test_frame_stacks_in_the_xla_learner_loop():
    data, _ = record([6, 6, 6])
    table = make_frame_table(capacity=32, device="CPU")
    table.append(data)
    sampler = rg.Sampler(table, rg.Uniform(), rg.FrameStack(STACK), seed=2)

    def update(batch):
        obs = tf.cast(batch["obs"], tf.float32) / 255.0
        nxt = tf.cast(batch["next_obs"], tf.float32) / 255.0
        return {"obs": tf.reduce_mean(obs), "next": tf.reduce_mean(nxt)}

    out = rg.Learner(table, sampler, update, batch_size=16, jit_compile=True).train(20)
    assert out["steps"] == 20 and 0.0 < out["obs"] < 1.0 and 0.0 < out["next"] < 1.0


def test_one_million_transitions_fit_in_the_memory_budget():
    spec = make_frame_spec((84, 84))
    row = sum(max(1, v.shape.num_elements()) * v.dtype.size for v in spec.values())
    assert spec["frame"].dtype == tf.uint8 and spec["frame"].shape == [84, 84]
    # One frame per row: 1e6 transition rows take 7.07e9 bytes; the final rows (one per
    # episode) add 0.1% for Atari's ~1000-step episodes.
    assert row == 84 * 84 + 16
    assert row * 1_000_000 * 1.001 <= 7.5e9


def test_frame_rows_rejects_inconsistent_chunks():
    frames = np.zeros((3, 84, 84), np.uint8)
    with pytest.raises(BatchError, match="expected n \\+ 1 frames"):
        frame_rows(frames, [0, 1, 2], [0.0] * 3, [False] * 3, [False] * 3, first=True)
    with pytest.raises(BatchError, match="only the last step"):
        frame_rows(frames, [0, 1], [0.0] * 2, [True, False], [False] * 2, first=True)


def test_sampler_rejects_a_table_without_frame_fields():
    table = rg.ReplayTable({"obs": tf.TensorSpec([2], tf.float32)}, 8, "CPU")
    with pytest.raises(rg.ConfigError, match="make_frame_table"):
        rg.Sampler(table, rg.Uniform(), rg.FrameStack())


def n_step_reference(refs, t, n, gamma):
    """The n-step transition from transition t of `record`'s refs (whole episodes appended)."""
    ret, j = 0.0, 0
    while True:
        _, next_obs, _, reward, term, trunc = refs[t + j]
        ret += gamma**j * reward
        if term or trunc or j == n - 1:
            return ret, next_obs, term, trunc, j + 1
        j += 1


def test_n_step_transitions_match_the_episodes_played():
    lengths = [1, 2, 3, 5, 8, 2]
    data, refs = record(lengths)
    table = make_frame_table(capacity=64, device="CPU")
    table.append(data)
    n, gamma = 3, 0.5
    sampler = rg.Sampler(table, rg.Uniform(), rg.FrameStack(STACK, n_step=n, gamma=gamma), seed=3)
    row_to_ref = transition_of_row(data)
    steps_seen = set()
    for _ in range(4):
        rows, batch = sampler.sample(64)
        batch = {k: v.numpy() for k, v in batch.items()}
        for b, r in enumerate(rows.numpy()):
            t = row_to_ref[r]
            assert t >= 0, "a final (frame-only) row was drawn"
            ret, next_obs, term, trunc, m = n_step_reference(refs, t, n, gamma)
            np.testing.assert_array_equal(batch["obs"][b], refs[t][0], err_msg=f"obs of {t}")
            np.testing.assert_array_equal(batch["next_obs"][b], next_obs, err_msg=f"next {t}")
            assert batch["action"][b] == refs[t][2]
            assert batch["reward"][b] == pytest.approx(ret, rel=1e-6)
            assert (batch["terminated"][b], batch["truncated"][b]) == (term, trunc)
            assert batch[NSTEP][b] == m
            assert batch[DISCOUNT][b] == pytest.approx(0.0 if term else gamma**m)
            steps_seen.add(m)
    assert steps_seen == {1, 2, 3}
    assert int(sampler.invalid_draws.numpy()) == 0


def test_n_step_stops_before_missing_frames():
    """An episode left unfinished (no final row, as when a run is resumed in a new game) and the
    newest row cut the n-step window: the return then bootstraps from the last stack whose
    frames exist."""

    def frames(*values):
        return np.stack([np.full((84, 84), v, np.uint8) for v in values])

    no = [False] * 3
    table = make_frame_table(capacity=16, device="CPU")
    # Episode A, 3 steps, never finished: rows 0-2 hold frames 10, 11, 12 (13 is never stored).
    table.append(frame_rows(frames(10, 11, 12, 13), [0, 1, 2], [1.0, 2.0, 4.0], no, no, True))
    # Episode B starts at row 3; its first chunk of 2 steps is the newest: rows 3-4.
    table.append(frame_rows(frames(20, 21, 22), [0, 1], [8.0, 16.0], no[:2], no[:2], True))
    sampler = rg.Sampler(table, rg.Uniform(), rg.FrameStack(2, n_step=3, gamma=1.0), seed=4)
    # Row: (m, return, newest frame of next_obs). Row 2 (its next frame is missing) and row 4
    # (the newest; its next frame is not written yet) are not drawn.
    expected = {0: (2, 3.0, 12), 1: (1, 2.0, 12), 3: (1, 8.0, 21)}
    seen = set()
    for _ in range(4):
        rows, batch = sampler.sample(32)
        for b, r in enumerate(rows.numpy()):
            m, ret, newest = expected[int(r)]
            assert int(batch[NSTEP][b]) == m and float(batch["reward"][b]) == ret
            assert int(batch["next_obs"][b, -1, 0, 0]) == newest
            assert float(batch[DISCOUNT][b]) == 1.0  # nothing terminated: bootstrap
            seen.add(int(r))
    assert seen == set(expected)


def test_n_step_frames_train_the_atari_update_in_xla():
    data, _ = record([6, 6, 6])
    table = make_frame_table(capacity=32, device="CPU")
    table.append(data)
    sampler = rg.Sampler(table, rg.Uniform(), rg.FrameStack(STACK, n_step=3, gamma=0.99), seed=5)

    def update(batch):
        return {
            "discount": tf.reduce_mean(batch[DISCOUNT]),
            "reward": tf.reduce_mean(batch["reward"]),
        }

    out = rg.Learner(table, sampler, update, batch_size=16, jit_compile=True).train(10)
    assert out["steps"] == 10 and 0.0 < out["discount"] < 1.0 and out["reward"] > 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"n_step": 0}, "n_step: got 0"), ({"n_step": 3, "gamma": 1.5}, "gamma: got 1.5")],
)
def test_sampler_rejects_bad_n_step_settings(kwargs, match):
    table = make_frame_table(capacity=16, device="CPU")
    with pytest.raises(rg.ConfigError, match=match):
        rg.Sampler(table, rg.Uniform(), rg.FrameStack(**kwargs))
