"""The node's cache of adapter files: each adapter fetched once per version, checked against
its digest before any engine loads it (issue 45).

- A path with a digest: its files are checked and copied into the cache, so that a change
  made at the path later can never reach an engine as the same version.
- A path without one (the operator's own): loaded from where it is; nothing to check.
- `s3://bucket/key`: every object under `key/` is downloaded through boto3 (its credentials
  from the environment; `AWS_ENDPOINT_URL` points it at another store, as the tests point it
  at moto), then checked.

A version is fetched into a temporary directory beside its place and renamed there only once
its digest matches, so a crash or a mismatch never leaves one that looks whole. Concurrent
fetches of one version wait for the same one. All file and network work runs off the loop.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meridian_pb.fleet.v1.adapters import digest_of, scheme_of

from agents.adapter_config import AdapterConfig
from agents.errors import AgentError


class AdapterUnavailable(AgentError):
    """Its files could not be fetched, did not match their digest, or no engine loaded it."""

    code = "adapter_unavailable"


def _s3() -> Any:
    import boto3  # only a node with an adapter in S3 needs it

    return boto3.client("s3")


class AdapterFiles:
    def __init__(self, root: Path, s3: Callable[[], Any] = _s3) -> None:
        self.root = root
        self._s3 = s3
        self._fetching: dict[tuple[str, str], asyncio.Task[Path]] = {}

    def place(self, adapter: AdapterConfig) -> Path:
        """Where a version of the adapter is (or will be) kept."""
        if adapter.digest is None:
            return Path(adapter.source)
        return self.root / adapter.name / adapter.digest.removeprefix("sha256:")[:32]

    async def fetch(self, adapter: AdapterConfig) -> Path:
        """The directory an engine loads this version of the adapter from; AdapterUnavailable
        when it cannot be had."""
        place = self.place(adapter)
        if adapter.digest is None:
            return place
        key = (adapter.name, adapter.digest)
        task = self._fetching.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                asyncio.to_thread(self._fetch, adapter, place)
            )
            self._fetching[key] = task
            task.add_done_callback(lambda _: self._fetching.pop(key, None))
        return await asyncio.shield(task)

    def _fetch(self, adapter: AdapterConfig, place: Path) -> Path:
        if place.is_dir():
            return place
        place.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".fetching-", dir=place.parent))
        try:
            if scheme_of(adapter.source) == "s3":
                self._download(adapter.source, staging)
            else:
                source = Path(adapter.source)
                if not source.is_dir():
                    raise AdapterUnavailable(f"adapter {adapter.name}: {source} is not a directory")
                shutil.copytree(source, staging, dirs_exist_ok=True)
            found = digest_of(staging)
            if found != adapter.digest:
                raise AdapterUnavailable(
                    f"adapter {adapter.name}: its files' digest is {found}, not {adapter.digest}"
                    " as registered; it is not loaded"
                )
            staging.rename(place)
        except OSError as error:
            raise AdapterUnavailable(f"adapter {adapter.name}: {error}") from error
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return place

    def _download(self, source: str, into: Path) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, _, key = source.removeprefix("s3://").partition("/")
        prefix = key.strip("/") + "/"
        try:
            client = self._s3()
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            found = 0
            for page in pages:
                for item in page.get("Contents", []):
                    relative = item["Key"][len(prefix) :]
                    target = (into / relative).resolve()
                    if not relative or not target.is_relative_to(into.resolve()):
                        continue  # a "directory" marker, or a key that climbs out
                    target.parent.mkdir(parents=True, exist_ok=True)
                    client.download_file(bucket, item["Key"], str(target))
                    found += 1
        except (BotoCoreError, ClientError) as error:
            raise AdapterUnavailable(f"{source}: {error}") from error
        if not found:
            raise AdapterUnavailable(f"{source}: no object under it")

    def forget(self, keep: set[str]) -> None:
        """Removes every cached version but those in `keep` (those in force, as `place`'s
        strings)."""
        if not self.root.is_dir():
            return
        for version in self.root.glob("*/*"):
            if str(version) not in keep and version.is_dir() and not version.name.startswith("."):
                shutil.rmtree(version, ignore_errors=True)
