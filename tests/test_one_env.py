"""`OneEnv` (make_vector_env with one env) steps exactly as gymnasium's SyncVectorEnv with
same-step autoreset: observations, rewards, flags and the final observation of each episode."""

import gymnasium as gym
import numpy as np
import pytest

from replaygpu.agents.envs import OneEnv, make_vector_env
from replaygpu.agents.rollouts import TransitionChunk, true_next_obs
from replaygpu.nest import flatten as flatten_nest
from replaygpu.specs import host_spec, specs_from_env

DICT_SPACE = gym.spaces.Dict(
    {
        "position": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
        "velocity": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
    }
)


def dict_cartpole():
    return gym.wrappers.TransformObservation(
        gym.make("CartPole-v1"),
        lambda obs: {"position": obs[[0, 2]], "velocity": obs[[1, 3]]},
        DICT_SPACE,
    )


def leaves(obs):
    return flatten_nest(obs) if isinstance(obs, dict) else {"": obs}


@pytest.mark.parametrize("make", [lambda: gym.make("CartPole-v1"), dict_cartpole])
def test_one_env_steps_as_sync_vector_env_with_same_step_autoreset(make):
    ours = OneEnv(make())
    theirs = gym.vector.SyncVectorEnv([make], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert ours.observation_space == theirs.observation_space
    assert ours.action_space == theirs.action_space
    a, info_a = ours.reset(seed=3)
    b, info_b = theirs.reset(seed=3)
    assert info_a.keys() == info_b.keys()
    actions = np.random.default_rng(0).integers(2, size=(600, 1))
    episodes = 0
    for action in actions:
        for k, v in leaves(a).items():
            np.testing.assert_array_equal(v, leaves(b)[k])
            assert v.dtype == leaves(b)[k].dtype and v.shape == leaves(b)[k].shape
        a, ra, ta, ua, ia = ours.step(action)
        b, rb, tb, ub, ib = theirs.step(action)
        np.testing.assert_array_equal(ra, rb)
        np.testing.assert_array_equal(ta, tb)
        np.testing.assert_array_equal(ua, ub)
        assert ra.dtype == rb.dtype and ta.dtype == tb.dtype
        assert ia.keys() == ib.keys()
        done = ta | ua
        if done[0]:
            episodes += 1
            mine, gyms = true_next_obs(a, done, ia), true_next_obs(b, done, ib)
            for k, v in leaves(mine).items():
                np.testing.assert_array_equal(v, leaves(gyms)[k])
    assert episodes >= 10  # random CartPole episodes last about 20 steps
    ours.close()
    theirs.close()


def test_make_vector_env_takes_one_env_for_one_and_a_chunk_holds_its_steps():
    env = make_vector_env("CartPole-v1", 1, seed=0)
    assert isinstance(env, OneEnv) and env.num_envs == 1
    assert not isinstance(make_vector_env("CartPole-v1", 2, seed=0), OneEnv)
    spec = specs_from_env(env)
    chunk = TransitionChunk(host_spec(spec), 64)
    obs, _ = env.reset(seed=0)
    for _ in range(64):
        action = np.zeros(1, np.int64)
        next_obs, reward, terminated, truncated, info = env.step(action)
        chunk.add_step(obs, action, reward, next_obs, terminated, truncated, info)
        obs = next_obs
    batch = chunk.take()
    assert batch["obs"].shape == (64, 4) and batch["terminated"].sum() >= 1
    # Within an episode each row's next_obs is the next row's obs.
    cont = ~(batch["terminated"][:-1] | batch["truncated"][:-1])
    np.testing.assert_array_equal(batch["next_obs"][:-1][cont], batch["obs"][1:][cont])
    env.close()


def test_one_env_passes_the_env_info_as_sync_vector_env_does():
    """Atari's info carries ``lives`` every step; the vector info holds it as ``[1]`` arrays."""
    pytest.importorskip("ale_py")
    from replaygpu.agents.envs import make_atari_env

    ours = OneEnv(make_atari_env("ALE/Breakout-v5", seed=0))
    theirs = gym.vector.SyncVectorEnv(
        [lambda: make_atari_env("ALE/Breakout-v5", seed=0)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    ours.reset(seed=1)
    theirs.reset(seed=1)
    for _ in range(20):
        a, _, _, _, ia = ours.step(np.array([3]))
        b, _, _, _, ib = theirs.step(np.array([3]))
        np.testing.assert_array_equal(a, b)
        assert ia.keys() == ib.keys() and "lives" in ia
        np.testing.assert_array_equal(ia["lives"], ib["lives"])
    ours.close()
    ours.close()  # a second close is a no-op
    theirs.close()


def test_chunk_add_step_writes_the_rows_add_writes_and_refuses_an_overflow():
    """add_step writes a flat spec's columns straight in; the rows are those of `add` with the
    casts it documents (float64 rewards rounded to float32, next_obs from final_obs)."""
    spec = host_spec(specs_from_env(make_vector_env("CartPole-v1", 2, seed=0)))
    fast, generic = TransitionChunk(spec, 6), TransitionChunk(spec, 6)
    rng = np.random.default_rng(0)
    for step in range(3):
        obs, next_obs = rng.normal(size=(2, 4)).astype(np.float32), rng.normal(size=(2, 4))
        next_obs = next_obs.astype(np.float32)
        actions, reward = rng.integers(2, size=2), rng.normal(size=2)  # float64, as envs give
        terminated, truncated = np.array([step == 1, False]), np.array([False, step == 2])
        done = terminated | truncated
        final = rng.normal(size=(2, 4)).astype(np.float32)
        info = {"final_obs": final, "_final_obs": done} if done.any() else {}
        fast.add_step(obs, actions, reward, next_obs, terminated, truncated, info)
        generic.add(
            obs=obs,
            action=actions.astype(np.int64),
            reward=reward.astype(np.float32),
            next_obs=true_next_obs(next_obs, done, info),
            terminated=terminated,
            truncated=truncated,
        )
    with pytest.raises(ValueError, match="chunk overflow: holds 6 of 6, adding 2"):
        fast.add_step(obs, actions, reward, next_obs, terminated, truncated, {})
    a, b = fast.take(), generic.take()
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
        assert a[name].dtype == b[name].dtype
    np.testing.assert_array_equal(a["next_obs"][5], final[1])  # step 2, env 1: its final_obs
