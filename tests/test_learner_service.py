"""`replaygpu learner` and `replaygpu actor ADDRESS`: the actors learn everything from the
learner, the counts are exact, and a learner stopped with SIGTERM resumes from its checkpoint."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf
from process_helpers import ENV, cli, reap, wait_for_line
from service_helpers import free_port

import replaygpu as rg
from replaygpu.agents.distributed.actor import run_actor
from replaygpu.agents.distributed.actor_config import ActorConfig
from replaygpu.agents.distributed.learner import LearnerService
from replaygpu.agents.dqn.config import ApexConfig
from replaygpu.agents.runs import RunControl
from replaygpu.agents.sac.config import SACLearnerConfig
from replaygpu.errors import CheckpointMismatchError


def final_checkpoint(learner: subprocess.Popen, lines: list[str]) -> re.Match:
    """The learner exited 0 with a final checkpoint after SGD steps; its log line's match."""
    assert learner.returncode == 0, "".join(lines)[-3000:]
    final = re.search(r"final checkpoint \S+ \(SGD step (\d+)\)", "".join(lines))
    assert final and int(final.group(1)) > 0
    return final


#: a 3000-step DQN learner on CartPole small enough for a test (no XLA compile)
SMALL_DQN = (
    "--steps", "3000", "--learning-starts", "500", "--samples-per-insert", "2",
    "--batch-size", "32", "--steps-per-call", "16", "--hidden-sizes", "32,32", "--no-jit-compile",
)  # fmt: skip


def test_learner_and_actors_with_only_the_address_then_resume(tmp_path):
    port = free_port()
    address = f"127.0.0.1:{port}"
    ckpt = str(tmp_path / "ckpt")
    learner_cmd = cli(
        "learner", "--agent", "dqn", "--env", "CartPole-v1", "--address", address,
        "--checkpoint-dir", ckpt, *SMALL_DQN,
    )  # fmt: skip
    learner = subprocess.Popen(learner_cmd, stderr=subprocess.PIPE, text=True, env=ENV)
    lines: list[str] = []
    try:
        wait_for_line(learner, r"serving at", lines)
        actors = subprocess.run(
            cli("actor", address, "--steps", "1500"),  # the fleet size comes from the learner
            capture_output=True,
            text=True,
            timeout=300,
            env=ENV,
        )
        assert actors.returncode == 0, actors.stderr[-3000:]
        # the actors took the env and exploration from the learner: two actors, 1500 steps each
        assert len(re.findall(r"actor \d: 1500 env steps", actors.stderr)) == 2, actors.stderr
        # the learner ends by itself once its replay budget is spent, with a final checkpoint
        _, rest = learner.communicate(timeout=300)
        lines.append(rest)
    finally:
        reap(learner)
    final = final_checkpoint(learner, lines)

    # Restart: the table, ledger and learner come back; SIGTERM writes one more checkpoint.
    learner = subprocess.Popen(learner_cmd, stderr=subprocess.PIPE, text=True, env=ENV)
    lines = []
    try:
        resumed = wait_for_line(learner, r"(\d+) transitions inserted, SGD step (\d+)", lines)
        assert resumed.group(1) == "3000" and resumed.group(2) == final.group(1)
        wait_for_line(learner, r"serving at", lines)
        with rg.ReplayClient(address, actor_id="probe") as client:
            info = client.info()
        assert info.tables[0].size == 3000
        assert info.actors == 2  # the ledger was restored: the actors' resent batches are dropped
        assert (info.actor_settings.agent, info.actor_settings.version) == ("dqn", 1)
        settings = json.loads(info.actor_settings.json)  # the agent's own document
        assert (settings["env_id"], settings["agent"], settings["num_actors"]) == (
            "CartPole-v1",
            "dqn",
            2,
        )
        learner.send_signal(signal.SIGTERM)
        _, rest = learner.communicate(timeout=120)
    finally:
        reap(learner)
    assert learner.returncode == 0
    assert "final checkpoint" in rest


def test_sac_learner_trains_on_a_sac_actor_in_process(tmp_path):
    config = SACLearnerConfig(
        steps=600,
        learning_starts=100,
        batch_size=32,
        steps_per_call=8,
        samples_per_insert=4.0,
        hidden_sizes=(16, 16),
        jit_compile=False,
    )
    service = LearnerService(config)
    try:
        assert service.actor_settings.agent == "sac"
        actor = ActorConfig.from_settings(
            service.actor_settings, num_actors=1, steps=600, send_interval=8
        )
        assert (actor.env_id, actor.agent) == ("Pendulum-v1", "sac")
        errors: list[BaseException] = []

        def act() -> None:
            try:
                run_actor(actor, service.address)
            except BaseException as err:  # reported below
                errors.append(err)

        thread = threading.Thread(target=act)
        thread.start()
        ran = 1
        while thread.is_alive() or not service.done(ran):
            ran = service.step(idle_wait_s=0.1)
        thread.join()
        assert not errors
        assert service.table.total_inserted == 600
        actions = service.table.gather(tf.range(600, dtype=tf.int64))["action"].numpy()
        assert np.all(np.abs(actions) <= 2.0) and actions.std() > 0.1  # Pendulum's Box(-2, 2)
        assert service.sgd_steps > 0
    finally:
        service.close()


