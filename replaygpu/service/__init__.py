"""The actor-to-learner gRPC service, one subpackage per side of the wire.

- `actor` (no TensorFlow): `ReplayClient` (`actor.client`) and its `connection` and `outbox`;
- `server` (the side that owns the table, in the learner's process): `serve` and `ReplayServer`
  (`server.server`), the RPCs (`servicer`, `admission`),
  `staging`, `ingest`, `ledger`, the durable `journal`, and a served learner's training `loop`;
- `wire` (no TensorFlow): the ``AppendRequest`` format (`append_request`), `codec`, the
  error <-> status code table (`status`); the generated code is ``replaygpu.v1``, the proto
  package other languages use;
- `ops`: the ``serve`` / ``info`` / ``health`` `commands`, `metrics`, `auth`, `allocator`.

`config` stays here: both sides read it, and it imports neither. The actor side never imports
`server`. Re-exports nothing, so importing the client never pulls in the server."""
