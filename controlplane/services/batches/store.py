"""Where files' bytes are kept: an object store, behind one small interface.

- `file:///path` (or nothing: `<data_dir>/objects`): a directory on the control plane's
  disk. An object is written to a temporary file, synced and renamed into place, so a
  crash never leaves half of one. For one replica, or replicas that share the directory.
- `s3://bucket/prefix`: Amazon S3, through boto3 (its credentials from the environment, as
  boto3 finds them; `AWS_ENDPOINT_URL` points it at another S3-compatible store, as the tests
  point it at moto).

Every call runs off the event loop.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from controlplane.errors import MeridianError, NotFound


class StoreError(MeridianError):
    code = "object_store_failed"
    status = 503
    title = "The object store failed"


class ObjectMissing(NotFound):
    pass


class ObjectStore(Protocol):
    async def put(self, key: str, data: bytes) -> None: ...
    async def get(self, key: str) -> bytes:
        """Raises ObjectMissing when there is no object under `key`."""
        ...

    async def delete(self, key: str) -> None: ...


class LocalStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise StoreError(f"{key!r} is not a key of this store")
        return path

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._write, self._path(key), data)

    async def get(self, key: str) -> bytes:
        try:
            return await asyncio.to_thread(self._path(key).read_bytes)
        except FileNotFoundError:
            raise ObjectMissing(f"no object {key}") from None

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self._path(key).unlink, True)

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        directory = os.open(path.parent, os.O_RDONLY)  # the rename, made durable too
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


class S3Store:
    def __init__(self, bucket: str, prefix: str) -> None:
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self._client: Any = None  # made at the first call

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _s3(self) -> Any:
        if self._client is None:
            self._client = boto3.client("s3")
        return self._client

    async def put(self, key: str, data: bytes) -> None:
        await self._call("put_object", Bucket=self.bucket, Key=self._key(key), Body=data)

    async def get(self, key: str) -> bytes:
        try:
            answer = await self._call("get_object", Bucket=self.bucket, Key=self._key(key))
        except ObjectMissing:
            raise
        body: bytes = await asyncio.to_thread(answer["Body"].read)
        return body

    async def delete(self, key: str) -> None:
        await self._call("delete_object", Bucket=self.bucket, Key=self._key(key))

    async def _call(self, method: str, **params: Any) -> dict[str, Any]:
        try:
            answer: dict[str, Any] = await asyncio.to_thread(getattr(self._s3(), method), **params)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404"):
                raise ObjectMissing(f"no object {params.get('Key')}") from None
            raise StoreError(f"S3 {method}: {code or error}") from None
        except BotoCoreError as error:
            raise StoreError(f"S3 {method}: {error}") from None
        return answer


def store_for(url: str | None, data_dir: Path) -> ObjectStore:
    """The store a setting names (see the module's doc); ValueError for one it does not."""
    if not url:
        return LocalStore(data_dir / "objects")
    parts = urlsplit(url)
    if parts.scheme == "file" and parts.path:
        return LocalStore(Path(parts.path))
    if parts.scheme == "s3" and parts.netloc:
        return S3Store(parts.netloc, parts.path)
    raise ValueError(f"an object store is file:///path or s3://bucket/prefix, not {url!r}")
