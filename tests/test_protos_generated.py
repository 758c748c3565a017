"""The checked-in generated protobuf code is exactly what the pinned generator produces."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

#: a tool of the source checkout, beside the .proto sources (not in the package)
GENERATOR = Path(__file__).resolve().parents[1] / "protos" / "generate.py"
_spec = importlib.util.spec_from_file_location("generate", GENERATOR)
generate_protos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate_protos)


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
        [sys.executable, str(GENERATOR), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for rel in generate_protos.GENERATED_FILES:
        fresh = (tmp_path / rel).read_text()
        checked_in = (generate_protos.REPO_ROOT / rel).read_text()
        assert fresh == checked_in, (
            f"{rel} differs from a fresh generation; regenerate it with python protos/generate.py"
        )
    assert Path(generate_protos.REPO_ROOT / "replaygpu/v1/__init__.py").is_file()
