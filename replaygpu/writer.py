"""`TableWriter`: transitions added one env step at a time, appended a chunk at a time."""

from __future__ import annotations

import contextlib
from typing import Any

from replaygpu.errors import check_int
from replaygpu.rows import RowBuffer, flat_fields, is_nested
from replaygpu.specs import host_spec


class TableWriter(contextlib.AbstractContextManager["TableWriter"]):
    """Stages transitions one at a time in host memory; appends them ``chunk`` rows at a time.

    `add` costs about a numpy write per step: the row is checked on the way in, as `append`
    checks a batch (a refused row raises `BatchError` and stages nothing), and copied into numpy
    columns. The table gets the staged rows in one checked `append` (one scatter per field, all
    or nothing) when ``chunk`` are staged, on `flush`, on leaving a ``with`` block, and before
    each `Learner.train` over the table, so sampling never misses a staged row. Make writers
    with `ReplayTable.writer`.

    Args:
        table: a `ReplayTable` or `ShardedReplayTable`.
        chunk: rows staged before an append; host memory is ``chunk`` rows of the spec.
    """

    def __init__(self, table: Any, chunk: int = 1024) -> None:
        self.table = table
        self.chunk = check_int("chunk", chunk, 1)
        self._buffer = RowBuffer(host_spec(table.spec), self.chunk)
        self._nested = is_nested(self._buffer.spec)
        self._staged = 0

    def __len__(self) -> int:
        """Rows staged and not appended yet."""
        return self._staged

    def add(self, transition: Any) -> None:
        """Stage one transition ``{field: value of the field's shape}`` (nested like the spec,
        or flat by leaf path); appends the chunk once it is full.

        Raises:
            BatchError: the row does not match the spec (naming the field); nothing is staged.
        """
        row = flat_fields(self._buffer.spec, self._nested, "transition", transition)
        self._buffer.write(self._staged, row)
        self._staged += 1
        if self._staged == self.chunk:
            self.flush()

    def flush(self) -> int:
        """Append the staged rows to the table (one `append`); how many there were."""
        staged = self._staged
        if staged:
            self.table.append({k: v[:staged] for k, v in self._buffer.columns.items()})
            self._staged = 0
        return staged

    def __exit__(self, *exc: object) -> None:
        self.flush()
