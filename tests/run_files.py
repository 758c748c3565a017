"""Runs saved by an older version: a checkpoint folder whose run.json lacks a config field."""

from __future__ import annotations

import json
import os
from typing import Any

import tensorflow as tf

from replaygpu.agents.runs import RUN_FILE, RunControl


def save_run_lacking(directory: str, config: Any, field: str) -> None:
    """Save a one-variable checkpoint of ``config``'s run in ``directory``, then drop ``field``
    from its run.json, as a version before the field existed wrote it."""
    run = RunControl(directory, 3600.0, config)
    run.attach(counter=tf.Variable(1, dtype=tf.int64))
    run.save()
    path = os.path.join(directory, RUN_FILE)
    with open(path) as f:
        saved = json.load(f)
    del saved["config"][field]
    with open(path, "w") as f:
        json.dump(saved, f)
