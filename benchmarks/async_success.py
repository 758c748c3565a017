"""Success rate of the asynchronous CartPole runs, two checkouts side by side (issue 34, item 5).

The deterministic demos are fingerprinted bit for bit (`fingerprint.py`); the asynchronous runs
cannot be, since what the learner trains on depends on when the actors' rows arrive. For them
this script compares how often they learn CartPole over the same seeds, before and after a
change. Two configs, each as a user runs it, from the checkout's own console script:

  apex-cartpole   ``replaygpu demo apex-cartpole --seed S --run-dir TMP`` (ApexConfig defaults:
                  2 actor processes, 80k env steps); its greedy evaluation is the printed
                  ``greedy evaluation over 20 episodes: mean return X`` line.
  learner-actor   ``replaygpu learner --agent dqn --env CartPole-v1 --seed S --address
                  127.0.0.1:0 --checkpoint-dir TMP`` and, once it prints the address it serves,
                  ``replaygpu actor ADDRESS --wait 120`` (the actors learn everything else from
                  the learner: 2 actors, 1 env each). The learner ends by itself at its
                  ``--steps`` budget (80k rows) and logs ``greedy evaluation at SGD step N:
                  return X +- Y over 20 episodes``; the actor command exits 0 when told that
                  the run is finished.
  r2d2-served     the same with ``--agent r2d2 --env CartPoleNoVelocity-v1`` (R2D2LearnerConfig
                  defaults: 100k rows, the steps each stored once, windows sampled in the graph).

Success: greedy evaluation mean >= 475 over the 20 episodes (CartPole-v1's reward threshold,
`benchmarks/agents.py`'s target; the demo itself prints no "solved"). The learner logs the
mean with one decimal, so a mean in [474.95, 475) counts there as a success.

Each checkout is ``LABEL=PATH[,PYTHON]``; PYTHON (default ``PATH/.venv/bin/python``) must import
``replaygpu`` from PATH (checked first), and the ``replaygpu`` script beside it runs the commands,
so each checkout's own code runs. The runs are interleaved so that machine load hits the
checkouts alike: per seed, each config, the checkouts in turn, their order reversed on odd seeds
(``before after``, then ``after before``). Children run with the caller's environment (thread
settings and all, as a user's run) less ``PYTHONPATH``, plus ``TF_CPP_MIN_LOG_LEVEL=2``, in a
temporary folder; run the script under ``nice`` to share the machine.

Prints one line per run and a summary (``config  checkout  successes/N  median eval``; against
the first checkout, a two-sided Fisher exact test of the success counts and a permutation test
of the mean evaluations; then the evaluation of each seed side by side), and writes every run to
``--out`` (JSON, rewritten after each run). With 10 seeds only large changes show: 5/10 against
1/10 successes gives p 0.14. The script needs only the standard library.

``--merge FILE`` takes runs recorded earlier (a half run alone, or an interrupted run: runs
already there are not repeated); the summary then says which checkouts were not run
interleaved. Run::

    BEFORE=before=/tmp/before/main,/tmp/before/venv/bin/python
    python benchmarks/async_success.py --checkout $BEFORE --checkout after=.   # interleaved
    python benchmarks/async_success.py --checkout $BEFORE \\
        --out benchmarks/results/async_success_before.json          # one half now ...
    python benchmarks/async_success.py --checkout after=. \\
        --merge benchmarks/results/async_success_before.json \\
        --out benchmarks/results/async_success.json                 # ... the other later
    python benchmarks/async_success.py --merge benchmarks/results/async_success.json  # print
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import logging
import math
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("async_success")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "benchmarks", "results", "async_success.json")
CONFIGS = ("apex-cartpole", "learner-actor", "r2d2-served")
#: greedy evaluation mean that counts as solving CartPole-v1 (its reward threshold)
SUCCESS = 475.0
ENV = "CartPole-v1"

_DEMO_EVAL = re.compile(
    r"greedy evaluation over (?P<n>\d+) episodes: mean return (?P<mean>[-\d.]+) "
    r"\(std (?P<std>[-\d.]+)"
)
_DEMO_STEPS = re.compile(r"^\S+: (?P<env>\d+) env steps, (?P<sgd>\d+) SGD steps", re.M)
_LEARNER_EVAL = re.compile(
    r"greedy evaluation at SGD step (?P<sgd>\d+): return (?P<mean>[-\d.]+) \+- "
    r"(?P<std>[-\d.]+) over (?P<n>\d+) episodes"
)
_LEARNER_DONE = re.compile(
    r"run finished: (?P<env>\d+) transitions inserted, SGD step (?P<sgd>\d+)"
)
_SERVING = re.compile(r"serving at (?P<address>\S+?);")


@dataclass(frozen=True)
class Checkout:
    """A checkout and the Python whose ``replaygpu`` imports from it."""

    label: str
    path: str
    python: str

    @property
    def command(self) -> list[str]:
        """The checkout's ``replaygpu`` (the console script beside its Python)."""
        script = os.path.join(os.path.dirname(self.python), "replaygpu")
        return [script] if os.path.exists(script) else [self.python, "-m", "replaygpu"]


