"""The loops exactly one replica runs, the leader: the liveness sweeper, the rollup, the
rollout driver, the quota leases, the steps of signing keys' rotations (every tick: one
second), where adapters stay loaded and
the capacity planner (every period of its own) and the batch runner (a task of its own
while it leads)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from controlplane.coord.base import Coordinator, logged_and_passed
from controlplane.db.engine import Database
from controlplane.services.batches.runner import BatchRunner
from controlplane.services.liveness import Sweeper, rollup
from controlplane.services.planner.loop import Planner
from controlplane.services.preemptions import Preemptions
from controlplane.services.quotas.leaser import Leaser
from controlplane.services.residency import Residency
from controlplane.services.rollouts.driver import RolloutDriver
from controlplane.services.sealing.keyring import Keyring
from controlplane.services.usage.reconcile import Reconciler

log = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(UTC)


class Singletons:
    def __init__(
        self,
        coordinator: Coordinator,
        db: Database,
        *,
        down_after: timedelta,
        sweep_every_s: float = 1.0,
        rollup_every_s: float = 5.0,
        keep_samples: timedelta = timedelta(minutes=15),
        clock: Callable[[], datetime] = utc_now,
        rollouts: RolloutDriver | None = None,
        leaser: Leaser | None = None,
        planner: Planner | None = None,
        preemptions: Preemptions | None = None,
        batches: BatchRunner | None = None,
        reconciler: Reconciler | None = None,
        residency: Residency | None = None,
        keyring: Keyring | None = None,
    ) -> None:
        self._keyring = keyring
        self._reconciler = reconciler
        self._residency = residency
        self._coord = coordinator
        self._db = db
        self._down_after = down_after
        self._sweeper = Sweeper(db, down_after)
        self._sweep_every_s = sweep_every_s
        self._rollup_every_s = rollup_every_s
        self._keep = keep_samples
        self._clock = clock
        self._rollouts = rollouts
        self._leaser = leaser
        self._planner = planner
        self._preemptions = preemptions
        self._task: asyncio.Task[None] | None = None
        self._planning: asyncio.Task[None] | None = None
        self._batches = batches
        self._batching: asyncio.Task[None] | None = None
        self.leading_since: datetime | None = None

    async def tick(self, last_rollup: datetime | None) -> datetime | None:
        """One round; returns when the rollup last ran."""
        now = self._clock()
        if not self._coord.is_leader():
            if self.leading_since is not None:
                log.info("no longer the leader; singleton loops pause")
            self.leading_since = None
            if self._leaser is not None:
                self._leaser.resign()
            if self._planner is not None:
                if self._planning is not None:
                    self._planning.cancel()  # a plan under way is no longer this replica's
                self._planner.resign()
            if self._batching is not None:
                self._batching.cancel()  # the next leader sends what was under way again
                self._batching = None
            return last_rollup
        if self.leading_since is None:
            log.info("leading: running the liveness sweeper and the capacity rollup")
            self.leading_since = now
            self._sweeper = Sweeper(self._db, self._down_after)  # absences count from now
        present = set(await self._coord.connected_agents())
        await self._sweeper.sweep(present, now)
        if self._preemptions is not None:
            try:
                if await self._preemptions.tick() and self._planner is not None:
                    self._planner.soon()
            except Exception:
                log.exception("taking preempted nodes out of placement failed; will retry")
        if self._rollouts is not None:
            try:
                await self._rollouts.tick()
            except Exception:
                log.exception("the rollout driver failed; it will try again")
        if self._leaser is not None:
            try:
                await self._leaser.tick(set(present))
            except Exception:
                log.exception("the quota leases failed; they will be tried again")
        if self._reconciler is not None:
            try:
                await self._reconciler.tick()
            except Exception:
                log.exception("reconciling the ledger with the engines failed; will retry")
        if self._keyring is not None:
            try:
                await self._keyring.tick()
            except Exception:
                log.exception("moving signing keys along their rotation failed; will retry")
        if self._residency is not None:
            try:
                await self._residency.tick()
            except Exception:
                log.exception("planning where adapters stay loaded failed; will retry")
        if self._planner is not None and (self._planning is None or self._planning.done()):
            # its own task: a cloud slow to answer holds no lease, sweep or rollout meanwhile
            self._planning = asyncio.create_task(self._plan(self._planner), name="planner")
        if self._batches is not None and (self._batching is None or self._batching.done()):
            self._batching = asyncio.create_task(self._batches.run(), name="batches")
        if last_rollup is None or (now - last_rollup).total_seconds() >= self._rollup_every_s:
            await rollup(self._db, now, self._keep)
            return now
        return last_rollup

    @staticmethod
    async def _plan(planner: Planner) -> None:
        try:
            await planner.tick()
        except Exception:
            log.exception("the capacity planner failed; it will try again next period")

    async def _run(self) -> None:
        last_rollup: datetime | None = None
        while True:
            with logged_and_passed(log, "a singleton loop failed; will retry"):
                last_rollup = await self.tick(last_rollup)
            await asyncio.sleep(self._sweep_every_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="singletons")

    async def stop(self) -> None:
        for task in (self._task, self._planning, self._batching):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
