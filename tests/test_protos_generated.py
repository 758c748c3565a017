"""The checked-in generated protobuf code is exactly what the pinned generator produces."""

import subprocess
import sys
from pathlib import Path

import pytest

from replaygpu.service.wire import generate_protos


def test_checked_in_generated_code_matches_a_fresh_generation(tmp_path):
    try:
        from importlib.metadata import version

        have = version("grpcio-tools")
    except Exception:
        pytest.skip("grpcio-tools is not installed (pip install -e .[test])")
    if have != generate_protos.GRPCIO_TOOLS_VERSION:
        pytest.skip(
            f"grpcio-tools {have} installed; the pin is {generate_protos.GRPCIO_TOOLS_VERSION}"
        )
    # a subprocess: protoc and an already-imported TensorFlow do not share a process well
    subprocess.run(
        [sys.executable, "-m", "replaygpu.service.wire.generate_protos", "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for rel in generate_protos.GENERATED_FILES:
        fresh = (tmp_path / rel).read_text()
        checked_in = (generate_protos.REPO_ROOT / rel).read_text()
        assert fresh == checked_in, (
            f"{rel} differs from a fresh generation; regenerate it with "
            "python -m replaygpu.service.wire.generate_protos"
        )
    assert Path(generate_protos.REPO_ROOT / "replaygpu/v1/__init__.py").is_file()