def parse_checkout(text: str) -> Checkout:
    """``LABEL=PATH[,PYTHON]`` (argparse type)."""
    label, sep, rest = text.partition("=")
    if not sep or not label or not rest:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected LABEL=PATH[,PYTHON]")
    path, _, python = rest.partition(",")
    path = os.path.abspath(path)
    python = python or os.path.join(path, ".venv", "bin", "python")
    if not os.path.exists(python):
        raise argparse.ArgumentTypeError(f"{text}: no Python at {python}")
    return Checkout(label, path, os.path.abspath(python))


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def describe(checkout: Checkout, cwd: str) -> dict[str, Any]:
    """The checkout's commit, whether tracked files differ from it, and where its Python
    imports ``replaygpu`` from.

    Raises:
        SystemExit: that Python imports replaygpu from somewhere else.
    """
    done = subprocess.run(
        [checkout.python, "-c", "import replaygpu; print(replaygpu.__file__)"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=child_env(),
        check=False,
    )
    imported = done.stdout.strip()
    if done.returncode != 0 or not imported.startswith(checkout.path + os.sep):
        raise SystemExit(
            f"{checkout.label}: {checkout.python} imports replaygpu from {imported or '?'}, not "
            f"from {checkout.path}{os.linesep}{done.stderr[-2000:]}"
        )

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", checkout.path, *args], capture_output=True, text=True, check=False
        )
        return out.stdout.strip()

    changed = git("status", "--porcelain", "--untracked-files=no").splitlines()
    return {
        "path": checkout.path,
        "python": checkout.python,
        "replaygpu": imported,
        "commit": git("rev-parse", "HEAD"),
        "subject": git("log", "-1", "--format=%s")[:120],
        "changed_tracked_files": len(changed),
    }


