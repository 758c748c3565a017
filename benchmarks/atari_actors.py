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

Both kinds run the same actor config: the demo's is built from the learner's actor settings,
which ``replaygpu actor`` takes over (send interval and insert slack included). Each rate is one
actor's env steps over its loop's seconds (env resets and weight pulls included), summed over
the two actors. On a shared machine the load drifts within a minute, so one pair of runs can
differ by 1.7x either way: ``--rounds R`` alternates the two kinds R times (the first one
swapped each round) and compares their medians. Run::

    python benchmarks/atari_actors.py                         # 40 s each, 1 round
    python benchmarks/atari_actors.py --seconds 30 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replaygpu.agents.distributed.fleet import ACTOR_THREAD_ENV

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
    from replaygpu.agents.distributed.fleet import ActorFleet, actor_configs
    from replaygpu.agents.dqn.config import ApexAtariConfig
    from replaygpu.agents.progress import NullRecorder

    config = ApexAtariConfig(env_id=ENV_ID, num_actors=ACTORS)
    configs = actor_configs(config, config.actor_settings, steps=0)  # steps 0: until stopped
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
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs of each kind, alternated (default 1)"
    )
    args = parser.parse_args()
    for name in ACTOR_THREAD_ENV:  # what the actors get comes from the launchers alone
        os.environ.pop(name, None)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    folder = Path(tempfile.mkdtemp(prefix="atari-actors-"))
    address = f"127.0.0.1:{free_port()}"
    learner = start_learner(address, folder / "learner.log")
    try:
        kinds = {
            "replaygpu actor": lambda: cli_actors(address, args.seconds, folder / "actor.log"),
            "demo apex-breakout actors": lambda: demo_actors(address, args.seconds, True),
        }
        runs: dict[str, list[list[float]]] = {name: [] for name in kinds}
        for round_ in range(args.rounds):
            for name in list(kinds)[:: -1 if round_ % 2 else 1]:
                runs[name].append(kinds[name]())
        bare = demo_actors(address, args.seconds, False)
    finally:
        learner.send_signal(signal.SIGTERM)
        learner.wait(120)
    print(
        f"{ENV_ID}, {ACTORS} actors, {args.seconds:g} s each, {args.rounds} round(s), "
        f"{os.cpu_count()} CPUs ({folder})"
    )
    print(f"{'actors':<28} {'env steps/s (sum)':>18}  per round (per actor)")
    medians = {}
    for name, rates in [*runs.items(), ("without thread settings", [bare])]:
        medians[name] = statistics.median(sum(r) for r in rates)
        each = ", ".join(f"{sum(r):.0f} ({'+'.join(f'{x:.0f}' for x in r)})" for r in rates)
        print(f"{name:<28} {medians[name]:>18.0f}  {each}")
    cli, demo = medians["replaygpu actor"], medians["demo apex-breakout actors"]
    print(f"replaygpu actor / demo actors (medians): {cli / demo:.2f}")


if __name__ == "__main__":
    main()
