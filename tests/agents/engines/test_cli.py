"""`meridian engines`, run as an operator runs it: a tiny model, an adapter of it, and an
adapter's digest, each a child process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from meridian_pb.fleet.v1.adapters import DIGEST_PATTERN, digest_of


def _meridian(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meridian", "engines", *args],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_a_tiny_adapter_is_written_with_its_digest_and_a_digest_is_read_back(
    tmp_path: Path,
) -> None:
    model, adapter = tmp_path / "tiny", tmp_path / "support"
    assert _meridian("tiny-model", str(model)).returncode == 0
    made = _meridian("tiny-adapter", str(adapter), "--model", str(model), "--rank", "8")
    assert made.returncode == 0, made.stderr
    digest = made.stdout.split()[-1]
    assert digest == digest_of(adapter)
    assert (adapter / "adapter_config.json").is_file()
    read = _meridian("adapter-digest", str(adapter))
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == digest
    assert re.fullmatch(DIGEST_PATTERN, digest)
    (tmp_path / "empty").mkdir()
    empty = _meridian("adapter-digest", str(tmp_path / "empty"))
    assert empty.returncode == 2
    assert "holds no files" in empty.stderr
    missing = _meridian("tiny-adapter", str(tmp_path / "x"), "--model", str(tmp_path / "none"))
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr
