"""The wire between actors and learner: what both sides agree on, without TensorFlow.

`append_request`, `codec` and `status`; re-exports nothing. The generated
code stays at ``replaygpu.v1``: protoc names the module after the ``.proto`` path, and that
path and the proto package are what other languages import and call
(``/replaygpu.v1.ReplayService/Append``); moving the module would move one or both."""