def test_dqn_learner_over_two_devices_shards_streams_and_resumes(tmp_path):
    # conftest split the CPU into /cpu:0 and /cpu:1; each actor env is a stream, and stream ids
    # modulo 2 pick the shard, so one actor with 2 envs fills both shards
    config = ApexConfig(
        steps=1200,
        learning_starts=200,
        batch_size=32,
        steps_per_call=8,
        samples_per_insert=2.0,
        hidden_sizes=(16, 16),
        buffer_size=2000,
        prioritized=True,
        devices="/cpu:0,/cpu:1",
    )
    run = RunControl(str(tmp_path / "ckpt"), 3600, config)
    service = LearnerService(config, run=run)
    try:
        assert isinstance(service.table, rg.ShardedReplayTable)
        actor = ActorConfig.from_settings(
            service.actor_settings, num_actors=1, steps=1200, num_envs=2
        )
        thread = threading.Thread(target=run_actor, args=(actor, service.address))
        thread.start()  # the learner commits its appends in service.step, on this thread
        ran = 1
        while thread.is_alive() or not service.done(ran):
            ran = service.step(idle_wait_s=0.1)
        thread.join()
        assert service.table.total_inserted == 1200 and service.table.shard_sizes == [600, 600]
        assert service.sgd_steps > 0
        q = service.agent.q.weights[0].value  # the tf.Variable behind the Keras one: mirrored
        copies = [v.numpy() for v in service.table.strategy.experimental_local_results(q)]
        np.testing.assert_array_equal(copies[0], copies[1])  # the replicas stayed in step
    finally:
        saved = service.close()
    assert saved
    steps = service.sgd_steps

    again = LearnerService(config, run=RunControl(str(tmp_path / "ckpt"), 3600, config))
    try:
        assert again.table.shard_sizes == [600, 600] and again.sgd_steps == steps
    finally:
        again.close(save=False)

    one_device = dataclasses.replace(config, devices="/cpu:0")
    with pytest.raises(CheckpointMismatchError, match=r"holds 2 shards .* has 1"):
        LearnerService(one_device, run=RunControl(str(tmp_path / "ckpt"), 3600, one_device))


def test_a_frame_learner_serves_an_atari_game_to_an_actor_with_only_the_address(tmp_path):
    """`replaygpu learner --agent dqn --env ALE/...` serves a frame table (prioritized frame
    stacks, the Nature CNN); `replaygpu actor ADDRESS` learns the game and the frame settings
    from Info, the learner trains on its segments and ends by itself with a checkpoint."""
    pytest.importorskip("ale_py")
    address = f"127.0.0.1:{free_port()}"
    learner_cmd = cli(
        "learner", "--agent", "dqn", "--env", "ALE/Breakout-v5", "--address", address,
        "--checkpoint-dir", str(tmp_path / "ckpt"), "--steps", "400", "--num-actors", "1",
        "--buffer-size", "2000", "--learning-starts", "200", "--batch-size", "8",
        "--samples-per-insert", "1", "--steps-per-call", "4", "--segment-steps", "100",
        "--target-update-interval", "8", "--jit-compile", "off",
    )  # fmt: skip
    learner = subprocess.Popen(learner_cmd, stderr=subprocess.PIPE, text=True, env=ENV)
    lines: list[str] = []
    try:
        wait_for_line(learner, r"serving at", lines)
        with rg.ReplayClient(address, actor_id="probe") as client:
            settings = ActorConfig.from_settings(client.actor_settings)
            spec = client.info().tables[0]
        assert (settings.env_id, settings.frame_stack, settings.segment_steps) == (
            "ALE/Breakout-v5",
            4,
            100,
        )
        assert {f.name for f in spec.spec} >= {"frame", "first", "final"}
        actor = subprocess.run(
            cli("actor", address, "--steps", "400"), capture_output=True, text=True, timeout=300
        )
        assert actor.returncode == 0, actor.stderr[-3000:]
        assert "actor 0: 400 env steps" in actor.stderr, actor.stderr[-3000:]
        _, rest = learner.communicate(timeout=300)
        lines.append(rest)
    finally:
        reap(learner)
    final_checkpoint(learner, lines)


