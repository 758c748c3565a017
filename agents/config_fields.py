"""The groups of fields that the agents' frozen configs compose, each field, its help and check
declared once, without TensorFlow.

A config lists its groups as bases, the most general last (`Run`, first in the flags), and
declares only its own fields; another default goes through `defaults` (``defaults(Replay,
batch_size=64)``: type, help and place stay), another help or type is the field declared again.
A group built on another (`ApeX` on `Run`) carries its defaults; one that replaces another's
fields without being built on it (`AtariGame`) comes before it in the bases. Checks run base
first: each group's ``__post_init__`` after those before it, a config's after all its groups'.

| group | fields |
| --- | --- |
| `Run` | env_id, seed, steps, eval_episodes (checked by each config: their rules differ) |
| `BestOfEvaluations` | eval_every, periodic_eval_episodes, keep_best (DQN's and R2D2's loops) |
| `LearningRate`, `DecayedLearningRate` | learning_rate; final_learning_rate |
| `Replay`, `FrameReplay` | batch_size, buffer_size, learning_starts, gamma |
| `TrainingCalls` | train_freq, gradient_steps (of a single-process loop) |
| `VectorEnvs`, `Mlp` | num_envs; hidden_sizes |
| `LinearEpsilon` | exploration_fraction, exploration_initial_eps, exploration_final_eps |
| `ClippedGradients`, `Prioritized` | max_grad_norm; prioritized, priority_alpha, priority_beta |
| `AtariGame` | env_id, eval_episodes (over `Run`'s), frame_stack, ..., eval_epsilon |
| `Served`, `ApeX` | num_actors, weight_pull_interval, samples_per_insert, steps_per_call, address |
| `UntilStopped` | none: a served demo's ``steps`` 0 runs until stopped |
| `ActorEnvs`, `DataParallel` | actor_envs; devices (of a learner) |
| `Device` | jit_compile, device |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import replaygpu as rg

from .configs import require, require_positive, require_positive_ints, require_unit_interval

if TYPE_CHECKING:
    from replaygpu.samplers import LinearSchedule

G = TypeVar("G")


def option(default: Any, help: str) -> Any:
    """A field with a default and a flag's help: ``gamma: float = option(0.99, "discount")``."""
    return field(default=default, metadata={"help": help})


def defaults(group: type[G], **values: Any) -> type[G]:
    """``group`` with other defaults for the fields in ``values`` (type, help and place stay).
    Raises TypeError when a name in ``values`` is not a field of ``group``."""
    known = {f.name: f for f in dataclasses.fields(group)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise TypeError(f"{group.__name__} has no fields {unknown}; it has {sorted(known)}")
    namespace: dict[str, Any] = {
        "__module__": group.__module__,  # its string annotations resolve where group's do
        "__qualname__": group.__qualname__,
        "__annotations__": {name: known[name].type for name in values},
    }
    for name, value in values.items():
        namespace[name] = field(default=value, metadata=known[name].metadata)
    return dataclass(frozen=True)(type(group.__name__, (group,), namespace))


@dataclass(frozen=True)
class Group:
    """The root of the groups: their ``__post_init__`` checks chain through it."""

    def __post_init__(self) -> None:
        """Nothing to check: the groups' checks call it last (`super`)."""


@dataclass(frozen=True)
class Run(Group):
    """What the run is on, how long it lasts and how it is judged."""

    #: set by each config: makes its env and checks it has the actions its agent takes (the CLI,
    #: before TensorFlow; an ALE game's, `envs.atari_env`, in the demo before any folder)
    ENV_CHECK: ClassVar[Callable[[str], Any]]
    env_id: str = option("CartPole-v1", "gymnasium env id (Discrete actions)")
    seed: int = option(1, "seed of env, networks, sampling, exploration")
    steps: int = option(
        50_000,
        "env steps to train for, exactly (the last chunk is shorter, with SGD steps in "
        "proportion); rerun a finished run with a larger value to continue it (its schedules "
        "follow the new length)",
    )
    eval_episodes: int = option(20, "greedy evaluation episodes")


@dataclass(frozen=True)
class BestOfEvaluations(Group):
    """Greedy evaluations while training, and the best one's weights handed back
    (`evaluation.BestPolicy`)."""

    eval_every: int = option(
        5000,
        "env steps between greedy evaluations while training (TensorBoard "
        "eval/periodic_return); 0: none",
    )
    periodic_eval_episodes: int = option(
        10, "episodes of each evaluation while training (same seeds)"
    )
    keep_best: bool = option(
        True,
        "hand back the weights of the best evaluation while training, the final weights "
        "included (rl-zoo3's best model): the run's evaluation and replaygpu eval play "
        "them; no: the final weights",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self, ["eval_every"], lambda v: v >= 0, ">= 0 (0: no evaluation while training)")
        require_positive_ints(self, "periodic_eval_episodes")


@dataclass(frozen=True)
class LearningRate(Group):
    """Adam's constant step size."""

    learning_rate: float = option(1e-4, "Adam step size")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "learning_rate")


