"""Helpers shared by the service tests over a two-field table (``id`` int64, ``obs`` float32[4])."""

import socket

import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.service.server.ledger import SequenceLedger

SPEC = {"id": tf.TensorSpec([], tf.int64), "obs": tf.TensorSpec([4], tf.float32)}


def columns(ids):
    """A batch whose ``id`` column is ``ids`` and whose ``obs`` rows repeat each id."""
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32)}


def stored_ids(table):
    """The ids stored in ``table``, sorted."""
    return np.sort(table.storage["id"].numpy()[: table.size])


def free_port():
    """A loopback port free right now (for a server restarted on the same address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def restored(folder, capacity=4096):
    """A new table and ledger, restored from the newest intact checkpoint in ``folder`` when
    there is one, and their checkpointer."""
    table = rg.ReplayTable(SPEC, capacity=capacity, device="/CPU:0")
    ledger = SequenceLedger()
    ckpt = rg.Checkpointer(str(folder), table=table, ledger=ledger)
    ckpt.restore()
    return table, ledger, ckpt
