"""Generated protobuf and gRPC code of the ``replaygpu.v1`` wire protocol (do not edit).

Regenerate with ``python -m replaygpu.service.wire.generate_protos``; the sources live in
``protos/replaygpu/v1/``.
"""