@dataclass(frozen=True)
class DecayedLearningRate(LearningRate):
    """Adam's step size, linear from ``learning_rate`` to ``final_learning_rate`` over the run's
    ``total_sgd_steps``, then constant; constant ``learning_rate`` when ``final_learning_rate``
    is None or ``steps`` 0. The floor is > 0, so SGD steps past the end (a last call, a resumed
    run) still learn."""

    learning_rate: float = option(2e-3, "Adam step size at the start")
    final_learning_rate: float | None = option(
        None,
        "Adam step size at the end, > 0: linear decay over the run's SGD steps, then constant; "
        "none: a constant learning_rate",
    )

    @property
    def total_sgd_steps(self) -> int:
        """The SGD steps of the whole run, over which the rate decays."""
        raise NotImplementedError

    def __post_init__(self) -> None:
        """Raise `ConfigError` unless ``0 < final_learning_rate <= learning_rate`` (or None)."""
        super().__post_init__()
        if self.final_learning_rate is None:
            return
        if not 0.0 < self.final_learning_rate <= self.learning_rate:
            why = (
                "a learner never trains at rate 0"
                if self.final_learning_rate <= 0.0
                else "the rate decays, it does not grow"
            )
            raise rg.ConfigError(
                f"final_learning_rate: got {self.final_learning_rate}, expected in "
                f"(0, learning_rate={self.learning_rate}]: {why}; "
                "pass --final-learning-rate, e.g. learning_rate / 100"
            )

    @property
    def learning_rate_schedule(self) -> LinearSchedule | float:
        """The step size (evaluated in the graph at every SGD step), or a constant."""
        if not self.steps or self.final_learning_rate is None:
            return self.learning_rate
        from replaygpu.samplers import LinearSchedule  # TensorFlow: only learners ask

        return LinearSchedule(self.learning_rate, self.final_learning_rate, self.total_sgd_steps)


@dataclass(frozen=True)
class Replay(Group):
    """The replay table and the minibatches drawn from it."""

    batch_size: int = option(32, "minibatch size of each SGD step")
    buffer_size: int = option(100_000, "replay table capacity")
    learning_starts: int = option(1000, "env steps before training")
    gamma: float = option(0.99, "discount factor")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive_ints(self, "batch_size", "buffer_size")
        require(self, ["learning_starts"], lambda v: v >= 0, ">= 0")
        require_unit_interval(self, "gamma")


@dataclass(frozen=True)
class TrainingCalls(Group):
    """A single-process loop's training calls (`configs.next_chunk`)."""

    train_freq: int = option(4, "env steps between training calls")
    gradient_steps: int = option(1, "SGD steps per training call")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive_ints(self, "train_freq", "gradient_steps")

    @property
    def steps_to_train(self) -> int:
        """The least ``steps`` that trains (`configs.require_trains`): a training call follows
        each chunk that ends past ``learning_starts`` (`configs.training_calls`)."""
        return self.learning_starts + 1


@dataclass(frozen=True)
class VectorEnvs(Group):
    """The envs a single-process loop steps together."""

    num_envs: int = option(1, "envs stepped together (one policy call)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive_ints(self, "num_envs")


@dataclass(frozen=True)
class Mlp(Group):
    """The widths of an MLP agent's layers."""

    hidden_sizes: tuple[int, ...] = option((256, 256), "MLP widths")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self, ["hidden_sizes"], lambda v: v and min(v) >= 1, "positive widths like 256,256")


@dataclass(frozen=True)
class LinearEpsilon(Group):
    """The exploration rate, decayed linearly over a fraction of the run's ``steps`` (`Run`)."""

    exploration_fraction: float = option(0.1, "fraction of the run over which epsilon decays")
    exploration_initial_eps: float = option(1.0, "epsilon at the start")
    exploration_final_eps: float = option(0.01, "epsilon after decay")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_unit_interval(self, "exploration_initial_eps", "exploration_final_eps")

    def require_fraction_in_unit_interval(self) -> None:
        """Raise `ConfigError` unless ``exploration_fraction`` is in (0, 1] (DQN; R2D2: > 0)."""
        require(self, ["exploration_fraction"], lambda v: 0.0 < v <= 1.0, "in (0, 1]")

    def epsilon(self, env_steps: int) -> float:
        """Linearly decayed exploration rate after ``env_steps`` env steps."""
        progress = min(1.0, env_steps / (self.exploration_fraction * self.steps))
        start, end = self.exploration_initial_eps, self.exploration_final_eps
        return start + progress * (end - start)


