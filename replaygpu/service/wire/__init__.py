"""The wire between actors and learner: what both sides agree on, without TensorFlow.

- `append_request`: the ``AppendRequest`` format (a one-copy encoder, a zero-copy parser);
- `codec`: numpy arrays <-> ``Tensor`` messages;
- `status`: library errors <-> gRPC status codes, in both directions;
- `generate_protos`: regenerates the checked-in protobuf and gRPC code.

That generated code stays at ``replaygpu.v1``, outside this package: protoc names the Python
module after the ``.proto`` file's path (``protos/replaygpu/v1/replay.proto``), and that path
and the proto package ``replaygpu.v1`` are what clients in other languages import and call
(``/replaygpu.v1.ReplayService/Append``); moving the module would move one or both.

This package re-exports nothing.
"""
