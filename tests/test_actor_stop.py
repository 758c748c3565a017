"""A fleet stops cleanly in any order, with real processes on 127.0.0.1: ``replaygpu actor``
stopped by Ctrl-C or SIGTERM exits 0 within 5 s whatever its learner's state, in one line saying
what was left unacknowledged; a learner (``replaygpu serve``, ``replaygpu learner``) stopped
first tells its actors, which exit 0 at once; one that crashes and comes back is ridden out."""

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from process_helpers import ENV, cli
from service_helpers import free_port

import replaygpu as rg
from replaygpu.agents.distributed.fleet import ACTOR_THREAD_ENV
from replaygpu.service.config import ClientConfig
from replaygpu.service.wire.status import ServiceError


@contextlib.contextmanager
def started(args, log_path, group=False):
    """``replaygpu ARGS`` with its stderr in ``log_path`` (``group``: in a process group of
    its own, which a terminal's Ctrl-C reaches as a whole); killed at the end if still running,
    with its whole group."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cli(*args), stdout=subprocess.DEVNULL, stderr=log, env=ENV, start_new_session=group
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                os.kill(proc.pid, signal.SIGCONT)  # a frozen one, to be killed
                proc.kill()
        proc.wait(30)


def serve(address, log_path):
    """A ``replaygpu serve`` of CartPole transitions at ``address``, once it serves."""
    args = ("serve", "--env", "CartPole-v1", "--capacity", "200000", "--address", address)
    return started(args, log_path)


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.1)


def process_state(pid):
    """The state letter of process ``pid`` (``T``: stopped by a signal), as ``ps`` shows it."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def inserted(address):
    """Rows the server at ``address`` inserted (-1: it does not answer yet)."""
    try:
        client = rg.ReplayClient(
            address, actor_id="probe", config=ClientConfig(retry_deadline_s=0.5)
        )
    except ServiceError:
        return -1
    try:
        return client.info().tables[0].inserted
    finally:
        client.close(flush=False)


def actors(address, log_path, *flags):
    """``replaygpu actor ADDRESS`` of CartPole in a process group of its own."""
    return started(("actor", address, "--env", "CartPole-v1", *flags), log_path, group=True)


def exit_after(proc, sig, group=False):
    """Send ``sig`` (to ``proc``'s whole group: a terminal's Ctrl-C); its exit status and
    seconds to exit."""
    began = time.monotonic()
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    return proc.wait(60), time.monotonic() - began