def test_a_learner_budget_ends_the_learner_and_actors_that_have_no_budget_of_their_own(tmp_path):
    """`replaygpu learner --steps N` and `replaygpu actor ADDRESS --num-actors 2` (which would
    collect forever): the learner takes N rows (and less than a batch more), tells the actors,
    trains out its budget, evaluates, checkpoints; all exit 0. TensorBoard has the episodes the
    actors reported over the wire. Its greedy evaluations while training (every 1000 env steps,
    and the final weights) pick the weights it hands back, which `replaygpu eval` plays."""
    address = f"127.0.0.1:{free_port()}"
    ckpt = str(tmp_path / "ckpt")
    learner_cmd = cli(
        "learner", "--agent", "dqn", "--env", "CartPole-v1", "--address", address,
        "--checkpoint-dir", ckpt, *SMALL_DQN, "--eval-episodes", "2", "--eval-every", "1000",
        "--periodic-eval-episodes", "2", "--summary-every-s", "0",
    )  # fmt: skip
    learner = subprocess.Popen(learner_cmd, stderr=subprocess.PIPE, text=True, env=ENV)
    lines: list[str] = []
    try:
        wait_for_line(learner, r"serving at", lines)
        actors = subprocess.run(
            cli("actor", address, "--num-actors", "2"),
            capture_output=True,
            text=True,
            timeout=300,
            env=ENV,
        )
        assert actors.returncode == 0, actors.stderr[-3000:]
        _, rest = learner.communicate(timeout=300)
        lines.append(rest)
    finally:
        reap(learner)
    final_checkpoint(learner, lines)
    log = "".join(lines)
    finished = re.search(
        r"run finished: (\d+) transitions inserted, SGD step \d+ \(budget 3000 rows; the "
        r"batch that reached it: (\d+) rows\)",
        log,
    )
    assert finished, log[-3000:]
    inserted, last_batch = int(finished.group(1)), int(finished.group(2))
    assert last_batch > 0 and inserted - last_batch < 3000 <= inserted  # that batch, no more
    final_eval = re.search(
        r"greedy evaluation at SGD step \d+: return ([\d.]+) \+- [\d.]+ over 2 episodes "
        r"\((the weights of env step \d+, the best of (\d+) greedy evaluations during training "
        r"\(mean return ([\d.]+) there\))\)",
        log,
    )
    assert final_eval, log[-3000:]
    events = [name for name in os.listdir(ckpt) if name.startswith("events.out.tfevents")]
    scalars = [
        (value.tag, event.step, float(tf.make_ndarray(value.tensor)))
        for name in events
        for event in tf.compat.v1.train.summary_iterator(os.path.join(ckpt, name))
        for value in event.summary.value
    ]
    tags = {tag for tag, _, _ in scalars}
    assert {"losses/td_loss", "charts/episodic_return", "eval/mean_return"} <= tags, tags
    periodic = [(step, value) for tag, step, value in scalars if tag == "eval/periodic_return"]
    # one evaluation per 1000 env steps crossed once training runs, and one of the final weights
    assert len(periodic) == int(final_eval.group(3)) >= 2, periodic
    assert float(final_eval.group(4)) == pytest.approx(max(v for _, v in periodic), abs=0.05)
    # `replaygpu eval` plays the kept weights: on the evaluations' seeds (the learner's seed 1
    # + 30000), their mean return again
    out = subprocess.run(
        cli("eval", ckpt, "--episodes", "2", "--seed", "30001"),
        capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert final_eval.group(2) in out.stdout
    assert f"mean return {float(final_eval.group(4)):.1f}" in out.stdout, out.stdout


def test_a_served_run_plays_its_best_weights_only_inside_handed_back(tmp_path):
    """`LearnerService.handed_back`: the kept best weights in the policy inside, the final ones
    again after (the final checkpoint and a resumed run go on from those); the final ones inside
    where no evaluation kept any."""
    service = LearnerService(STORING_APEX)
    try:
        variables = service.agent.q.weights
        final = [v.numpy() for v in variables]
        with service.handed_back() as evaluated:
            assert evaluated == "the final weights"
            assert all(np.array_equal(v.numpy(), f) for v, f in zip(variables, final, strict=True))
        better = [f + 1.0 for f in final]
        service.best.consider(1234, np.array([500.0]), better)
        with service.handed_back() as evaluated:
            assert evaluated.startswith("the weights of env step 1234")
            inside = [v.numpy() for v in variables]
        assert all(np.array_equal(a, b) for a, b in zip(inside, better, strict=True))
        assert all(np.array_equal(v.numpy(), f) for v, f in zip(variables, final, strict=True))
    finally:
        service.close(save=False)


def zero_rows(client: rg.ReplayClient, n: int) -> dict[str, np.ndarray]:
    """``n`` rows of the client's table spec, all zeros."""
    return {name: np.zeros((n, *shape), dtype) for name, (dtype, shape) in client.spec.items()}


def append_and_report(address: str, actor_id: str, rows: int, returns: list[float]) -> None:
    """Append ``rows`` rows and report an episode of each of ``returns``; wait for the acks."""
    with rg.ReplayClient(address, actor_id=actor_id) as client:
        for episode_return in returns:
            client.report_episode(episode_return, 10)
        client.add_batch(zero_rows(client, rows))
        client.flush(timeout=120)
        assert client.acked_transitions == rows


def learner_info(address: str):
    with rg.ReplayClient(address, actor_id="probe") as client:
        return client.info()


def test_a_learner_with_a_journal_keeps_every_acked_row_through_kill_9(tmp_path):
    """`replaygpu learner --journal-dir`: rows acknowledged after the last checkpoint come back
    from the journal when a learner killed with SIGKILL restarts over the same folders, and the
    episodes reported with them count again (the checkpoint holds those reported before it)."""
    address = f"127.0.0.1:{free_port()}"
    learner_cmd = cli(
        "learner", "--agent", "dqn", "--env", "CartPole-v1", "--address", address,
        "--checkpoint-dir", str(tmp_path / "ckpt"), "--journal-dir", str(tmp_path / "journal"),
        "--checkpoint-every-s", "3600", *SMALL_DQN,
    )  # fmt: skip

    def start() -> tuple[subprocess.Popen, list[str]]:
        learner = subprocess.Popen(learner_cmd, stderr=subprocess.PIPE, text=True, env=ENV)
        lines: list[str] = []
        wait_for_line(learner, r"serving at", lines)
        return learner, lines

    learner, lines = start()
    try:  # 400 rows and 3 episodes, then SIGTERM: the final checkpoint holds them
        append_and_report(address, "a", 400, [10.0, 20.0, 30.0])
        learner.send_signal(signal.SIGTERM)
        _, rest = learner.communicate(timeout=120)
        assert learner.returncode == 0 and "final checkpoint" in rest, "".join(lines) + rest
    finally:
        reap(learner)

    learner, lines = start()
    try:  # 300 rows and 2 episodes acknowledged after the checkpoint, then kill -9
        assert learner_info(address).tables[0].size == 400
        append_and_report(address, "b", 300, [40.0, 50.0])
        learner.send_signal(signal.SIGKILL)
        learner.wait(timeout=60)
    finally:
        reap(learner)

    learner, lines = start()
    try:
        info = learner_info(address)
        assert (info.tables[0].size, info.tables[0].inserted) == (700, 700)
        assert info.learner_stats.episodes == 5
        assert info.learner_stats.mean_return == pytest.approx(30.0)
        learner.send_signal(signal.SIGTERM)
        learner.communicate(timeout=120)
    finally:
        reap(learner)
    assert re.search(r"journal \S+: \d+ records read, 300 transitions not in", "".join(lines))


#: a learner that only stores (100 rows per `served` call stay below learning_starts)
STORING_APEX = ApexConfig(
    steps=4000, learning_starts=2000, batch_size=32, steps_per_call=8, hidden_sizes=(16, 16)
)


def served(folder, returns: list[float], actor_id: str):
    """A `LearnerService` over checkpoint ``folder`` takes 100 rows and the episodes of
    ``returns`` from an actor, then closes with its final checkpoint; it and its Info's
    learner_stats."""
    run = RunControl(str(folder), 3600, STORING_APEX)
    service = LearnerService(STORING_APEX, run=run)
    try:
        with ThreadPoolExecutor(1) as pool:
            actor = pool.submit(append_and_report, service.address, actor_id, 100, returns)
            while not actor.done():  # the learner commits the appends in service.step
                service.step(idle_wait_s=0.05)
            actor.result()
        return service, learner_info(service.address).learner_stats
    finally:
        service.close()


def test_the_learners_episode_figures_continue_after_a_restart_from_its_checkpoint(tmp_path):
    """The episodes actors reported before a checkpoint still count after a restart from it:
    Info's learner_stats (what `replaygpu info` prints) goes on from them."""
    _, first = served(tmp_path / "ckpt", [1.0, 2.0, 3.0], "a")
    assert (first.episodes, first.recent_episodes, first.mean_return) == (3, 3, 2.0)
    _, again = served(tmp_path / "ckpt", [10.0], "b")  # from the checkpoint close() wrote
    assert (again.episodes, again.recent_episodes, again.mean_return) == (4, 4, 4.0)