@dataclass(frozen=True)
class ClippedGradients(Group):
    """The global norm each gradient is clipped to."""

    max_grad_norm: float = option(10.0, "gradient clipping global norm")


@dataclass(frozen=True)
class Prioritized(Group):
    """Prioritized replay's switch and exponents."""

    prioritized: bool = option(
        False, "prioritized replay over the frame table (Nature: no; Ape-X: yes)"
    )
    priority_alpha: float = option(0.6, "priority exponent")
    priority_beta: float = option(0.4, "importance-weight exponent")


@dataclass(frozen=True)
class FrameReplay(Replay):
    """A replay table of Atari frames (`replaygpu.frames`)."""

    buffer_size: int = option(100_000, "frame-table rows (1e6: 7.07 GB of uint8 frames)")


@dataclass(frozen=True)
class AtariGame(Group):
    """How an ALE game is played, trained on and evaluated (`envs.atari_env`); its env_id and
    eval_episodes replace `Run`'s, so it comes before `Run` and any group built on it."""

    env_id: str = option("ALE/Breakout-v5", "ALE game id")
    eval_episodes: int = option(5, "evaluation games after training")
    frame_stack: int = option(4, "frames per observation stack")
    repeat_action_probability: float = option(
        0.25, "sticky actions of ALE v5 (Machado et al. 2018)"
    )
    terminal_on_life_loss: bool = option(
        True, "training marks a lost life terminal (game plays on)"
    )
    clip_rewards: bool = option(True, "train on sign(reward)")
    eval_epsilon: float = option(0.05, "epsilon of the evaluation policy (Nature: 0.05)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive_ints(self, "frame_stack")
        require_unit_interval(self, "repeat_action_probability", "eval_epsilon")


@dataclass(frozen=True)
class Served(Group):
    """A learner served to remote actors under a samples-per-insert rate limit."""

    num_actors: int = option(2, "actor processes (demo) / fleet size")
    weight_pull_interval: int = option(256, "actor env steps between weight pulls")
    samples_per_insert: float = option(32.0, "rate limit: sampled rows per inserted row")
    steps_per_call: int = option(64, "SGD steps per Learner.train call")
    address: str = option("127.0.0.1:0", "where the learner serves")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive_ints(self, "num_actors", "weight_pull_interval", "steps_per_call")
        require_positive(self, "samples_per_insert")

    @property
    def steps_to_train(self) -> int:
        """The least ``steps`` that trains: the rate limiter samples at ``learning_starts`` rows."""
        return max(1, self.learning_starts)


@dataclass(frozen=True)
class UntilStopped(Group):
    """A demo's config served (first in the bases): ``steps`` 0 runs until stopped."""

    def __post_init__(self) -> None:
        require(self, ["steps"], lambda v: v >= 0, ">= 0 (0: until stopped)")
        if self.steps:
            super().__post_init__()
        else:
            dataclasses.replace(self, steps=1)


@dataclass(frozen=True)
class ApeX(Served, Run):
    """Ape-X (Horgan et al. 2018): DQN served to actor processes, its target synced by the
    learner every ``target_update_interval`` SGD steps (`distributed.learner`)."""

    seed: int = option(1, "seed of actors, networks and sampling")
    num_actors: int = option(2, "actor processes")
    weight_pull_interval: int = option(512, "actor env steps between weight pulls (K)")
    target_update_interval: int = option(128, "SGD steps between target-network syncs")


@dataclass(frozen=True)
class ActorEnvs(Group):
    """The envs each remote actor steps together."""

    actor_envs: int = option(1, "envs per actor")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive_ints(self, "actor_envs")


@dataclass(frozen=True)
class DataParallel(Group):
    """A learner's update split over devices."""

    devices: str = option(
        "",
        "data-parallel learner over these devices, e.g. /gpu:0,/gpu:1 (one replay shard each; "
        "/cpu:0,/cpu:1 splits the CPU, to try it); empty: one device",
    )


@dataclass(frozen=True)
class Device(Group):
    """Where and how the update runs."""

    jit_compile: bool = option(True, "compile the SGD loop with XLA")
    device: str = option("", "TF device; empty: first GPU, else CPU")
