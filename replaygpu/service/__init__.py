"""The actor-to-learner gRPC service: wire codec, server, client, auth, health.

Modules, by side of the wire:

- actor side (imports no TensorFlow): `client` (`ReplayClient`), `codec`, `auth`, `status`,
  and the generated ``replaygpu.v1`` protos;
- learner side: `server` (`serve`, `ReplayServer`), `staging` (the bounded queue between gRPC
  threads and the learner thread), `ledger` (last committed seq per actor, checkpointed),
  `commands` (``replaygpu serve`` / ``replaygpu info``).

This package re-exports nothing, so importing the client never pulls in the server.
"""
