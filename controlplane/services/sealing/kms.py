"""Key-encryption keys (KEKs): what wraps the data key of every sealed secret (sealer.py).

`MERIDIAN_KMS` names the KEK new secrets are wrapped under:

- `local` (the default): the key file `MERIDIAN_KMS_KEY_FILE` (`<data_dir>/kek.json`) on
  the control plane's disk, made on first use (mode 0600), holding every KEK it has had; the
  newest wraps, any unwraps. For the local fleet, or replicas that share the file.
  `meridian keys rotate kek` adds a new one and rewraps every secret under it.
- `aws-kms:<key id, ARN or alias>`: AWS KMS, through boto3 (credentials and region from the
  environment; `AWS_ENDPOINT_URL` points it elsewhere, as the tests point it at moto). The
  data key never leaves the process in clear; KMS sees only the 32 bytes it wraps, bound to
  the secret's context (its encryption context), and logs each use in CloudTrail. To move to
  a new KMS key (or from the key file to KMS), set `MERIDIAN_KMS` to it and run
  `meridian keys rewrap`: the old key (or the key file) is still used to unwrap until then.

- `gcp-kms:<key name>` and `azure-kv:<key URL>`: Google Cloud KMS and Azure Key Vault
  (clouds.py), the same three calls (`wrap`, `unwrap`, `id`).

A KEK id names its implementation by its prefix, so secrets wrapped under several coexist and
a rewrap moves them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import threading
from pathlib import Path
from typing import Any, Protocol

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from controlplane.errors import MeridianError

LOCAL, AWS, GCP, AZURE = "local", "aws-kms", "gcp-kms", "azure-kv"
KINDS = (LOCAL, AWS, GCP, AZURE)


class SealError(MeridianError):
    code = "secret_unavailable"
    status = 503
    title = "A stored secret could not be opened"


class Kek(Protocol):
    """One key-encryption key."""

    @property
    def id(self) -> str:
        """`<kind>:<which>`: what a sealed secret records, to be unwrapped with it again."""
        ...

    async def wrap(self, data_key: bytes, context: str) -> bytes: ...
    async def unwrap(self, wrapped: bytes, context: str) -> bytes:
        """Raises SealError when `wrapped` was not wrapped by this key for `context`."""
        ...


def kms_problem(setting: str) -> str | None:
    """Why `setting` names no KEK this build can use; None when it does."""
    kind, _, which = setting.partition(":")
    if kind not in KINDS or (kind == LOCAL and which):
        return (f"must be 'local', 'aws-kms:<key id, ARN or alias>', 'gcp-kms:<key name>' or "
                f"'azure-kv:<key URL>', not {setting!r}")  # fmt: skip
    if kind == AWS and not which:
        return "aws-kms: must name the key (its id, ARN or alias/...)"
    from controlplane.services.sealing import clouds

    return clouds.problem(kind, which)


class Keks:
    """The KMS of a control plane: the current KEK, and any KEK a stored secret names (the key
    file's, AWS KMS's), so that secrets wrapped under an older one still open."""

    def __init__(self, setting: str, key_file: Path) -> None:
        problem = kms_problem(setting)
        if problem is not None:
            raise ValueError(f"MERIDIAN_KMS {problem}")
        self.setting, self.key_file = setting, key_file
        self._local: LocalKms | None = None
        self._aws: Any = None
        self._clouds: dict[str, Kek] = {}
        self._current = self.kek(setting) if setting != LOCAL else self.local(create=True).current

    @property
    def current(self) -> Kek:
        return self._current

    def kek(self, kek_id: str) -> Kek:
        kind, _, which = kek_id.partition(":")
        if kind == LOCAL:
            return self.local(create=False).kek(which)
        if kind == AWS and which:
            if self._aws is None:
                self._aws = boto3.client("kms")
            return AwsKek(which, self._aws)
        if kind in (GCP, AZURE) and kms_problem(kek_id) is None:
            if kek_id not in self._clouds:
                from controlplane.services.sealing.clouds import AzureKek, GcpKek

                self._clouds[kek_id] = GcpKek(which) if kind == GCP else AzureKek(which)
            return self._clouds[kek_id]
        raise SealError(f"a secret is wrapped under {kek_id!r}, which this build cannot reach")

    def local(self, *, create: bool) -> LocalKms:
        if self._local is None:
            if not create and not self.key_file.exists():
                raise SealError(f"a secret is wrapped under the key file {self.key_file}, "
                                "which is not there")  # fmt: skip
            self._local = LocalKms(self.key_file)
        return self._local

    def rotate_local(self) -> str:
        """A new KEK in the key file, current from now on; its id."""
        if self.setting != LOCAL:
            raise SealError(f"MERIDIAN_KMS is {self.setting}: rotate that key in its KMS, or "
                            "point MERIDIAN_KMS at a new one, then rewrap")  # fmt: skip
        self._current = self.local(create=True).rotate()
        return self._current.id


class LocalKek:
    def __init__(self, name: str, key: bytes) -> None:
        self.id, self._aead = f"{LOCAL}:{name}", AESGCM(key)

    async def wrap(self, data_key: bytes, context: str) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, data_key, context.encode())

    async def unwrap(self, wrapped: bytes, context: str) -> bytes:
        try:
            return self._aead.decrypt(wrapped[:12], wrapped[12:], context.encode())
        except InvalidTag:
            raise SealError(f"{self.id} did not wrap this secret's key ({context})") from None


class LocalKms:
    """A key file: `{"current": name, "keys": {name: base64 of 32 bytes}}`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._keys: dict[str, LocalKek] = {}
        self._current = ""
        self._read(create=True)

    @property
    def current(self) -> LocalKek:
        return self._keys[self._current]

    def kek(self, name: str) -> LocalKek:
        if name not in self._keys:
            self._read(create=False)  # another replica sharing the file may have rotated
        if name not in self._keys:
            raise SealError(f"the key file {self.path} has no KEK {name}")
        return self._keys[name]

    def rotate(self) -> LocalKek:
        """A new KEK, current from now on (the old ones stay, to unwrap)."""
        with self._lock:
            doc = self._load()
            name = secrets.token_hex(4)
            doc["keys"][name] = base64.b64encode(AESGCM.generate_key(256)).decode()
            doc["current"] = name
            self._write(doc, replace=True)
            self._adopt(doc)
        return self._keys[name]

    def _read(self, *, create: bool) -> None:
        with self._lock:
            if create and not self.path.exists():
                name = secrets.token_hex(4)
                key = base64.b64encode(AESGCM.generate_key(256)).decode()
                self._write({"current": name, "keys": {name: key}}, replace=False)
            self._adopt(self._load())

    def _load(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.path.read_text())
            keys = {n: base64.b64decode(k, validate=True) for n, k in doc["keys"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise SealError(f"the key file {self.path} cannot be read: {error}") from None
        if doc.get("current") not in keys or any(len(k) != 32 for k in keys.values()):
            raise SealError(f"the key file {self.path} is not a Meridian key file")
        return dict(doc)

    def _adopt(self, doc: dict[str, Any]) -> None:
        for name, key in doc["keys"].items():
            if name not in self._keys:
                self._keys[name] = LocalKek(name, base64.b64decode(key))
        self._current = doc["current"]

    def _write(self, doc: dict[str, Any], *, replace: bool) -> None:
        """Written whole and renamed into place (or, the first time, created only if no other
        process made it meanwhile): never half a key file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(doc, out)
            out.flush()
            os.fsync(out.fileno())
        if replace:
            os.replace(temp, self.path)
            return
        try:
            os.link(temp, self.path)  # fails if another process made it first: theirs stands
        except FileExistsError:
            pass
        finally:
            temp.unlink()


class AwsKek:
    def __init__(self, key_id: str, client: Any) -> None:
        self.id, self._key_id, self._client = f"{AWS}:{key_id}", key_id, client

    async def wrap(self, data_key: bytes, context: str) -> bytes:
        answer = await self._call("encrypt", KeyId=self._key_id, Plaintext=data_key,
                                  EncryptionContext={"meridian": context})  # fmt: skip
        return bytes(answer["CiphertextBlob"])

    async def unwrap(self, wrapped: bytes, context: str) -> bytes:
        answer = await self._call("decrypt", KeyId=self._key_id, CiphertextBlob=wrapped,
                                  EncryptionContext={"meridian": context})  # fmt: skip
        return bytes(answer["Plaintext"])

    async def _call(self, method: str, **kwargs: Any) -> dict[str, Any]:
        try:
            answer: dict[str, Any] = await asyncio.to_thread(
                getattr(self._client, method), **kwargs
            )
        except (BotoCoreError, ClientError) as error:
            raise SealError(f"AWS KMS {method} with {self._key_id} failed: {error}") from None
        return answer
