"""Signing keys: each region's (it signs the requests it escalates) and the control plane's
(it signs the batch lines it sends), sealed at rest, rotated without a failed request.

A rotation (`meridian keys rotate signing-key`) goes in three steps, each a revision:

1. **published**: the new key is made; every region that trusts the owner gets its public
   half, while the owner goes on signing with the old one.
2. **signing**: once every agent that is up holds that revision, the new key signs and the
   old one is *retiring*: still accepted everywhere.
3. **gone**: once every agent that is up holds the revision of step 2 (none signs with the
   old key any more), the old key is kept for an assertion's lifetime and a margin more,
   then dropped: an assertion it signed can no longer be valid.

`immediate` (a key thought compromised) skips the waits: the new key signs at once and the
old ones are dropped in the same revision. Requests in flight signed by an old key fail.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from meridian_pb.fleet.v1.assertion import CONTROL_PLANE, TTL_S
from sqlalchemy import delete, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from controlplane.db.batch_rows import BatchSignerRow
from controlplane.db.fleet_rows import FallbackPeerRow, FallbackRuleRow, NodeRow, RegionRow
from controlplane.db.key_rows import SigningKeyRow
from controlplane.services.sealing.sealer import Sealed, Sealer
from controlplane.services.unit import UnitOfWork
from controlplane.snapshot.keys import PUBLISHED, RETIRING, SIGNING, public_key
from controlplane.snapshot.types import FleetState, KeyState

KIND = "signing-key"  # in the audit log
KEYS_LOCK = 0x6B657973  # pg_advisory_xact_lock's key: one replica makes keys at a time
RETIRE_MARGIN_S = 10.0  # past an assertion's lifetime, for clocks that differ


def context(kid: str) -> str:
    return f"{KIND}:{kid}"


def sealed_of(row: SigningKeyRow) -> Sealed:
    return Sealed(row.kek_id, row.wrapped_key, row.nonce, row.ciphertext)


async def make_key(
    uow: UnitOfWork, sealer: Sealer, region: RegionRow | None, state: str, seed: bytes | None = None
) -> SigningKeyRow:
    """A new key of `region` (None: the control plane), sealed, recorded for the audit."""
    seed = os.urandom(32) if seed is None else seed
    kid, public = public_key(base64.b64encode(seed).decode())
    sealed = await sealer.seal(seed, context(kid))
    row = SigningKeyRow(
        region_id=None if region is None else region.id, kid=kid,
        public_key=base64.b64decode(public), state=state, kek_id=sealed.kek_id,
        wrapped_key=sealed.wrapped_key, nonce=sealed.nonce, ciphertext=sealed.ciphertext,
        signs_from=datetime.now(UTC) if state == SIGNING else None,
    )  # fmt: skip
    uow.session.add(row)
    owner = CONTROL_PLANE if region is None else region.name
    uow.record("create", KIND, kid, None, {"owner": owner, "state": state})
    return row


async def ensure_keys(uow: UnitOfWork, sealer: Sealer) -> int:
    """At start, under a lock: every region and the control plane has a key that signs. A seed
    stored in clear (before keys were sealed) is sealed and cleared, the same key; an owner
    without any gets a new one. How many keys were made new (each is a change to push)."""
    session = uow.session
    await session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": KEYS_LOCK})
    owners = set((await session.execute(
        select(SigningKeyRow.region_id).where(SigningKeyRow.state == SIGNING)
    )).scalars())  # fmt: skip
    made = 0
    for region in (await session.execute(select(RegionRow))).unique().scalars():
        if region.id not in owners:
            made += region.signing_key is None
            await make_key(uow, sealer, region, SIGNING, region.signing_key)
        region.signing_key = None
    legacy = await session.scalar(select(BatchSignerRow.seed))
    if None not in owners:
        made += legacy is None
        await make_key(uow, sealer, None, SIGNING, legacy)
    await session.execute(delete(BatchSignerRow))
    if made == 0:
        uow.changes.clear()  # the same keys, sealed: nothing a region would see changed
    return made


async def rotate(
    uow: UnitOfWork, sealer: Sealer, region: RegionRow | None, *, immediate: bool
) -> SigningKeyRow:
    """Step 1 (or, immediate, all at once): a new key of the owner."""
    owned = _owned(region)
    if not immediate:
        return await make_key(uow, sealer, region, PUBLISHED)
    old = list((await uow.session.execute(select(SigningKeyRow).where(owned))).scalars())
    for row in old:
        await uow.session.delete(row)
        uow.record("delete", KIND, row.kid, {"state": row.state}, None)
    return await make_key(uow, sealer, region, SIGNING)


def _owned(region: RegionRow | None) -> ColumnElement[bool]:
    return (SigningKeyRow.region_id.is_(None) if region is None
            else SigningKeyRow.region_id == region.id)  # fmt: skip


@dataclass(frozen=True)
class Step:
    kid: str
    owner: str
    done: str  # signing | retiring | dropped


async def advance(session: AsyncSession, uow: UnitOfWork, now: datetime) -> list[Step]:
    """Steps 2 and 3 for every key whose wait is over (the leader, every second). Step 2 waits
    for the regions that take the owner's signatures (their snapshots carry its keys; a region
    whose snapshot did not change is not sent the revision, so no other is waited for); step
    3, for the owner's own agents (the only ones that sign with it)."""
    held = await _held(session)
    takers = await _takers(session)
    names = dict((await session.execute(select(RegionRow.id, RegionRow.name))).all())
    rows = list((await session.execute(
        select(SigningKeyRow).order_by(SigningKeyRow.id).with_for_update()
    )).scalars())  # fmt: skip
    steps = []
    for row in rows:
        owner = CONTROL_PLANE if row.region_id is None else names.get(row.region_id, "?")
        waited = takers.get(row.region_id, set()) if row.state == PUBLISHED else {row.region_id}
        reached = row.state_revision is not None and all(
            held.get(region, row.state_revision) >= row.state_revision for region in waited
        )
        if row.state == PUBLISHED and reached:
            for old in rows:
                if old.region_id == row.region_id and old.state == SIGNING:
                    old.state, old.retire_after = RETIRING, None
                    uow.record("update", KIND, old.kid, {"state": SIGNING}, {"state": RETIRING})
                    steps.append(Step(old.kid, owner, RETIRING))
            row.state, row.signs_from = SIGNING, now
            uow.record("update", KIND, row.kid, {"state": PUBLISHED}, {"state": SIGNING})
            steps.append(Step(row.kid, owner, SIGNING))
        elif row.state == RETIRING and reached and row.retire_after is None:
            row.retire_after = now + timedelta(seconds=TTL_S + RETIRE_MARGIN_S)
        elif row.state == RETIRING and row.retire_after is not None and now >= row.retire_after:
            await session.delete(row)
            uow.record("delete", KIND, row.kid, {"state": RETIRING}, None)
            steps.append(Step(row.kid, owner, "dropped"))
    return steps


