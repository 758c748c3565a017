"""Generated protobuf and gRPC code of the ``replaygpu.v1`` wire protocol (do not edit).

Regenerate with ``python protos/generate.py`` in a source checkout; the sources live in
``protos/replaygpu/v1/``.
"""