def _kill(proc: subprocess.Popen) -> None:
    """End ``proc`` and its children if it is still running (it leads its own process
    group)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _start(command: list[str], log_path: str, cwd: str) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=child_env(),
            start_new_session=True,
        )


def _tail(path: str, chars: int = 3000) -> str:
    with open(path, errors="replace") as f:
        text = f.read()
    return re.sub(r"\r[^\n]*", "", text)[-chars:]  # progress bars' carriage-return redraws


def run_demo(checkout: Checkout, seed: int, folder: str, timeout_s: float) -> dict[str, Any]:
    """``replaygpu demo apex-cartpole --seed SEED``: its evaluation, steps and exit."""
    log = os.path.join(folder, "demo.log")
    command = [*checkout.command, "demo", "apex-cartpole", "--seed", str(seed)]
    command += ["--run-dir", os.path.join(folder, "run")]
    proc = _start(command, log, folder)
    try:
        returncode = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return {"error": f"timed out after {timeout_s:.0f} s", "log_tail": _tail(log)}
    text = _tail(log, 10**7)
    found, steps = _DEMO_EVAL.search(text), _DEMO_STEPS.search(text)
    if returncode != 0 or found is None:
        return {"error": f"exit status {returncode}, no evaluation line", "log_tail": text[-3000:]}
    result: dict[str, Any] = {
        "eval_mean": float(found["mean"]),
        "eval_std": float(found["std"]),
        "eval_episodes": int(found["n"]),
    }
    if steps is not None:
        result.update(env_steps=int(steps["env"]), sgd_steps=int(steps["sgd"]))
    return result


def run_learner_actor(
    checkout: Checkout,
    seed: int,
    folder: str,
    timeout_s: float,
    agent: str = "dqn",
    env: str = ENV,
) -> dict[str, Any]:
    """``replaygpu learner`` (``agent`` on ``env``) plus ``replaygpu actor`` at its address."""
    learner_log, actor_log = os.path.join(folder, "learner.log"), os.path.join(folder, "actor.log")
    command = [*checkout.command, "learner", "--agent", agent, "--env", env, "--seed", str(seed)]
    command += ["--address", "127.0.0.1:0", "--checkpoint-dir", os.path.join(folder, "ckpt")]
    deadline = time.monotonic() + timeout_s
    learner = _start(command, learner_log, folder)
    actor = None
    try:
        address = None
        while address is None and learner.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            found = _SERVING.search(_tail(learner_log, 10**7))
            address = found["address"] if found else None
        if address is None:
            why = "timed out" if learner.poll() is None else f"exit status {learner.returncode}"
            return {"error": f"learner never served ({why})", "log_tail": _tail(learner_log)}
        actor = _start([*checkout.command, "actor", address, "--wait", "120"], actor_log, folder)
        try:
            returncode = learner.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f} s", "log_tail": _tail(learner_log)}
        try:
            actor_rc = actor.wait(60)
        except subprocess.TimeoutExpired:
            actor_rc = None  # killed below; the run's figures still count
    finally:
        _kill(learner)
        if actor is not None:
            _kill(actor)
    text = _tail(learner_log, 10**7)
    found, done = _LEARNER_EVAL.search(text), _LEARNER_DONE.search(text)
    if returncode != 0 or found is None:
        return {"error": f"learner exit status {returncode}, no evaluation line", "log_tail": text}
    result: dict[str, Any] = {
        "eval_mean": float(found["mean"]),
        "eval_std": float(found["std"]),
        "eval_episodes": int(found["n"]),
        "sgd_steps": int(found["sgd"]),
        "actor_exit": actor_rc,
    }
    if done is not None:
        result["env_steps"] = int(done["env"])
    if actor_rc != 0:
        result["actor_log_tail"] = _tail(actor_log)
    return result


RUNNERS = {
    "apex-cartpole": run_demo,
    "learner-actor": run_learner_actor,
    "r2d2-served": functools.partial(run_learner_actor, agent="r2d2", env="CartPoleNoVelocity-v1"),
}


def run_one(
    checkout: Checkout, config: str, seed: int, timeout_s: float, keep: str | None
) -> dict[str, Any]:
    """One run of ``config`` at ``seed`` with ``checkout``, in a fresh folder."""
    load = os.getloadavg()[0]
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"async-{checkout.label}-{config}-s{seed}-") as tmp:
        result = RUNNERS[config](checkout, seed, tmp, timeout_s)
        if keep:
            os.makedirs(keep, exist_ok=True)
            for name in ("demo.log", "learner.log", "actor.log"):
                if os.path.exists(os.path.join(tmp, name)):
                    target = os.path.join(keep, f"{checkout.label}-{config}-s{seed}-{name}")
                    with open(target, "w") as f:
                        f.write(_tail(os.path.join(tmp, name), 10**8))
    record = {
        "checkout": checkout.label,
        "config": config,
        "seed": seed,
        "wall_s": round(time.perf_counter() - began, 1),
        "load_1min": round(load, 2),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        **result,
    }
    if "eval_mean" in record:
        record["success"] = record["eval_mean"] >= SUCCESS
    return record


def run_line(run: dict[str, Any]) -> str:
    head = f"{run['config']:<14} {run['checkout']:<8} seed {run['seed']:>2}: "
    if "eval_mean" not in run:
        return head + f"FAILED ({run.get('error')}) | wall {run['wall_s']:.1f} s"
    steps = f"{run.get('env_steps', '?')} env steps, {run.get('sgd_steps', '?')} SGD steps"
    actor = "" if run.get("actor_exit", 0) == 0 else f" | actor exit {run['actor_exit']}"
    return (
        head + f"greedy eval mean {run['eval_mean']:6.1f} (std {run['eval_std']:.1f}) "
        f"{'success' if run['success'] else 'no     '} | wall {run['wall_s']:.1f} s | {steps} | "
        f"load {run['load_1min']:.2f}{actor}"
    )


def fisher_p(wins_a: int, n_a: int, wins_b: int, n_b: int) -> float:
    """Two-sided Fisher exact test: how likely success counts this far apart (or further) are
    when both checkouts succeed equally often."""
    wins, n = wins_a + wins_b, n_a + n_b

    def chance(x: int) -> float:
        return math.comb(n_a, x) * math.comb(n_b, wins - x) / math.comb(n, wins)

    seen = chance(wins_a)
    xs = range(max(0, wins - n_b), min(wins, n_a) + 1)
    return min(1.0, sum(chance(x) for x in xs if chance(x) <= seen * (1 + 1e-9)))


def permutation_p(a: Sequence[float], b: Sequence[float], draws: int = 200_000) -> float:
    """Two-sided permutation test of the difference of mean evaluations: every split of the
    pooled runs into groups of these sizes (``draws`` random ones, seeded, when there are more)."""
    pooled, total = [*a, *b], sum(a) + sum(b)
    seen = abs(sum(a) / len(a) - sum(b) / len(b)) - 1e-9

    def differs(first: Sequence[float]) -> bool:
        rest = (total - sum(first)) / len(b)
        return abs(sum(first) / len(a) - rest) >= seen

    if math.comb(len(pooled), len(a)) <= draws:
        splits = list(itertools.combinations(pooled, len(a)))
        return sum(map(differs, splits)) / len(splits)
    rng = random.Random(0)
    return sum(differs(rng.sample(pooled, len(a))) for _ in range(draws)) / draws


def summary(document: dict[str, Any]) -> str:
    """The summary table, the per-seed table and a note on halves not run interleaved."""
    runs = document["runs"]
    labels = list(dict.fromkeys(r["checkout"] for r in runs))
    configs = [c for c in CONFIGS if any(r["config"] == c for r in runs)]
    lines = [
        f"{'config':<14} {'checkout':<8} {'successes/N':>11} {'median eval':>11} "
        f"{'mean eval':>9} {'failed':>6} {'median wall s':>13}  commit"
    ]
    for config in configs:
        for label in labels:
            mine = [r for r in runs if r["config"] == config and r["checkout"] == label]
            if not mine:
                continue
            evals = [r["eval_mean"] for r in mine if "eval_mean" in r]
            wins = sum(bool(r.get("success")) for r in mine)
            commit = document["checkouts"].get(label, {}).get("commit", "?")[:9]
            median = f"{statistics.median(evals):.1f}" if evals else "-"
            mean = f"{statistics.fmean(evals):.1f}" if evals else "-"
            lines.append(
                f"{config:<14} {label:<8} {f'{wins}/{len(mine)}':>11} {median:>11} {mean:>9} "
                f"{len(mine) - len(evals):>6} "
                f"{statistics.median(r['wall_s'] for r in mine):>13.1f}  {commit}"
            )
    if len(labels) >= 2:
        first = labels[0]
        lines += ["", f"against {first} (two-sided; small p: the checkouts differ):"]
        for config in configs:
            evals = {
                label: [
                    r["eval_mean"]
                    for r in runs
                    if r["config"] == config and r["checkout"] == label and "eval_mean" in r
                ]
                for label in labels
            }
            for other in labels[1:]:
                a, b = evals[first], evals[other]
                if not a or not b:
                    continue
                wins_a, wins_b = sum(x >= SUCCESS for x in a), sum(x >= SUCCESS for x in b)
                lines.append(
                    f"{config:<14} {other:<8} successes {wins_b}/{len(b)} vs {wins_a}/{len(a)}: "
                    f"Fisher exact p {fisher_p(wins_a, len(a), wins_b, len(b)):.2f}; mean eval "
                    f"{statistics.fmean(b):.1f} vs {statistics.fmean(a):.1f}: permutation p "
                    f"{permutation_p(a, b):.2f}"
                )
    columns = [(c, label) for c in configs for label in labels]
    seeds = sorted({r["seed"] for r in runs})
    lines += ["", "greedy eval mean per seed (* >= 475, x failed):"]
    lines.append("seed  " + "  ".join(f"{f'{c} {label}':>22}" for c, label in columns))
    by_key = {(r["config"], r["checkout"], r["seed"]): r for r in runs}
    for seed in seeds:
        cells = []
        for config, label in columns:
            run = by_key.get((config, label, seed))
            if run is None:
                cells.append(f"{'':>22}")
            elif "eval_mean" not in run:
                cells.append(f"{'x':>22}")
            else:
                cells.append(f"{run['eval_mean']:>21.1f}{'*' if run['success'] else ' '}")
        lines.append(f"{seed:>4}  " + "  ".join(cells))
    sessions = {label: {r["session"] for r in runs if r["checkout"] == label} for label in labels}
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            if not sessions[a] & sessions[b]:
                lines.append(
                    f"note: {a} and {b} were run in separate invocations, not interleaved: "
                    "machine load may differ between the halves"
                )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkout",
        type=parse_checkout,
        action="append",
        default=[],
        metavar="LABEL=PATH[,PYTHON]",
        help="a checkout to run (repeat: the runs interleave); PYTHON defaults to "
        "PATH/.venv/bin/python",
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=list(range(10)), help="default: 0 to 9"
    )
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument(
        "--merge",
        action="append",
        default=[],
        metavar="FILE",
        help="runs recorded earlier (by this script) to include; runs already there (same "
        "checkout label, config and seed, with an evaluation) are not repeated",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON written after each run")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    parser.add_argument("--keep-logs", help="copy each run's logs into this folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    labels = [c.label for c in args.checkout]
    if len(set(labels)) != len(labels):
        parser.error(f"--checkout labels must differ, got {labels}")
    if not args.checkout and not args.merge:
        parser.error("nothing to do: pass --checkout, --merge or both")

    document: dict[str, Any] = {"checkouts": {}, "runs": []}
    for path in args.merge:
        with open(path) as f:
            earlier = json.load(f)
        document["checkouts"].update(earlier["checkouts"])
        document["runs"] += earlier["runs"]
    session = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    done = {(r["checkout"], r["config"], r["seed"]) for r in document["runs"] if "eval_mean" in r}
    document["runs"] = [
        r for r in document["runs"] if "eval_mean" in r or r["checkout"] not in labels
    ]  # a failed run of a checkout run now is run again

    with tempfile.TemporaryDirectory(prefix="async-success-") as tmp:
        for checkout in args.checkout:
            described = describe(checkout, tmp)
            earlier = document["checkouts"].get(checkout.label)
            if earlier and earlier["commit"] != described["commit"]:
                raise SystemExit(
                    f"{checkout.label}: {args.merge} recorded commit {earlier['commit']}, the "
                    f"checkout is at {described['commit']}; use another label"
                )
            document["checkouts"][checkout.label] = described
            logger.info(
                "%s: %s at %s (%d tracked files changed), replaygpu from %s",
                checkout.label,
                checkout.path,
                described["commit"][:9],
                described["changed_tracked_files"],
                described["replaygpu"],
            )
    document.update(
        machine=f"{platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or '?'}",
        success_threshold=SUCCESS,
    )

    plan = []
    for n, seed in enumerate(args.seeds):
        order = args.checkout if n % 2 == 0 else args.checkout[::-1]
        for config in args.configs:
            plan += [(c, config, seed) for c in order if (c.label, config, seed) not in done]
    if plan:
        logger.info("%d runs to do, %d recorded already", len(plan), len(done))
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for i, (checkout, config, seed) in enumerate(plan, 1):
        logger.info("run %d/%d: %s %s seed %d", i, len(plan), checkout.label, config, seed)
        run = run_one(checkout, config, seed, args.timeout_s, args.keep_logs)
        run["session"] = session
        print(run_line(run), flush=True)
        document["runs"].append(run)
        with open(args.out + ".tmp", "w") as f:
            json.dump(document, f, indent=1)
        os.replace(args.out + ".tmp", args.out)

    print()
    for run in sorted(document["runs"], key=lambda r: (r["config"], r["seed"], r["checkout"])):
        print(run_line(run))
    print()
    print(summary(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
