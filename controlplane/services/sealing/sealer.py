"""Envelope encryption of the secrets the control plane stores.

Each secret gets a data key of its own (AES-256-GCM, 32 random bytes). The secret is
encrypted with it, bound to its context (what it is and whose: `signing-key:<kid>`), so that
a ciphertext moved onto another row does not open there. The data key is stored only
wrapped by a key-encryption key from the KMS (kms.py), with the KEK's id. The database holds
the wrapped key, the nonce and the ciphertext: nothing that opens without the KMS.

Opened data keys are kept in memory (a KMS call per secret, once per process), never on disk.
A rewrap unwraps the data key and wraps it again under the current KEK; the ciphertext is
unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from controlplane.services.sealing.kms import Keks, SealError

if TYPE_CHECKING:
    from controlplane.settings import Settings


@dataclass(frozen=True)
class Sealed:
    kek_id: str
    wrapped_key: bytes
    nonce: bytes
    ciphertext: bytes


class Sealer:
    def __init__(self, keks: Keks) -> None:
        self.keks = keks
        self._data_keys: dict[bytes, bytes] = {}  # wrapped → open, this process only

    async def seal(self, secret: bytes, context: str) -> Sealed:
        data_key = AESGCM.generate_key(256)
        kek = self.keks.current
        wrapped = await kek.wrap(data_key, context)
        nonce = os.urandom(12)
        ciphertext = AESGCM(data_key).encrypt(nonce, secret, context.encode())
        self._data_keys[wrapped] = data_key
        return Sealed(kek.id, wrapped, nonce, ciphertext)

    async def open(self, sealed: Sealed, context: str) -> bytes:
        data_key = await self._data_key(sealed, context)
        try:
            return AESGCM(data_key).decrypt(sealed.nonce, sealed.ciphertext, context.encode())
        except InvalidTag:
            raise SealError(f"the secret sealed as {context} does not open as that") from None

    async def rewrap(self, sealed: Sealed, context: str) -> Sealed | None:
        """The same secret with its data key wrapped under the current KEK; None when it is
        already. Opened first, so that a secret that would not open again is never written."""
        kek = self.keks.current
        if sealed.kek_id == kek.id:
            return None
        await self.open(sealed, context)
        data_key = await self._data_key(sealed, context)
        wrapped = await kek.wrap(data_key, context)
        self._data_keys[wrapped] = data_key
        return Sealed(kek.id, wrapped, sealed.nonce, sealed.ciphertext)

    async def _data_key(self, sealed: Sealed, context: str) -> bytes:
        known = self._data_keys.get(sealed.wrapped_key)
        if known is None:
            kek = self.keks.kek(sealed.kek_id)
            known = await kek.unwrap(sealed.wrapped_key, context)
            if len(known) != 32:
                raise SealError(f"the data key of {context} is not an AES-256 key")
            self._data_keys[sealed.wrapped_key] = known
        return known


def sealer_for(settings: Settings) -> Sealer:
    key_file = settings.kms_key_file or settings.data_dir / "kek.json"
    return Sealer(Keks(settings.kms, key_file))
