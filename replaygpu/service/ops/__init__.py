"""Operating the service: the command line, monitoring, security and process tuning.

- `commands`: ``replaygpu serve``, ``replaygpu info ADDRESS`` and ``replaygpu health ADDRESS``,
  and the TLS and token flags the ``learner`` and ``actor`` commands share;
- `metrics`: Prometheus ``/metrics`` (`start_metrics_server`);
- `auth`: bearer tokens and TLS: channels for the actor side, the token check for the learner
  side, and connection errors that say what to change;
- `allocator`: glibc malloc and garbage-collector tuning, for both sides' large buffers.

`auth` and `allocator` import neither side (the actor side uses them without TensorFlow);
`commands` and `metrics` sit on top of both. This package re-exports nothing.
"""
