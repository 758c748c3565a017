"""Views: what a drawn row becomes (a transition, an n-step transition, a frame stack, a sequence).

A view is a frozen config of pure graph functions over one shard and the drawn rows; holding no
variables, it serves every shard and distribution. The `Sampler` acts on what it declares:

- ``needs_stream_rows``: it reads neighbouring rows of the same stream
  (``table.stream_contiguous`` required);
- ``checks_rows`` / ``valid``: rows not drawable now (final frame rows, windows crossing an
  episode), which the sampler redraws;
- ``settled_invalid`` and ``lookahead``: those that never will be (priority 0 when prioritized);
- ``added_keys``: the keys ``read`` adds beside the table's fields.

A sample's priority, weight and ``update_priorities`` address the row it was drawn at.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from replaygpu.errors import ConfigError
from replaygpu.table import ReplayTable, Table


@dataclasses.dataclass(frozen=True)
class View:
    """Base of the views. Subclasses override ``read`` and what they need of the rest."""

    needs_stream_rows: ClassVar[bool] = False
    #: keys ``read`` adds to a batch beside the table's fields
    added_keys: ClassVar[tuple[str, ...]] = ()
    #: whether ``valid`` can refuse a row (False: every filled row can be drawn)
    checks_rows: ClassVar[bool] = False
    #: how many rows after a drawn row decide whether it can ever be drawn
    lookahead: ClassVar[int] = 0

    def for_table(self, table: Table) -> View:
        """This view for ``table``: one with a ``stream_field`` (`NStep`, `Sequence`) left None
        takes the table's ``shard_by``."""
        if getattr(self, "stream_field", "") is None and table.shard_by is not None:
            return dataclasses.replace(self, stream_field=table.shard_by)
        return self

    def check(self, table: Table) -> None:
        """Raise `ConfigError` when ``table`` lacks what this view reads (called once)."""
        clash = sorted(set(self.added_keys) & set(table.spec))
        if clash:
            raise ConfigError(
                f"table '{table.name}' has field(s) {clash}, keys {type(self).__name__} adds to "
                "each batch; rename them"
            )

    def valid(self, table: ReplayTable, rows: tf.Tensor) -> tf.Tensor:
        """``[B]`` bool: whether each of ``rows`` ([B] int64) can be drawn now."""
        return tf.ones_like(rows, tf.bool)

    def settled_invalid(self, table: ReplayTable, rows: tf.Tensor) -> tf.Tensor | None:
        """``[B]`` bool: rows that cannot be drawn until overwritten; None when there are none."""
        return None

    def read(self, table: ReplayTable, rows: tf.Tensor) -> dict[str, tf.Tensor]:
        """The flat batch (leaf paths and ``added_keys``) of the samples drawn at ``rows``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement read")


@dataclasses.dataclass(frozen=True)
class Transition(View):
    """The drawn rows as stored: ``{field: [B, ...]}`` in the table's structure."""

    def read(self, table: ReplayTable, rows: tf.Tensor) -> dict[str, tf.Tensor]:
        return table.gather(rows)
