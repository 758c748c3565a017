"""Regenerate the checked-in protobuf and gRPC code from ``protos/replaygpu/v1/replay.proto``.

The ``.proto`` path mirrors the package, so ``-Iprotos`` into the repository root writes
``replaygpu/v1/replay_pb2{,_grpc}.py`` whose imports work inside the package. A tool of the
source checkout (it writes into it), not of the installed package. With the pinned grpcio-tools::

    python protos/generate.py                  # rewrite replaygpu/v1/
    python protos/generate.py --out /tmp/gen   # write elsewhere (the test)
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import metadata
from pathlib import Path

logger = logging.getLogger(__name__)

#: the grpcio-tools of the checked-in code (pinned in the test extra)
GRPCIO_TOOLS_VERSION = "1.85.1"
REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO_ROOT / "protos"
PROTO_FILES = ("replaygpu/v1/replay.proto",)
#: relative to the output root
GENERATED_FILES = tuple(
    p.replace(".proto", suffix)
    for p in PROTO_FILES
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
)


def generate(out_root: Path = REPO_ROOT) -> list[Path]:
    """Returns the files written under ``out_root/replaygpu/v1/``; `RuntimeError` when
    grpcio-tools is missing or of another version, or protoc fails."""
    try:
        from grpc_tools import protoc
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            f"grpcio-tools is not installed; pip install grpcio-tools=={GRPCIO_TOOLS_VERSION}"
        ) from err
    have = metadata.version("grpcio-tools")
    if have != GRPCIO_TOOLS_VERSION:
        raise RuntimeError(
            f"grpcio-tools {have} is installed, expected {GRPCIO_TOOLS_VERSION} (the pinned "
            f"version); pip install grpcio-tools=={GRPCIO_TOOLS_VERSION}"
        )
    include = Path(protoc.__file__).resolve().parent / "_proto"
    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *PROTO_FILES,
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args)}")
    return [out_root / p for p in GENERATED_FILES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: repo)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for path in generate(args.out):
        logger.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
