"""The committed Python of the wire contract is what the .proto sources generate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROTO = Path(__file__).resolve().parents[2] / "proto"


def generated(root: Path) -> dict[str, bytes]:
    suffixes = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in root.glob("meridian_pb/**/*")
        if path.name.endswith(suffixes)
    }


def test_regenerating_the_protocol_package_changes_nothing(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(PROTO / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh, committed = generated(tmp_path), generated(PROTO)
    assert sorted(fresh) == sorted(committed)
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"run `python proto/generate.py` and commit: {stale} differ"
