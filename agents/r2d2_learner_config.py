"""R2D2 served to remote actors, ``replaygpu learner --agent r2d2``: its config, without
TensorFlow (the CLI builds and checks it before TensorFlow is imported). `builders.ServedR2D2`
builds the run from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from replaygpu.agents.checks import require, require_positive, require_positive_ints
from replaygpu.agents.flags import helptext
from replaygpu.agents.r2d2_config import R2D2Config


@dataclass(frozen=True)
class R2D2LearnerConfig(R2D2Config):
    """R2D2 served to remote actors: `R2D2Config`'s network and update, prioritized sequences
    that actors send overlapping (one of ``sequence_length`` steps every ``period`` steps, with
    the LSTM state before its first step), and a samples-per-insert rate limit in place of the
    demo's train_freq/gradient_steps. A sequence's rows are stored once per sequence, so each
    env step inserts about sequence_length / period rows (3 with the defaults); the default
    limit of 1.5 sequences per inserted row is about the demo's 4 sequences per env step.
    The demo's epsilon schedule does not apply: actor i of N explores with Ape-X's epsilon."""

    steps: int = field(
        default=180_000,
        metadata=helptext(
            "table rows inserted by all actors (about sequence_length / period per env step: "
            "the default is about the demo's 60k env steps); 0: run until stopped (a service)"
        ),
    )
    learning_starts: int = field(
        default=5000, metadata=helptext("table rows before the first SGD step")
    )
    samples_per_insert: float = field(
        default=1.5, metadata=helptext("rate limit: sampled sequences per inserted row")
    )
    steps_per_call: int = field(default=32, metadata=helptext("SGD steps per Learner.train call"))
    num_actors: int = field(default=2, metadata=helptext("actor processes (demo) / fleet size"))
    actor_envs: int = field(default=1, metadata=helptext("envs per actor"))
    weight_pull_interval: int = field(
        default=400, metadata=helptext("actor env steps between weight pulls")
    )
    address: str = field(default="127.0.0.1:0", metadata=helptext("where the learner serves"))

    def __post_init__(self) -> None:
        require(self, ["steps"], lambda v: v >= 0, ">= 0 (0: until stopped)")
        if not self.steps:  # a service: its other fields are checked as for a run with a length
            dataclasses.replace(self, steps=1)
            return
        super().__post_init__()
        require_positive_ints(
            self, "steps_per_call", "num_actors", "actor_envs", "weight_pull_interval"
        )
        require_positive(self, "samples_per_insert")

    @property
    def steps_to_train(self) -> int:
        """The least ``steps`` that trains (`checks.require_trains`): the rate limiter samples
        once the table holds ``learning_starts`` rows."""
        return max(1, self.learning_starts)
