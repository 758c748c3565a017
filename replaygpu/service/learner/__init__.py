"""The learner side of the service: what runs in the process that owns the table.

Its modules, in about the order an Append request meets them:

- `server`: `serve` and `ReplayServer`, the lifecycle (start, health, checkpoints, stop);
- `servicer`: the RPCs (Append's parse -> validate -> stage -> ack, GetWeights, Info), on the
  asyncio loop of `eventloop`;
- `admission`: parsing one Append request and checking it against the table;
- `staging`: the bounded queue and buffer pool between the gRPC handlers and the committer;
- `ingest`: commits staged batches to the table exactly once per (actor, seq);
- `ledger`: the last committed seq per actor, checkpointed with the table;
- `journal`: durable acknowledgements, an append-only log of the raw requests (its files
  on disk: `journal_files`; the segment being written and its recovery after a failed write:
  `journal_segment`); `durable`: replaying it at start, health that follows its disk;
- `loop`: a served learner's training loop (`loop.run`, `loop.step`).

This package re-exports nothing.
"""
