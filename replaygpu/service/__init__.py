"""The actor-to-learner gRPC service, one subpackage per side of the wire.

- `actor` (no TensorFlow): `ReplayClient` (`actor.client`), its `connection` to the server and
  its `outbox` of unacknowledged requests;
- `learner`: `serve` and `ReplayServer` (`learner.server`), the RPCs (`servicer`, `admission`),
  `staging`, `ingest`, `ledger`, the durable `journal`, and a served learner's training `loop`;
- `wire` (no TensorFlow): what both sides agree on: the ``AppendRequest`` format
  (`append_request`), `codec`, the error <-> status code mapping (`status`), and
  `generate_protos` for the generated code, which stays at ``replaygpu.v1`` (the proto
  package other languages use);
- `ops`: operating it: the ``serve`` / ``info`` / ``health`` `commands`, Prometheus `metrics`,
  `auth` (tokens, TLS) and the `allocator` tuning both sides call.

`config` (`ClientConfig`, `ServerConfig`, `AgentSettings`, the actor-id rule) stays here: both
sides read it, and it imports neither. The actor side imports only `wire`, `config` and the
TensorFlow-free `ops` modules, never `learner`. This package re-exports nothing, so importing
the client never pulls in the server.
"""
