"""The router's books checked against the engines': a request in flight from here that the
engine has not held for AUDIT_S is a reservation that leaked, and is repaired."""

from __future__ import annotations

import logging

from agents.router.router import Router

log = logging.getLogger(__name__)

AUDIT_S = 10.0  # how long a worker's books must disagree with its engine's to be repaired
AUDIT_GRACE_S = 1.0  # a request sent this shortly before a poll may not have reached it yet
AUDIT_FRESH_S = 2.0  # an older poll says nothing of now


def audit(router: Router) -> list[tuple[str, int]]:
    """Each worker's requests in flight from here against what its engine says it holds.
    Tickets idle since before a poll (sent, or their answer last moved, AUDIT_GRACE_S before
    it: a stream still being relayed is alive whatever the engine says) that the engine
    cannot account for, at every fresh poll for AUDIT_S, are ended (oldest first) as if
    their client had left. Other gateways' requests count in the engine's number too, so a
    leak may show only once they are quiet; it is never repaired twice. Returns (worker,
    tickets ended) for each repair."""
    now = router.clock()
    repaired = []
    for worker_id, live in router.live.items():
        view, entry = router.views.get(worker_id), router.table.get(worker_id)
        if view is None or entry is None:  # it left the snapshot, and its books with it
            live.clear()
            continue
        excess = 0
        if entry.reachable and now - entry.load.at < AUDIT_FRESH_S:
            idle_before = entry.load.at - AUDIT_GRACE_S  # the engine had them by its poll
            ours = sum(1 for t in live.values() if t.active_at < idle_before)
            excess = ours - (entry.load.running + entry.load.waiting)
        ending = view.audited(excess, now, AUDIT_S)
        if not ending:
            continue
        oldest = sorted(live.values(), key=lambda t: t.active_at)[:ending]
        for ticket in oldest:
            router.abandoned(ticket)
        router.books.repairs[worker_id] += len(oldest)
        repaired.append((worker_id, len(oldest)))
        log.warning(
            "worker %s: %d request(s) in flight from here that its engine has not held "
            "for %.0f s were ended: a reservation leaked, and is repaired",
            worker_id, len(oldest), AUDIT_S, extra={"worker": worker_id},
        )  # fmt: skip
    router.live = {w: live for w, live in router.live.items() if live}
    return repaired
