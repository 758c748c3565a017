"""The actor-to-learner gRPC service.

Modules, by side of the wire:

- both sides (no TensorFlow): `wire` (the AppendRequest format: one-copy encoder, zero-copy
  parser), `codec` (numpy arrays <-> Tensor messages), `status` (library errors <-> gRPC status
  codes), `auth` (tokens, TLS), `config` (`ClientConfig`, `ServerConfig`,
  `ActorSettings`), `allocator`
  (glibc tuning for large buffers), `generate_protos` (regenerates ``replaygpu.v1``);
- actor side (no TensorFlow): `client` (`ReplayClient`) and its `outbox` (unacknowledged
  requests and the stream thread);
- learner side: `server` (`serve`, `ReplayServer`: lifecycle, health, checkpoints),
  `servicer` (the RPCs: Append's parse -> validate -> stage -> ack, GetWeights, Info),
  `staging` (the bounded queue and buffer pool between gRPC threads and the committer),
  `ingest` (commits staged batches exactly once), `ledger` (last committed seq per actor,
  checkpointed), `loop` (a served learner's training loop: `rg.run_learner`,
  `rg.learner_step`), `metrics` (Prometheus ``/metrics``: `start_metrics_server`),
  `commands` (``replaygpu serve`` / ``replaygpu info`` / ``replaygpu health``).

This package re-exports nothing, so importing the client never pulls in the server.
"""