def one_stop_line(log):
    """The one line that says what was left unacknowledged (and no traceback)."""
    assert "Traceback" not in log, log[-3000:]
    lines = [line for line in log.splitlines() if "unacknowledged" in line]
    assert len(lines) == 1, log[-3000:]
    return lines[0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_actors_stopped_first_exit_0_within_5_s_in_one_line(tmp_path, sig):
    """Ctrl-C reaches the whole process group, SIGTERM (docker, Kubernetes) the command alone:
    either way the actor processes flush, the command exits 0 within 5 s with one line, and
    the learner stopped after them exits 0. The actor processes ran with the thread settings
    of every actor process."""
    address = f"127.0.0.1:{free_port()}"
    with (
        serve(address, tmp_path / "serve.log") as server,
        actors(address, tmp_path / "actors.log", "--num-actors", "2", "--wait") as proc,
    ):
        wait_for(lambda: inserted(address) > 2000, 120, "rows from the actors")
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        environs = [Path(f"/proc/{pid}/environ").read_text().split("\0") for pid in children]
        actor_envs = [env for env in environs if "OMP_NUM_THREADS=1" in env]
        assert len(actor_envs) == 2, environs  # (and multiprocessing's resource tracker)
        for env in actor_envs:
            assert {f"{k}={v}" for k, v in ACTOR_THREAD_ENV.items()} <= set(env)
        rc, took = exit_after(proc, sig, group=sig == signal.SIGINT)
        log = (tmp_path / "actors.log").read_text()
        assert rc == 0 and took < 5.0, (rc, took, log[-3000:])
        line = one_stop_line(log)
        name = signal.Signals(sig).name
        found = re.search(
            rf"stopped by {name}: (\d+) env steps, (\d+) transitions acknowledged", line
        )
        assert found and int(found.group(2)) > 2000, line
        assert len(re.findall(r"actor \d: \d+ env steps in", log)) == 2, log[-3000:]
        assert exit_after(server, signal.SIGTERM)[0] == 0
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def test_a_learner_stopped_first_ends_its_actors_with_exit_0_at_once(tmp_path):
    """Ctrl-C of ``replaygpu serve`` stops it for good: it tells each open stream, and the
    actors exit 0 within seconds, logging no outage."""
    address = f"127.0.0.1:{free_port()}"
    with (
        serve(address, tmp_path / "serve.log") as server,
        actors(address, tmp_path / "actors.log", "--num-actors", "2", "--wait") as proc,
    ):
        wait_for(lambda: inserted(address) > 2000, 120, "rows from the actors")
        assert exit_after(server, signal.SIGINT)[0] == 0
        began = time.monotonic()
        assert proc.wait(60) == 0
        took = time.monotonic() - began
    log = (tmp_path / "actors.log").read_text()
    assert took < 5.0, (took, log[-3000:])
    assert log.count("the learner's run is finished; stopping") == 2, log[-3000:]
    assert "unavailable" not in log and "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize("state", ["killed", "frozen"])
def test_ctrl_c_stops_actors_whose_learner_is_down_within_5_s(tmp_path, state):
    """A learner killed with SIGKILL (it may restart: the actor retries) or frozen (SIGSTOP: it
    accepts connections and answers nothing): Ctrl-C still ends the actor command within
    5 s, exit 0, in one line, no traceback."""
    address = f"127.0.0.1:{free_port()}"
    with (
        serve(address, tmp_path / "serve.log") as server,
        actors(address, tmp_path / "actors.log", "--weight-pull-interval", "20", "--wait") as proc,
    ):
        wait_for(lambda: inserted(address) > 2000, 120, "rows from the actor")
        server.send_signal(signal.SIGKILL if state == "killed" else signal.SIGSTOP)
        if state == "killed":  # retrying
            log_path = tmp_path / "actors.log"
            wait_for(lambda: "unavailable (" in log_path.read_text(), 60, "the actor retrying")
        else:  # frozen: then its calls go unanswered for 2 s (nothing to see: none times out)
            wait_for(lambda: process_state(server.pid) == "T", 30, "the server frozen")
            time.sleep(2.0)
        rc, took = exit_after(proc, signal.SIGINT, group=True)
        log = (tmp_path / "actors.log").read_text()
        assert rc == 0 and took < 5.0, (rc, took, log[-3000:])
        assert "stopped by SIGINT: " in one_stop_line(log)
        if state == "killed":
            assert log.count("unavailable (") == 1, log[-3000:]


@pytest.mark.parametrize("stop", ["killed", "sigterm"])
def test_an_actor_rides_out_a_learner_restart_then_stops_on_sigterm(tmp_path, stop):
    """A learner killed, or stopped with SIGTERM as an orchestrator restarts it, and started
    again on its address: one line when the outage begins, one when it ends, rows into the new
    learner; then SIGTERM stops the actor in one line."""
    address = f"127.0.0.1:{free_port()}"
    with actors(address, tmp_path / "actors.log", "--weight-pull-interval", "20", "--wait") as proc:
        with serve(address, tmp_path / "serve-1.log") as first:
            wait_for(lambda: inserted(address) > 2000, 120, "rows into the first learner")
            if stop == "killed":
                first.kill()
            else:
                first.send_signal(signal.SIGTERM)
            first.wait(30)
        began = rf"server {address} unavailable \("  # the actor noticed: now it retries
        log_path = tmp_path / "actors.log"
        wait_for(lambda: re.search(began, log_path.read_text()), 60, "the outage's line")
        with serve(address, tmp_path / "serve-2.log") as second:
            wait_for(lambda: inserted(address) > 2000, 120, "rows into the restarted learner")
            rc, took = exit_after(proc, signal.SIGTERM)
            assert exit_after(second, signal.SIGTERM)[0] == 0
    log = (tmp_path / "actors.log").read_text()
    assert rc == 0 and took < 5.0, (rc, took, log[-3000:])
    assert len(re.findall(rf"server {address} unavailable \(", log)) == 1, log[-3000:]
    assert len(re.findall(rf"server {address} available again after", log)) == 1, log[-3000:]
    assert "stopped by SIGTERM" in one_stop_line(log)


def test_ctrl_c_of_a_learner_ends_its_actors_with_exit_0(tmp_path):
    """The order of issue 33: ``replaygpu learner --steps 0`` and ``replaygpu actor --wait``,
    Ctrl-C the learner first. It stops for good; its actors exit 0 within seconds (they took
    21 s and a traceback to stop before, or 60 s and exit 2 left alone)."""
    address = f"127.0.0.1:{free_port()}"
    learner = (
        "learner", "--agent", "dqn", "--env", "CartPole-v1", "--address", address,
        "--steps", "0", "--learning-starts", "500", "--batch-size", "32",
        "--steps-per-call", "16", "--hidden-sizes", "16,16", "--no-jit-compile",
    )  # fmt: skip
    with (
        started(learner, tmp_path / "learner.log") as server,
        started(("actor", address, "--wait"), tmp_path / "actors.log", group=True) as proc,
    ):
        wait_for(lambda: inserted(address) > 2000, 180, "rows from the actors")
        assert exit_after(server, signal.SIGINT)[0] == 0
        began = time.monotonic()
        rc = proc.wait(60)
        took = time.monotonic() - began
    log = (tmp_path / "actors.log").read_text()
    assert rc == 0 and took < 5.0, (rc, took, log[-3000:])
    assert log.count("the learner's run is finished; stopping") >= 1, log[-3000:]
    assert "Traceback" not in log and "failed" not in log, log[-3000:]
    assert "Traceback" not in (tmp_path / "learner.log").read_text()
