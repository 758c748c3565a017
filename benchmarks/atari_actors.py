"""Atari env steps/s of ``replaygpu actor`` against the demo's actors, side by side (issue 33).

One ``replaygpu learner --agent dqn --env ALE/Breakout-v5`` on 127.0.0.1 that only stores
(``--learning-starts`` out of reach: no SGD competes for the CPU), then one after the other, for
``--seconds`` each, two actors against it:

- ``replaygpu actor ADDRESS --num-actors 2``, as an operator starts it (settings from the
  learner), stopped with Ctrl-C; its rate is what each actor process logs at its end;
- the actor processes of ``demo apex-breakout`` (`fleet.ActorFleet` with the demo's
  `ApexAtariConfig.actor_config`); their rate is what each reports at its end;
- the same processes started without the actors' thread settings (`actor_threads`), as
  ``replaygpu actor`` started them before: what one BLAS thread pool per actor costs here.

Each rate is one actor's env steps over its loop's seconds (env resets and weight pulls
included), summed over the two actors. Run::

    python benchmarks/atari_actors.py              # 40 s each
    python benchmarks/atari_actors.py --seconds 20
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replaygpu.agents.actor_threads import ACTOR_THREAD_ENV

ENV_ID = "ALE/Breakout-v5"
ACTORS = 2
#: ``actor I: N env steps in S s (R/s)``, each actor's last line
DONE_LINE = re.compile(r"actor (\d+): (\d+) env steps in ([0-9.]+) s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "replaygpu", *args]


def start_learner(address: str, log: Path) -> subprocess.Popen:
    """A learner that stores what actors send and never trains; returns once it serves."""
    flags = (
        "--agent", "dqn", "--env", ENV_ID, "--address", address, "--steps", "200000000",
        "--learning-starts", "100000000", "--buffer-size", "50000", "--num-actors", str(ACTORS),
    )  # fmt: skip
    proc = subprocess.Popen(
        command("learner", *flags),
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    deadline = time.monotonic() + 300
    while "serving at" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the learner did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    return proc


def cli_actors(address: str, seconds: float, log: Path) -> list[float]:
    """``replaygpu actor ADDRESS --num-actors 2`` for ``seconds``, then Ctrl-C; each actor's
    env steps/s."""
    proc = subprocess.Popen(
        command("actor", address, "--num-actors", str(ACTORS)),
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        start_new_session=True,
    )
    time.sleep(seconds)
    os.killpg(proc.pid, signal.SIGINT)
    if proc.wait(60) != 0:
        raise SystemExit(f"replaygpu actor failed:\n{log.read_text()[-3000:]}")
    rates = {int(i): int(steps) / float(s) for i, steps, s in DONE_LINE.findall(log.read_text())}
    return [rates[i] for i in sorted(rates)]


def demo_actors(address: str, seconds: float, thread_settings: bool) -> list[float]:
    """The demo's actor processes (`ActorFleet`) for ``seconds``; each one's env steps/s.
    ``thread_settings=False`` starts them without `actor_threads`."""
    from replaygpu.agents.apex_atari_config import ApexAtariConfig
    from replaygpu.agents.fleet import ActorFleet
    from replaygpu.agents.progress import NullRecorder

    config = ApexAtariConfig(env_id=ENV_ID, num_actors=ACTORS)
    configs = [config.actor_config(i, 0, config.seed) for i in range(ACTORS)]
    fleet = ActorFleet(configs, address, NullRecorder(), name="bench-actor")
    if thread_settings:
        fleet.start()
    else:
        for proc in fleet.processes:  # as `replaygpu actor` started them before issue 33
            proc.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        fleet.drain()
        time.sleep(0.2)
    fleet.stop(lambda: None)  # the learner commits by itself
    fleet.raise_failed()
    return [fleet.stats[i]["env_steps_per_s"] for i in sorted(fleet.stats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="per kind of actor")
    args = parser.parse_args()
    for name in ACTOR_THREAD_ENV:  # what the actors get comes from the launchers alone
        os.environ.pop(name, None)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    folder = Path(tempfile.mkdtemp(prefix="atari-actors-"))
    address = f"127.0.0.1:{free_port()}"
    learner = start_learner(address, folder / "learner.log")
    try:
        rows = [
            ("replaygpu actor", cli_actors(address, args.seconds, folder / "actor.log")),
            ("demo apex-breakout actors", demo_actors(address, args.seconds, True)),
            ("without thread settings", demo_actors(address, args.seconds, False)),
        ]
    finally:
        learner.send_signal(signal.SIGTERM)
        learner.wait(120)
    print(f"{ENV_ID}, {ACTORS} actors, {args.seconds:g} s each, {os.cpu_count()} CPUs ({folder})")
    print(f"{'actors':<28} {'env steps/s (sum)':>18}  per actor")
    for name, rates in rows:
        each = ", ".join(f"{r:.0f}" for r in rates)
        print(f"{name:<28} {sum(rates):>18.0f}  {each}")
    cli, demo = sum(rows[0][1]), sum(rows[1][1])
    print(f"replaygpu actor / demo actors: {cli / demo:.2f}")


if __name__ == "__main__":
    main()
