"""The object store behind tenants' files: S3 against moto's server (a real child process
speaking S3's API) and a directory on disk, behind one interface; what a setting names."""

from __future__ import annotations

import asyncio
from pathlib import Path

import boto3
import pytest

from controlplane.services.batches.store import (
    LocalStore,
    ObjectMissing,
    ObjectStore,
    S3Store,
    StoreError,
    store_for,
)
from tests.kits.moto import REGION, moto

__all__ = ["moto"]  # the fixture


async def _round_trip(store: ObjectStore) -> None:
    data = b'{"custom_id": "q1"}\n' * 1000
    await store.put("files/1/file-a", data)
    assert await store.get("files/1/file-a") == data
    await store.put("files/1/file-a", b"again")  # replaced whole
    assert await store.get("files/1/file-a") == b"again"
    await store.delete("files/1/file-a")
    with pytest.raises(ObjectMissing):
        await store.get("files/1/file-a")


async def test_s3_keeps_what_it_is_given_under_its_prefix(moto: str) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    await asyncio.to_thread(s3.create_bucket, Bucket="meridian-files")
    store = store_for("s3://meridian-files/tenants", Path("unused"))
    assert isinstance(store, S3Store)
    await _round_trip(store)
    await store.put("files/2/file-b", b"kept")
    listed = await asyncio.to_thread(s3.list_objects_v2, Bucket="meridian-files")
    assert [o["Key"] for o in listed["Contents"]] == ["tenants/files/2/file-b"]
    with pytest.raises(StoreError):  # a bucket that is not there is the store's failure
        await S3Store("no-such-bucket", "").put("k", b"x")


async def test_a_directory_keeps_objects_whole_and_only_under_itself(tmp_path: Path) -> None:
    store = store_for(None, tmp_path)
    assert isinstance(store, LocalStore)
    assert store.root == tmp_path / "objects"
    await _round_trip(store)
    with pytest.raises(StoreError):
        await store.put("../outside", b"x")
    assert not (tmp_path / "outside").exists()
    assert not list((tmp_path / "objects").rglob(".part-*"))  # no half-written object left
    assert isinstance(store_for(f"file://{tmp_path}/elsewhere", tmp_path), LocalStore)
    with pytest.raises(ValueError, match="file:///path or s3://bucket"):
        store_for("ftp://host/x", tmp_path)
