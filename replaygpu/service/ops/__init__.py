"""Operating the service: the command line, monitoring, security and process tuning.

`commands` (``serve``, ``info``, ``health``, and the flags ``learner`` and ``actor`` share),
`metrics`, `auth` (tokens, TLS) and `allocator`. `auth` and `allocator` import neither side
(the actor side uses them without TensorFlow); `commands` and `metrics` sit on top of both.
Re-exports nothing."""
