"""The node's cache of adapter files (agents/adapters/files.py): a version is fetched once,
from a path or from S3 (moto's server, a real child process), and kept only when its digest
matches what was registered; a mismatch leaves nothing behind that looks whole."""

from __future__ import annotations

import asyncio
from pathlib import Path

import boto3
import pytest
from meridian_pb.fleet.v1.adapters import digest_of

from agents.adapter_config import AdapterConfig
from agents.adapters.files import AdapterFiles, AdapterUnavailable
from agents.engines.tiny_model import write_adapter
from tests.kits.moto import REGION, moto

__all__ = ["moto"]  # the fixture


def _adapter(source: str, digest: str | None, name: str = "support") -> AdapterConfig:
    return AdapterConfig(name, "tiny", source, digest, 4, frozenset({"acme"}))


async def test_a_path_with_a_digest_is_copied_checked_and_kept_apart(tmp_path: Path) -> None:
    made = write_adapter(tmp_path / "made", tmp_path, seed=1)
    digest = digest_of(made)
    files = AdapterFiles(tmp_path / "cache")
    fetched = await files.fetch(_adapter(str(made), digest))
    assert fetched.is_relative_to(tmp_path / "cache")
    assert digest_of(fetched) == digest
    (made / "adapter_config.json").write_text("{}")  # changed where it came from, later
    assert await files.fetch(_adapter(str(made), digest)) == fetched  # the version kept
    assert digest_of(fetched) == digest
    with pytest.raises(AdapterUnavailable, match="digest"):  # what is there now: not it
        await files.fetch(_adapter(str(made), "sha256:" + "0" * 64, name="other"))
    assert not (tmp_path / "cache" / "other").exists() or not any(
        (tmp_path / "cache" / "other").iterdir()
    )
    unchecked = await files.fetch(_adapter(str(made), None))  # the operator's own: as it is
    assert unchecked == made


async def test_an_adapter_in_s3_is_downloaded_whole_and_checked(moto: str, tmp_path: Path) -> None:
    made = write_adapter(tmp_path / "made", tmp_path, seed=2)
    s3 = boto3.client("s3", region_name=REGION)
    await asyncio.to_thread(s3.create_bucket, Bucket="adapters")
    for path in made.iterdir():
        await asyncio.to_thread(s3.upload_file, str(path), "adapters", f"acme/v1/{path.name}")
    files = AdapterFiles(tmp_path / "cache")
    fetched = await asyncio.gather(*(
        files.fetch(_adapter("s3://adapters/acme/v1", digest_of(made))) for _ in range(3)
    ))  # fmt: skip
    assert len(set(fetched)) == 1
    assert digest_of(fetched[0]) == digest_of(made)
    assert sorted(p.name for p in fetched[0].iterdir()) == sorted(p.name for p in made.iterdir())
    with pytest.raises(AdapterUnavailable, match="no object"):
        await files.fetch(_adapter("s3://adapters/acme/v2", "sha256:" + "1" * 64, "v2"))
    files.forget(keep=set())
    assert not fetched[0].exists()
