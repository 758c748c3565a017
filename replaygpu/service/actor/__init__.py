"""The actor side of the service: what an actor process runs, without TensorFlow.

- `client`: `ReplayClient`, the public API (buffer transitions, flush, pull weights);
- `connection`: its channel to the server, connecting with retries, the unary RPCs, and the
  `Outage` that logs once when the server stops answering and once when it answers again;
- `outbox`: sealed requests awaiting their ack, and the thread that streams them;
- `rows`: the checks of the rows it is given (container shape, field dtypes and shapes).

Nothing here imports TensorFlow or the learner side, so an actor starts fast and stays small
(``tests/test_client.py`` checks it). This package re-exports nothing.
"""
