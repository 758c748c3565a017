"""The run file (``run.json``) beside a run's checkpoints: the algorithm module, the config class
and its values. Read without TensorFlow, so ``replaygpu eval`` reports a folder that holds no
run at once; `runs.RunControl` writes it with the first checkpoint.
"""

from __future__ import annotations

import json
import os
from typing import Any

import replaygpu as rg

#: the file in a checkpoint folder naming the algorithm and its config
RUN_FILE = "run.json"


def read_json(path: str) -> dict[str, Any]:
    """A run file's contents.

    Raises:
        ConfigError: unreadable, not JSON, or without the expected keys.
    """
    try:
        with open(path) as f:
            saved = json.load(f)
        if not {"algorithm", "config_class", "config"} <= set(saved):
            raise ValueError("it lacks algorithm, config_class or config")
    except (OSError, ValueError) as err:
        raise rg.ConfigError(
            f"{path}: not a readable run file ({type(err).__name__}: {err}); it is written by "
            "`replaygpu demo`/`replaygpu learner` beside their checkpoints"
        ) from None
    return saved


def read_run_file(path: str) -> tuple[str, str, dict[str, Any], str]:
    """``(algorithm module, config class, config values, checkpoint folder)`` of a run folder or a
    checkpoint folder (the run folder's ``checkpoints/``).

    Raises:
        ConfigError: neither holds a ``run.json``.
    """
    for folder in (os.path.join(path, "checkpoints"), path):
        file = os.path.join(folder, RUN_FILE)
        if os.path.isfile(file):
            saved = read_json(file)
            return saved["algorithm"], saved["config_class"], saved["config"], folder
    raise rg.ConfigError(
        f"{path!r}: no {RUN_FILE} in it or in its checkpoints/ folder; expected a run folder "
        "of `replaygpu demo`/`replaygpu learner` or its checkpoint folder"
    )