async def _held(session: AsyncSession) -> dict[int | None, int]:
    """Per region, the oldest revision an agent of it that is up holds (regions with none up
    are not listed: nothing is waited for there)."""
    rows = await session.execute(
        select(NodeRow.region_id, func.min(func.coalesce(NodeRow.applied_revision, 0)))
        .where(NodeRow.health == "up").group_by(NodeRow.region_id)
    )  # fmt: skip
    return {region: int(oldest) for region, oldest in rows}


async def _takers(session: AsyncSession) -> dict[int | None, set[int | None]]:
    """Per owner (a region's id; None, the control plane), the regions whose snapshots carry
    its public keys: those its fallback rules name as peers (as the compiler's `_trusted`);
    every region takes the control plane's."""
    out: dict[int | None, set[int | None]] = {
        None: set((await session.execute(select(RegionRow.id))).scalars())
    }
    rows = await session.execute(
        select(FallbackRuleRow.region_id, FallbackPeerRow.region_id)
        .join(FallbackPeerRow, FallbackPeerRow.rule_id == FallbackRuleRow.id)
    )  # fmt: skip
    for sender, peer in rows:
        out.setdefault(sender, set()).add(peer)
    return out


async def stamp(session: AsyncSession, kids: list[str], revision: int) -> None:
    """The revision the keys' last change went out in, once it is committed."""
    await session.flush()  # a key made in this transaction is written first
    await session.execute(
        update(SigningKeyRow).where(SigningKeyRow.kid.in_(kids)).values(state_revision=revision)
    )


async def read_keys(session: AsyncSession) -> dict[str, list[KeyState]]:
    """Every owner's keys as the snapshot compiler sees them: public halves only."""
    names = dict((await session.execute(select(RegionRow.id, RegionRow.name))).all())
    out: dict[str, list[KeyState]] = {}
    rows = await session.execute(select(SigningKeyRow).order_by(SigningKeyRow.id))
    for row in rows.scalars():
        owner = CONTROL_PLANE if row.region_id is None else names.get(row.region_id)
        if owner is not None:
            out.setdefault(owner, []).append(KeyState(
                kid=row.kid, public_key=base64.b64encode(row.public_key).decode(), state=row.state
            ))  # fmt: skip
    return dict(sorted(out.items()))


async def open_seeds(session: AsyncSession, sealer: Sealer, kids: list[str]) -> dict[str, bytes]:
    """The seeds of `kids`, opened (the KMS is asked once per key and process)."""
    rows = await session.execute(select(SigningKeyRow).where(SigningKeyRow.kid.in_(kids)))
    return {row.kid: await sealer.open(sealed_of(row), context(row.kid)) for row in rows.scalars()}


def private_key(seed: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(seed)


class Seeds:
    """The push hub's fleet, with the seed of each key that signs opened: what a region's own
    agents are sent. Opened once per key and process; a key that will not open (its KMS
    unreachable) fails the compile, so that agents keep the snapshot they have rather than
    get one without their key."""

    def __init__(self, sealer: Sealer) -> None:
        self.sealer = sealer
        self._opened: dict[str, str] = {}  # kid → seed, base64
        self._last: tuple[object, dict[str, list[KeyState]]] | None = None

    async def fill(self, session: AsyncSession, state: FleetState) -> FleetState:
        keys = state.signing_keys
        if self._last is None or self._last[0] is not keys:
            wanted = [k.kid for held in keys.values() for k in held
                      if k.state == SIGNING and k.kid not in self._opened]  # fmt: skip
            for kid, seed in (await open_seeds(session, self.sealer, wanted)).items():
                self._opened[kid] = base64.b64encode(seed).decode()
            filled = {
                owner: [k.model_copy(update={"seed": self._opened[k.kid]})
                        if k.state == SIGNING and k.kid in self._opened else k for k in held]
                for owner, held in keys.items()
            }  # fmt: skip
            self._last = (keys, filled)
        return state.model_copy(update={"signing_keys": self._last[1]})
