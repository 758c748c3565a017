"""The actor side of the service: what an actor process runs, without TensorFlow.

`client` (`ReplayClient`, the public API), its `connection` (channel, retries, `Outage`), its
`outbox` (requests awaiting their ack) and `rows` (checks of given rows). Nothing here imports
TensorFlow or the learner side (``tests/test_client.py`` checks it); re-exports nothing."""
