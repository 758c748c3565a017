"""R2D2: value rescaling, n-step targets inside a window, eta-mixed priorities, burn-in without
gradients, the fused update under XLA, the ConfigErrors, a memory task only a recurrent agent
solves, and ``replaygpu demo r2d2-cartpole`` end to end."""

import dataclasses
import os
import re
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents.dqn import agent as dqn
from replaygpu.agents.envs import CARTPOLE_NO_VELOCITY
from replaygpu.agents.r2d2 import agent as r2d2
from replaygpu.agents.r2d2.acting import RecurrentQPolicy, numpy_lstm_step
from replaygpu.agents.r2d2.config import R2D2Config
from replaygpu.agents.r2d2.network import LSTMQNetwork, unroll_together
from replaygpu.keys import IMPORTANCE_WEIGHTS, MASK

SMALL = R2D2Config(
    sequence_length=6, burn_in=2, period=2, lstm_units=8, torso_size=8, batch_size=4, n_step=2
)


def test_value_rescaling_and_its_inverse_invert_each_other():
    x = tf.constant(np.concatenate([-np.logspace(-4, 4, 50), [0.0], np.logspace(-4, 4, 50)]))
    for eps in (1e-3, 1e-2, 0.0):
        h = r2d2.value_rescale(x, eps)
        np.testing.assert_allclose(r2d2.value_rescale_inverse(h, eps), x, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(r2d2.value_rescale(r2d2.value_rescale_inverse(x, eps), eps), x)
    # h compresses: h(99) = sqrt(100) - 1 + eps * 99
    assert float(r2d2.value_rescale(tf.constant(99.0, tf.float64), 1e-3)) == pytest.approx(9.099)


def brute_force_targets(reward, terminated, mask, value, gamma, n):
    """Step by step: the largest k <= n whose step is real and not after a termination."""
    batch, steps = reward.shape
    target, has = np.zeros((batch, steps)), np.zeros((batch, steps), bool)
    for b in range(batch):
        for t in range(steps):
            if not mask[b, t]:
                continue
            ret = 0.0
            for k in range(n + 1):
                if t + k >= steps or not mask[b, t + k]:
                    break
                if k > 0:  # bootstrap from step t + k
                    target[b, t], has[b, t] = ret + gamma**k * value[b, t + k], True
                if k == n:
                    break
                ret += gamma**k * reward[b, t + k]
                if terminated[b, t + k]:
                    target[b, t], has[b, t] = ret, True
                    break
    return target, has


def test_n_step_targets_stop_at_terminations_and_window_ends():
    rng = np.random.default_rng(0)
    batch, steps = 64, 9
    reward = rng.normal(size=(batch, steps)).astype(np.float32)
    value = rng.normal(size=(batch, steps)).astype(np.float32)
    terminated = rng.random((batch, steps)) < 0.15
    ends = rng.integers(1, steps + 1, size=batch)  # real steps 0..end-1, as padded windows are
    mask = (np.arange(steps)[None] < ends[:, None]).astype(np.float32)
    terminated &= mask > 0
    for n in (1, 3, 5):
        got, has = r2d2.n_step_targets(reward, terminated, mask, value, 0.9, n)
        want, want_has = brute_force_targets(reward, terminated, mask, value, 0.9, n)
        np.testing.assert_array_equal(has.numpy(), want_has)
        np.testing.assert_allclose(got.numpy()[want_has], want[want_has], rtol=1e-5, atol=1e-6)
    # the last real step of a window that does not terminate has no target
    last = ends - 1
    open_end = ~terminated[np.arange(batch), last]
    assert not has.numpy()[np.arange(batch), last][open_end].any()


def test_sequence_priority_is_eta_max_plus_one_minus_eta_mean_of_the_steps_with_targets():
    abs_td = tf.constant([[1.0, 3.0, 2.0, 9.0], [4.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    has = tf.constant([[True, True, True, False], [True, True, False, False], [False] * 4])
    got = r2d2.mixed_priorities(abs_td, has, 0.9).numpy()
    first = 0.9 * 3.0 + 0.1 * 2.0  # step 3 has no target: its 9 counts nowhere
    second = 0.9 * 4.0 + 0.1 * 2.0
    np.testing.assert_allclose(got, [first, second, max(first, second)], rtol=1e-6)


def window_batch(agent, config, rng, batch=4):
    steps = config.sequence_length
    mask = np.ones((batch, steps), np.float32)
    mask[0, :1] = 0.0  # a burn-in that reaches before the episode start
    return {
        "obs": tf.constant(rng.normal(size=(batch, steps, 2)), tf.float32),
        "action": tf.constant(rng.integers(2, size=(batch, steps)), tf.int64),
        "reward": tf.ones((batch, steps)),
        "terminated": tf.zeros((batch, steps), tf.bool),
        "truncated": tf.zeros((batch, steps), tf.bool),
        r2d2.STATE: tf.constant(rng.normal(size=(batch, agent.q.state_size)), tf.float32),
        MASK: tf.constant(mask),
        IMPORTANCE_WEIGHTS: tf.ones([batch]),
    }


@pytest.mark.parametrize("burn_in", [0, 2])
def test_burn_in_steps_and_the_stored_state_carry_no_gradient(burn_in):
    config = dataclasses.replace(SMALL, burn_in=burn_in)
    agent = r2d2.R2D2(2, 2, config)
    agent.q.head.weights[0].assign(agent.q.head.weights[0] + 0.5)  # online != target
    batch = window_batch(agent, config, np.random.default_rng(1))
    with tf.GradientTape() as tape:
        tape.watch([batch["obs"], batch[r2d2.STATE]])
        loss = agent.loss(batch)["loss"]
    d_obs, d_state = tape.gradient(loss, [batch["obs"], batch[r2d2.STATE]])
    per_step = np.abs(d_obs.numpy()).sum(axis=(0, 2))
    # burn-in steps: none; the last step only bootstraps the others' targets (no gradient)
    assert (per_step[:burn_in] == 0).all() and (per_step[burn_in:-1] > 0).all()
    assert per_step[-1] == 0
    if burn_in:  # the trained steps start from the burned-in state, held constant
        assert d_state is None or not np.any(d_state.numpy())
    else:
        assert np.any(d_state.numpy())


def filled_table(config, episodes=(7, 12, 3, 20, 9)):
    env = gym.make(CARTPOLE_NO_VELOCITY)
    table = rg.ReplayTable(r2d2.table_spec(config, env), 64, "CPU")
    rng = np.random.default_rng(0)
    for length in episodes:
        step = np.arange(length)
        table.append(
            {
                "obs": rng.normal(size=(length, 2)).astype(np.float32),
                "action": rng.integers(2, size=length),
                "reward": np.ones(length, np.float32),
                "terminated": step == length - 1,
                "truncated": np.zeros(length, bool),
                r2d2.STATE: rng.normal(size=(length, 2 * config.lstm_units)).astype(np.float32),
                r2d2.STATE_STORED: step % config.period == 0,
            }
        )
    return env, table


def test_the_update_unrolls_inside_the_xla_loop_and_writes_sequence_priorities():
    env, table = filled_table(SMALL)
    agent = r2d2.make_agent(SMALL, env)
    sampler = r2d2.make_sampler(SMALL, table, agent)
    before = sampler.probabilities()
    learner = rg.Learner(table, sampler, agent.update, SMALL.batch_size, jit_compile=True)
    out = learner.train(SMALL.target_update_period + 1)
    assert out["steps"] == SMALL.target_update_period + 1
    assert np.isfinite(out["losses/td_loss"]) and out["losses/td_loss"] > 0
    after = sampler.probabilities()
    assert ((before > 0) == (after > 0)).all()  # rows without a stored state stay at 0
    assert len(np.unique(np.round(after[after > 0], 9))) > 2  # the update's priorities
    # the target synced in the graph at SGD step target_update_period, then the online net moved
    assert int(agent.updates.numpy()) == SMALL.target_update_period + 1
    diff = [np.abs(a - b).max() for a, b in zip(agent.q.weights, agent.target.weights, strict=True)]
    assert 0 < max(diff) < 0.1


def test_bad_settings_are_config_errors_that_name_the_argument():
    with pytest.raises(rg.ConfigError, match=r"^sequence_length: got 10, expected > burn_in"):
        R2D2Config(sequence_length=10, burn_in=10)
    with pytest.raises(rg.ConfigError, match=r"^period: got 21, expected <= the trained length"):
        R2D2Config(sequence_length=30, burn_in=10, period=21)
    env, table = filled_table(SMALL)
    wider = dataclasses.replace(SMALL, lstm_units=16)
    with pytest.raises(rg.ConfigError, match=r"^state_field 'recurrent_state': got float32\[16\]"):
        r2d2.make_sampler(SMALL, table, r2d2.make_agent(wider, env))
    spec = {k: v for k, v in table.spec.items() if k != r2d2.STATE}
    stateless = rg.ReplayTable(spec, 16, "CPU")
    with pytest.raises(rg.ConfigError, match=r"^state_field: table .* has no field"):
        r2d2.make_sampler(SMALL, stateless, r2d2.make_agent(SMALL, env))


class CueRecall(gym.Env):
    """A cue (+1 or -1) shown at the first step only; DELAY blank steps later the agent must
    answer with the cue's action (reward +1, else -1). Feed-forward: return 0 on average."""

    DELAY = 3
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue, self.t = int(self.np_random.integers(2)), 0
        return np.array([2.0 * self.cue - 1.0, 0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t <= self.DELAY:
            return np.array([0.0, float(self.t == self.DELAY)], np.float32), 0.0, False, False, {}
        reward = 1.0 if int(action) == self.cue else -1.0
        return np.zeros(2, np.float32), reward, True, False, {}


def test_a_recurrent_agent_learns_a_cue_recall_task_a_feed_forward_one_cannot():
    if "CueRecall-v0" not in gym.registry:
        gym.register("CueRecall-v0", entry_point=CueRecall)
    config = R2D2Config(
        env_id="CueRecall-v0",
        steps=3000,
        sequence_length=5,
        burn_in=1,
        period=4,  # episodes are 4 steps: states stored at their first step
        lstm_units=16,
        torso_size=16,
        batch_size=16,
        learning_starts=400,
        train_freq=100,
        gradient_steps=40,
        target_update_period=20,
        n_step=1,
        exploration_fraction=0.5,
        eval_episodes=40,
    )
    result = r2d2.train(config)
    assert result.eval_returns.mean() >= 0.9, result.eval_returns
    # the cue is gone at the answer step: a feed-forward DQN with the same budget guesses
    feed_forward = dqn.DQNConfig(
        env_id="CueRecall-v0",
        steps=3000,
        learning_starts=400,
        train_freq=100,
        gradient_steps=40,
        batch_size=64,
        hidden_sizes=(16, 16),
        exploration_fraction=0.5,
        eval_episodes=40,
    )
    assert dqn.train(feed_forward).eval_returns.mean() < 0.6


def _run(*args, timeout=300):
    proc = subprocess.run(
        [sys.executable, "-m", "replaygpu.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


SMALL_DEMO = [
    *("--steps", "400", "--learning-starts", "200", "--train-freq", "100"),
    *("--eval-every", "100", "--periodic-eval-episodes", "2"),  # at 100, 200, 300, 400
    *("--gradient-steps", "2", "--lstm-units", "8", "--torso-size", "8"),
    *("--sequence-length", "6", "--burn-in", "2", "--period", "2", "--eval-episodes", "1"),
]
MEAN = re.compile(r"over 1 episodes: mean return ([-\d.]+)")


def test_demo_r2d2_cartpole_runs_end_to_end_and_hands_back_its_best_weights(tmp_path):
    run_dir = tmp_path / "run"
    out = _run("demo", "r2d2-cartpole", "--seed", "3", "--run-dir", str(run_dir), *SMALL_DEMO)
    assert "greedy evaluation over 1 episodes: mean return" in out
    kept = re.search(r"the weights of env step (\d+), the best of 4 greedy evaluation", out)
    assert kept and int(kept.group(1)) in (100, 200, 300, 400), out
    assert (run_dir / "learning_curve.png").exists()
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(run_dir))
    replayed = _run("eval", str(run_dir), "--episodes", "2")
    assert f"greedy evaluation on {CARTPOLE_NO_VELOCITY} over 2 episodes" in replayed
    assert f"the weights of env step {kept.group(1)}, the best of 4" in replayed
    # the run's own evaluation (episode seed 3 + 10000) played the kept weights
    again = _run("eval", str(run_dir), "--episodes", "1", "--seed", "10003")
    assert MEAN.search(again).group(1) == MEAN.search(out).group(1)


def test_without_keep_best_r2d2_hands_back_its_final_weights(tmp_path):
    run_dir = tmp_path / "run"
    flags = ["--run-dir", str(run_dir), "--no-keep-best", *SMALL_DEMO]
    out = _run("demo", "r2d2-cartpole", "--seed", "3", *flags)
    assert "of the final weights" in out and "best of" not in out, out
    assert "of the final weights" in _run("eval", str(run_dir), "--episodes", "1")


def test_cartpole_no_velocity_shows_the_position_and_angle_of_cartpole_only():
    masked, full = gym.make(CARTPOLE_NO_VELOCITY), gym.make("CartPole-v1")
    obs, _ = masked.reset(seed=5)
    full_obs, _ = full.reset(seed=5)
    assert masked.observation_space.shape == (2,)
    for action in [0, 1, 1, 0, 1]:
        np.testing.assert_array_equal(obs, full_obs[[0, 2]])
        obs, *_ = masked.step(action)
        full_obs, *_ = full.step(action)
    # any agent's env helpers register the id (the actors and `demo cartpole --env-id` use them)
    code = (
        "from replaygpu.agents.envs import make_vector_env\n"
        f"print(make_vector_env({CARTPOLE_NO_VELOCITY!r}, 2, 0).single_observation_space.shape)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(2,)"


@pytest.mark.parametrize("masked", [False, True])
def test_the_loop_over_time_unrolls_as_the_static_unroll_does(masked):
    """`LSTMQNetwork(loop=True)` (XLA's path) gives the static unroll's Q-values, final state
    and gradients; masked steps (padding at both ends) carry the state over in both."""
    nets = [LSTMQNetwork(3, 2, torso=5, units=4, seed=0, loop=loop) for loop in (True, False)]
    obs = tf.random.stateless_normal([2, 7, 3], seed=[1, 2])
    state = tf.random.stateless_normal([2, 8], seed=[3, 4])
    mask = tf.constant([[0, 0, 1, 1, 1, 1, 0], [1] * 7], tf.float32) if masked else None

    def outputs(net, xla):
        @tf.function(jit_compile=xla, autograph=False)
        def run():
            with tf.GradientTape() as tape:
                q, final = net.unroll(obs, state, mask)
                total = tf.reduce_sum(q * q) + tf.reduce_sum(final)
            return [q, final, *tape.gradient(total, net.weights)]

        return [t.numpy() for t in run()]

    static = outputs(nets[1], xla=False)
    for xla in (False, True):
        for got, want in zip(outputs(nets[0], xla), static, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if masked:  # the first window's last step is padding: its final state is step 5's
        _, final = nets[1].unroll(obs[:1, :6], state[:1], mask[:1, :6])
        np.testing.assert_allclose(static[1][:1], final.numpy(), rtol=1e-6)


def test_online_and_target_unrolled_together_match_each_unrolled_alone():
    """`unroll_together` (one batched cell, gradients for the first network only) gives each
    network's own Q-values and final state, and the trained one's own gradients, under XLA."""
    nets = [LSTMQNetwork(3, 2, torso=5, units=4, seed=s, loop=True) for s in (0, 7)]
    obs = tf.random.stateless_normal([2, 6, 3], seed=[5, 6])
    states = [tf.random.stateless_normal([2, 8], seed=[s, 1]) for s in (1, 2)]
    mask = tf.constant([[0, 1, 1, 1, 1, 0], [1] * 6], tf.float32)

    @tf.function(jit_compile=True, autograph=False)
    def together():
        with tf.GradientTape() as tape:
            (q, q_target), finals = unroll_together(nets, obs, states, mask, trained=1)
            total = tf.reduce_sum(q * q) + tf.reduce_sum(finals[0]) + tf.reduce_sum(q_target)
        return [q, q_target, *finals, *tape.gradient(total, nets[0].weights)]

    @tf.function(jit_compile=True, autograph=False)
    def alone():
        with tf.GradientTape() as tape:
            q, final = nets[0].unroll(obs, states[0], mask)
            total = tf.reduce_sum(q * q) + tf.reduce_sum(final)
        q_target, final_target = nets[1].unroll(obs, states[1], mask)
        return [q, q_target, final, final_target, *tape.gradient(total, nets[0].weights)]

    for got, want in zip(together(), alone(), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_the_numpy_acting_policy_steps_as_the_network_unrolls():
    """`acting.RecurrentQPolicy` (the actors' numpy mirror, state carried from call to call)
    gives, step by step, the greedy actions of `LSTMQNetwork.unroll`'s Q-values and its final
    state, to 1e-5; `reset` starts again from the zero state."""
    net = LSTMQNetwork(3, 4, torso=5, units=6, seed=0, loop=True)
    obs = tf.random.stateless_normal([1, 9, 3], seed=[7, 8])
    q, final = net.unroll(obs, tf.zeros([1, net.state_size]))
    policy = RecurrentQPolicy(net.get_weights(), num_actions=4)
    for _ in range(2):  # the second pass after a reset repeats the first
        mirrored = []
        for t in range(9):
            before = policy.state.copy()
            q_t, _ = numpy_lstm_step(policy.weights, obs[:, t].numpy(), before)
            mirrored.append(q_t[0])
            assert policy(obs[:, t].numpy())[0] == int(np.argmax(q_t[0]))
        np.testing.assert_allclose(np.stack(mirrored), q[0].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(policy.state, final.numpy(), rtol=1e-5, atol=1e-6)
        policy.reset()
        assert not policy.state.any()
