"""`replaygpu demo NAME`: train an agent on a gymnasium toy env with progress, TensorBoard, a plot;
`replaygpu eval RUN`: evaluate a saved run.

A demo is an algorithm plus preset hyperparameters (`registry.DEMOS`); its flags come from the
config, so ``replaygpu demo cartpole --help`` lists every hyperparameter with its meaning and
default. The algorithm module is imported once the flags are checked, so ``replaygpu --help``,
``replaygpu actor`` and a bad flag import no TensorFlow; `imports_frozen` keeps the garbage
collector off what the import builds.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import gc
import json
import math
import os
import sys
import time
from collections.abc import Iterator

from .registry import DEMOS, algorithm


@contextlib.contextmanager
def imports_frozen() -> Iterator[None]:
    """Import with the cyclic GC paused, then freeze what was built, and again at exit.

    TensorFlow's import builds about 360k Python objects, none garbage; full passes over them cost
    0.4 s during the import and 0.6 s at interpreter exit (`demo cartpole`, 2 cores). Frozen objects
    (`gc.freeze`) are left out of both; later objects are collected as usual, and finalizers still
    run at exit but for objects in reference cycles, which the commands here close explicitly. A
    process that imported TensorFlow before (a test session) is left as it is.
    """
    if "tensorflow" in sys.modules:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
        atexit.register(gc.freeze)  # once more just before the interpreter's last pass


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` and ``eval`` subcommands."""
    lines = "\n".join(f"  {name:14s} {demo.summary}" for name, demo in DEMOS.items())
    parser = subparsers.add_parser(
        "demo",
        help="train an agent on a gymnasium toy env (progress bar, TensorBoard, learning curve)",
        description=(
            "Train an agent, writing TensorBoard events and learning_curve.png into the run "
            f"folder, then print its greedy evaluation.\n\ndemos:\n{lines}\n\n"
            "Run `replaygpu demo NAME --help` for the flags of one demo (seed, steps, run "
            "folder and every hyperparameter)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", choices=list(DEMOS), help="which demo to run")
    parser.add_argument(
        "options",
        nargs=argparse.REMAINDER,
        help="flags of the demo (see replaygpu demo NAME --help)",
    )
    parser.set_defaults(func=run)

    parser = subparsers.add_parser(
        "eval",
        help="evaluate the greedy policy of a saved run (demo or learner)",
        description="Rebuild the networks of a run from its run.json, restore its newest "
        "checkpoint and play greedy episodes.",
    )
    parser.add_argument("path", help="run folder (with checkpoints/) or checkpoint folder")
    parser.add_argument("--episodes", type=int, default=20, help="episodes (default 20)")
    parser.add_argument("--seed", type=int, default=10_000, help="seed of the first episode")
    parser.set_defaults(func=run_eval)


def demo_parser(name: str) -> tuple[argparse.ArgumentParser, type]:
    """The flag parser of one demo and its config class (no TensorFlow imported)."""
    from replaygpu.cli import CommandParser

    from .configs import add_config_flags

    demo = DEMOS[name]
    config_cls = algorithm(demo.algorithm).config_class()
    parser = CommandParser(
        prog=f"replaygpu demo {name}",
        description=f"{demo.summary}. {(config_cls.__doc__ or '').strip()}",
    )
    parser.add_argument(
        "--run-dir",
        default=None,
        help="run folder for TensorBoard events, config.json and learning_curve.png "
        "(default: runs/NAME-sSEED-TIMESTAMP); rerun with the same --run-dir to resume, and "
        "with a larger --steps to continue a finished run",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="resume from and save checkpoints here (default: RUN_DIR/checkpoints)",
    )
    parser.add_argument(
        "--checkpoint-every-s",
        type=float,
        default=demo.checkpoint_every_s,
        help="seconds between checkpoints; SIGTERM and Ctrl-C save one too "
        f"(default: {demo.checkpoint_every_s:g})",
    )
    add_config_flags(parser, config_cls, config_cls(**demo.preset))
    return parser, config_cls


def run(args: argparse.Namespace) -> int:
    """Run (or resume) demo ``args.name`` with ``args.options``, checked before importing TF."""
    from .configs import config_from_args

    _require_demo_extras()
    parser, config_cls = demo_parser(args.name)
    opts = parser.parse_args(args.options)
    config = config_from_args(config_cls, opts, parser)
    demo = DEMOS[args.name]
    if demo.intra_op_threads is not None:  # read when TensorFlow starts its runtime
        os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(demo.intra_op_threads))
    with imports_frozen():
        from .runs import RunControl

        module = algorithm(demo.algorithm).load()
    # before any folder is made (ALE games: only here)
    type(config).ENV_CHECK(config.env_id).close()
    run_dir = opts.run_dir or os.path.join(
        "runs", f"{args.name}-s{config.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    checkpoint_dir = opts.checkpoint_dir or os.path.join(run_dir, "checkpoints")
    control = RunControl(checkpoint_dir, opts.checkpoint_every_s, config)
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(dataclasses.asdict(config), f, indent=2)

    from .progress import RunRecorder

    title = f"{args.name} ({config.env_id})"
    recorder = RunRecorder(run_dir, config.steps, title, control.resumed or (0, 0))
    try:
        with control:
            result = module.train(config, recorder, control)
    finally:
        recorder.bar.close()
    if result.stopped:
        recorder.close()
        print(
            f"{args.name}: stopped by {control.signal_name} at {result.env_steps} of "
            f"{config.steps} env steps ({result.sgd_steps} SGD steps); checkpoint in "
            f"{checkpoint_dir}. Resume: replaygpu demo {args.name} --run-dir {run_dir} "
            "(and the same flags)"
        )
        return 0
    resumed = control.resumed
    if resumed is not None and (result.env_steps, result.sgd_steps) == resumed:
        recorder.events.close()  # the learning curve of the processes before stays as it is
        print(
            f"{args.name}: nothing to do: the run finished at step {result.env_steps} "
            f"({result.sgd_steps} SGD steps); continue it with a larger --steps, or evaluate "
            f"it: replaygpu eval {run_dir}"
        )
        return 0
    curve = recorder.close(result.eval_returns, result.env_steps)
    returns = result.eval_returns
    print(
        f"{args.name}: {result.env_steps} env steps, {result.sgd_steps} SGD steps in "
        f"{result.train_seconds:.1f} s"
        + (f", resumed at step {resumed.env_steps}" if resumed else "")
        + f" ({_per_s(result.env_steps_per_s)} env steps/s, "
        f"{_per_s(result.sgd_steps_per_s)} SGD steps/s in training calls)"
    )
    print(
        f"greedy evaluation over {len(returns)} episodes: mean return {returns.mean():.1f} "
        f"(std {returns.std():.1f}, min {returns.min():.1f}, max {returns.max():.1f}) of "
        f"{result.evaluated}"
    )
    print(f"TensorBoard: tensorboard --logdir {run_dir}")
    print(f"learning curve: {curve}")
    print(f"evaluate again: replaygpu eval {run_dir} --episodes 20")
    return 0


def _per_s(rate: float) -> str:
    """A rate, or "n/a" where none was measured (a single, compiling training call)."""
    return f"{rate:.0f}" if math.isfinite(rate) else "n/a"


def _require_demo_extras() -> None:
    """The demos draw a progress bar and a learning curve: say how to install them."""
    import importlib.util

    import replaygpu as rg

    missing = [m for m in ("tqdm", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        raise rg.ConfigError(
            f"the demos need {' and '.join(missing)}, which are not installed; "
            'install them with: pip install "replaygpu[demos]"'
        )


def run_eval(args: argparse.Namespace) -> int:
    """Print ``args.path``'s newest checkpoint's greedy mean return, checked before TF loads."""
    import replaygpu as rg

    from .registry import read_run_file

    if args.episodes < 1:
        raise rg.ConfigError(f"--episodes: got {args.episodes}, expected >= 1")
    name, values, folder = read_run_file(args.path)
    entry = algorithm(name)
    with imports_frozen():
        import tensorflow as tf

        from .config_fields import BestOfEvaluations
        from .evaluation import load_kept
        from .progress import FINAL_WEIGHTS

        module = entry.load()
    config = entry.config_class()(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    )
    latest = tf.train.latest_checkpoint(folder)
    if latest is None:
        raise rg.ConfigError(f"{folder!r} holds a run.json but no checkpoint yet")
    env = type(config).ENV_CHECK(config.env_id)
    agent = module.make_agent(config, env)
    env.close()
    tf.train.Checkpoint(agent=agent).read(latest).expect_partial().assert_existing_objects_matched()
    evaluated = FINAL_WEIGHTS
    if isinstance(config, BestOfEvaluations):  # the weights the run handed back (keep_best)
        evaluated = load_kept(agent.q.weights, latest) or FINAL_WEIGHTS  # its Q-network acts
    returns = module.evaluate_agent(config, agent, args.episodes, seed=args.seed)
    # An ALE env in a reference cycle would outlive its finalizer at exit (`imports_frozen`) and
    # ale_py would print ~25 "nanobind: leaked" lines: collect the run's objects now.
    del env, agent
    gc.collect()
    print(
        f"{latest}: greedy evaluation on {config.env_id} over {len(returns)} episodes: mean "
        f"return {returns.mean():.1f} (std {returns.std():.1f}, min {returns.min():.1f}, "
        f"max {returns.max():.1f}) of {evaluated}"
    )
    return 0
