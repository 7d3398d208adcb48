"""The control plane's keys as one service: made at start, rotated on request, moved along
their steps by the leader, opened for the batch runner, and rewrapped under a new KEK.
Each call owns its transaction (signing.py has the steps)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from meridian_pb.fleet.v1.assertion import CONTROL_PLANE
from sqlalchemy import select

from controlplane.db.engine import Database
from controlplane.db.fleet_rows import RegionRow
from controlplane.db.key_rows import SigningKeyRow
from controlplane.errors import NotFound
from controlplane.services.revisions import RevisionFeed
from controlplane.services.sealing import signing
from controlplane.services.sealing.sealer import Sealer
from controlplane.services.unit import Doc, UnitOfWork
from controlplane.snapshot.keys import SIGNING

log = logging.getLogger(__name__)
SIGNER_FRESH_S = 2.0  # how long the batch runner's key is used before it is looked up again


class Keyring:
    def __init__(
        self,
        db: Database,
        sealer: Sealer,
        feed: RevisionFeed | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.db, self.sealer, self.feed, self.clock = db, sealer, feed, clock
        self._signer: tuple[float, str, Ed25519PrivateKey] | None = None

    async def ensure(self) -> int:
        """At start: every owner has a key that signs, and none is stored in clear."""
        async with self.db.sessions() as session, session.begin():
            uow = UnitOfWork(session, "keyring")
            made = await signing.ensure_keys(uow, self.sealer)
            revision = await uow.commit_revision()
        await self._published(revision)
        if made:
            log.info("made %d signing key(s)", made)
        return made

    async def rotate(self, owner: str, actor: str, *, immediate: bool = False) -> Doc:
        """Step 1 of a rotation of `owner`'s key (a region's name, or CONTROL_PLANE)."""
        async with self.db.sessions() as session, session.begin():
            uow = UnitOfWork(session, actor)
            region = None
            if owner != CONTROL_PLANE:
                region = await uow.get(RegionRow, "region", owner)
            row = await signing.rotate(uow, self.sealer, region, immediate=immediate)
            revision = await uow.commit_revision()
            assert revision is not None
            await signing.stamp(session, [row.kid], revision)
            doc = {"owner": owner, "kid": row.kid, "state": row.state, "revision": revision}
        await self._published(revision)
        return doc

    async def tick(self) -> list[signing.Step]:
        """The leader, every second: the steps whose wait is over."""
        async with self.db.sessions() as session, session.begin():
            uow = UnitOfWork(session, "keyring")
            steps = await signing.advance(session, uow, self.clock())
            revision = await uow.commit_revision()
            if revision is not None:
                await signing.stamp(session, [s.kid for s in steps], revision)
        await self._published(revision)
        for step in steps:
            log.info("signing key %s of %s: %s", step.kid, step.owner, step.done)
        return steps

    async def view(self) -> list[Doc]:
        """Every key, without its secret."""
        async with self.db.sessions() as session:
            names = dict((await session.execute(select(RegionRow.id, RegionRow.name))).all())
            rows = (
                await session.execute(select(SigningKeyRow).order_by(SigningKeyRow.id))
            ).scalars()
            return [{
                "owner": CONTROL_PLANE if r.region_id is None else names.get(r.region_id),
                "kid": r.kid, "state": r.state, "kek": r.kek_id, "created_at": r.created_at,
                "signs_from": r.signs_from, "retire_after": r.retire_after,
            } for r in rows]  # fmt: skip

    async def signer(self) -> tuple[str, Ed25519PrivateKey]:
        """The control plane's key that signs now (the batch runner's), looked up again every
        SIGNER_FRESH_S so that a rotation reaches it."""
        now = time.monotonic()
        if self._signer is None or now - self._signer[0] > SIGNER_FRESH_S:
            async with self.db.sessions() as session:
                kid = await session.scalar(
                    select(SigningKeyRow.kid).where(
                        SigningKeyRow.region_id.is_(None), SigningKeyRow.state == SIGNING
                    ).order_by(SigningKeyRow.id.desc()).limit(1)
                )  # fmt: skip
                if kid is None:
                    raise NotFound("the control plane has no signing key yet", kind=signing.KIND)
                if self._signer is None or self._signer[1] != kid:
                    seeds = await signing.open_seeds(session, self.sealer, [kid])
                    self._signer = (now, kid, signing.private_key(seeds[kid]))
            self._signer = (now, self._signer[1], self._signer[2])
        return self._signer[1], self._signer[2]

    async def rewrap(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Every sealed secret under the current KEK; how many moved. Each is opened before it
        is written, one transaction per secret: stopped midway, nothing is lost."""
        async with self.db.sessions() as session:
            ids = list((await session.execute(select(SigningKeyRow.id))).scalars())
        moved = 0
        for done, key_id in enumerate(ids, 1):
            async with self.db.sessions() as session, session.begin():
                row = await session.get(SigningKeyRow, key_id, with_for_update=True)
                if row is not None:
                    new = await self.sealer.rewrap(signing.sealed_of(row), signing.context(row.kid))
                    if new is not None:
                        row.kek_id, row.wrapped_key = new.kek_id, new.wrapped_key
                        moved += 1
            if progress is not None:
                progress(done, len(ids))
        return moved

    async def _published(self, revision: int | None) -> None:
        if revision is not None and self.feed is not None:
            await self.feed.published(revision)
