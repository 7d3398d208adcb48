"""Envelope encryption (controlplane/services/sealing/): a secret sealed under the local key
file, AWS KMS (moto's server, a real child process), Google Cloud KMS or Azure Key Vault
(stand-ins speaking their REST APIs) opens only as what it was sealed as,
survives a rotation of the key file, and is rewrapped from one KEK to another without change;
a key file or KMS that cannot unwrap it says so."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import boto3
import pytest

from controlplane.services.sealing.kms import Keks, SealError
from controlplane.services.sealing.sealer import Sealer
from tests.kits.cloud_kms import CloudKms, cloud_kms, new_name
from tests.kits.moto import moto

__all__ = ["cloud_kms", "moto"]  # the fixtures


async def test_the_key_file_seals_opens_and_rotates(tmp_path: Path) -> None:
    key_file = tmp_path / "kek.json"
    sealer = Sealer(Keks("local", key_file))
    assert key_file.stat().st_mode & 0o777 == 0o600
    sealed = await sealer.seal(b"a seed of 32 bytes, or any other", "signing-key:a")
    assert b"a seed" not in sealed.ciphertext + sealed.wrapped_key
    # another process with the same file (a replica) opens it; not as something else
    other = Sealer(Keks("local", key_file))
    assert await other.open(sealed, "signing-key:a") == b"a seed of 32 bytes, or any other"
    with pytest.raises(SealError):
        await other.open(sealed, "signing-key:b")
    first = sealed.kek_id
    rotated = other.keks.rotate_local()
    assert rotated != first
    assert other.keks.current.id == rotated
    moved = await other.rewrap(sealed, "signing-key:a")
    assert moved is not None
    assert moved.kek_id == rotated
    assert moved.ciphertext == sealed.ciphertext  # the secret itself does not change
    assert await other.rewrap(moved, "signing-key:a") is None  # already under the current one
    assert await Sealer(Keks("local", key_file)).open(moved, "signing-key:a") == (
        b"a seed of 32 bytes, or any other"
    )
    # a different key file cannot open it, and says why
    with pytest.raises(SealError):
        await Sealer(Keks("local", tmp_path / "another.json")).open(moved, "signing-key:a")


async def test_aws_kms_seals_and_a_rewrap_moves_from_the_key_file_to_it(
    moto: str, tmp_path: Path
) -> None:
    key_id = boto3.client("kms").create_key(Description="meridian KEK")["KeyMetadata"]["KeyId"]
    key_file = tmp_path / "kek.json"
    local = Sealer(Keks("local", key_file))
    sealed = await local.seal(b"seed", "signing-key:k")
    aws = Sealer(Keks(f"aws-kms:{key_id}", key_file))
    assert await aws.open(sealed, "signing-key:k") == b"seed"  # the key file still unwraps
    moved = await aws.rewrap(sealed, "signing-key:k")
    assert moved is not None
    assert moved.kek_id == f"aws-kms:{key_id}"
    key_file.unlink()  # the key file gone: what moved opens through KMS alone
    fresh = Sealer(Keks(f"aws-kms:{key_id}", key_file))
    assert await fresh.open(moved, "signing-key:k") == b"seed"
    with pytest.raises(SealError):  # KMS checks the context too (its encryption context)
        await Sealer(Keks(f"aws-kms:{key_id}", key_file)).open(moved, "signing-key:other")
    with pytest.raises(SealError):
        await fresh.open(sealed, "signing-key:k")  # under the key file, which is gone


def test_a_kms_setting_that_names_nothing_usable_is_refused(tmp_path: Path) -> None:
    for bad in ("vault", "aws-kms:", "local:/x", "gcp-kms:projects/p", "azure-kv:vault/k"):
        with pytest.raises(ValueError, match="MERIDIAN_KMS"):
            Keks(bad, tmp_path / "kek.json")


async def test_cloud_kms_and_key_vault_seal_under_their_keys_and_take_a_rewrap(
    cloud_kms: CloudKms, tmp_path: Path
) -> None:
    """Google Cloud KMS and Azure Key Vault, each reached through its own credential library
    (tests/kits/cloud_kms.py stands in for the services): a secret sealed under one opens only
    as what it was sealed as, and a rewrap moves what the key file sealed to them, and from
    one to the other."""
    key_file = tmp_path / "kek.json"
    sealed = await Sealer(Keks("local", key_file)).seal(b"seed", "signing-key:k")
    gcp = f"gcp-kms:projects/p/locations/global/keyRings/meridian/cryptoKeys/kek-{new_name()}"
    azure = f"azure-kv:{cloud_kms.url}/keys/meridian-kek/{new_name()}"
    for setting in (gcp, azure):
        sealer = Sealer(Keks(setting, key_file))
        moved = await sealer.rewrap(sealed, "signing-key:k")
        assert moved is not None
        assert moved.kek_id == setting
        assert b"seed" not in moved.wrapped_key + moved.ciphertext
        fresh = Sealer(Keks(setting, tmp_path / "none.json"))  # no key file: the cloud alone
        assert await fresh.open(moved, "signing-key:k") == b"seed"
        with pytest.raises(SealError):  # bound to its context
            await Sealer(Keks(setting, tmp_path / "none.json")).open(moved, "signing-key:x")
        sealed = moved  # and on, from this cloud to the next
    assert {"gcp encrypt", "gcp decrypt", "azure wrapkey", "azure unwrapkey"} <= set(
        cloud_kms.calls
    )
    # a key the service cannot unwrap with says so, as a SealError
    other = f"azure-kv:{cloud_kms.url}/keys/meridian-kek/{new_name()}"
    forged = dataclasses.replace(sealed, kek_id=other)
    with pytest.raises(SealError):
        await Sealer(Keks(other, key_file)).open(forged, "signing-key:k")
