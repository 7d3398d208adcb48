"""Each worker's recent answers, by detector, against its peers': the other workers of the
same kind (model, and where the snapshot says them, revision, quantization and hardware).
No I/O.

A worker fails a detector when, over its last `WINDOW` answers, it has at least
`MIN_ANSWERS` answers and `MIN_FLAGGED` flagged ones, its peers have at least `MIN_ANSWERS`
between them, and its share of flagged answers exceeds the peers' by more than chance
explains: `Z` standard errors of a share of its size at the peers' rate (the peers' rate
with one flagged and one clean answer added, so that clean peers still leave room for
chance), and twice the peers' rate. The bound is the peers' own: a workload where every
worker ends half its answers on the length cap fails none of them.

The evidence must be spread over several tenants and prompts: a tenant can make answers look
bad (and its prompts' shared prefix sends them all to one worker). So a worker that fails is
judged twice more: once with the tenant that gave most of its flagged answers left out, and
once with the prompt prefix (the first `PREFIX_BYTES` of the prompt) that gave most left out,
all their answers on both sides (the worker's and its peers'). It fails only if it still
fails both times, with `MIN_FLAGGED` flagged answers left: one tenant's answers, or one
prefix's, are never enough, however many.

A worker with no peer of its kind in the region is never judged here: the control plane
compares it with the same model elsewhere, and canaries with its references.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from meridian_pb.fleet.v1.judging import DETECTORS, MIN_ANSWERS, MIN_FLAGGED, bound

WINDOW = 200
EXAMPLES = 3  # request ids kept as evidence, per worker and detector
PREFIX_BYTES = 1024  # of the prompt as the prefix index keys it: a prompt's prefix


class Source(NamedTuple):
    """Where an answer's request came from: its tenant and its prompt's prefix (a hash)."""

    tenant: str
    prefix: int


class _Seen(NamedTuple):
    flags: frozenset[str]
    source: Source


@dataclass(frozen=True, slots=True)
class Finding:
    """A worker's failed detector, with its evidence."""

    worker: str
    detector: str
    share: float  # of its last answers, flagged
    answers: int
    peers_share: float
    peers_answers: int
    examples: tuple[str, ...]  # request ids of flagged answers


@dataclass
class _Record:
    flags: deque[_Seen] = field(default_factory=lambda: deque(maxlen=WINDOW))
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DETECTORS, 0))
    examples: dict[str, deque[str]] = field(default_factory=dict)

    def add(self, flags: frozenset[str], request_id: str, source: Source) -> None:
        if len(self.flags) == WINDOW:
            for name in self.flags[0].flags:
                self.counts[name] -= 1
        self.flags.append(_Seen(flags, source))
        for name in flags:
            self.counts[name] += 1
            self.examples.setdefault(name, deque(maxlen=EXAMPLES)).append(request_id)


class Book:
    def __init__(self) -> None:
        self._records: dict[str, _Record] = {}

    def record(self, worker: str, flags: frozenset[str], request_id: str, source: Source) -> None:
        """One ended answer of `worker`, the detectors it tripped, and where it came from."""
        record = self._records.get(worker)
        if record is None:
            record = self._records[worker] = _Record()
        record.add(flags, request_id, source)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the workers no longer in the snapshot."""
        kept = set(keep)
        for worker in [w for w in self._records if w not in kept]:
            del self._records[worker]

    def totals(self, workers: Iterable[str]) -> tuple[int, dict[str, int]]:
        """Of the last answers of these workers: how many, and how many each detector flagged."""
        answers, flagged = 0, dict.fromkeys(DETECTORS, 0)
        for worker in workers:
            record = self._records.get(worker)
            if record is not None:
                answers += len(record.flags)
                for name, n in record.counts.items():
                    flagged[name] += n
        return answers, flagged

    def findings(self, kinds: Mapping[str, str]) -> list[Finding]:
        """Every worker's failed detectors; `kinds`: each worker's kind (its peers share it)."""
        by_kind: dict[str, list[str]] = {}
        for worker, kind in kinds.items():
            if worker in self._records:
                by_kind.setdefault(kind, []).append(worker)
        out = []
        for workers in by_kind.values():
            if len(workers) < 2:
                continue
            for worker in workers:
                out.extend(self._judge(worker, [w for w in workers if w != worker]))
        return out

    def _judge(self, worker: str, peers: list[str]) -> list[Finding]:
        mine = self._records[worker]
        n = len(mine.flags)
        peers_n = sum(len(self._records[p].flags) for p in peers)
        if n < MIN_ANSWERS or peers_n < MIN_ANSWERS:
            return []
        found = []
        for name in DETECTORS:
            flagged = mine.counts[name]
            if flagged < MIN_FLAGGED:
                continue
            peers_flagged = sum(self._records[p].counts[name] for p in peers)
            share = flagged / n
            if share > bound(peers_flagged, peers_n, n) and self._spread(worker, peers, name):
                found.append(Finding(worker, name, round(share, 4), n,
                                     round(peers_flagged / peers_n, 4), peers_n,
                                     tuple(mine.examples.get(name, ()))))  # fmt: skip
        return found

    def _spread(self, worker: str, peers: list[str], detector: str) -> bool:
        """The worker still fails `detector` with the tenant, and then the prefix, that gave
        most of its flagged answers left out (their answers on both sides)."""
        mine = self._records[worker].flags
        theirs = [seen for p in peers for seen in self._records[p].flags]
        for part in (0, 1):  # Source.tenant, Source.prefix
            top = Counter(s.source[part] for s in mine if detector in s.flags).most_common(1)
            if not top:
                return False
            out = top[0][0]
            n, flagged = _count(mine, detector, part, out)
            peers_n, peers_flagged = _count(theirs, detector, part, out)
            if peers_n < MIN_ANSWERS or flagged < MIN_FLAGGED:
                return False
            if flagged / n <= bound(peers_flagged, peers_n, n):
                return False
        return True


def _count(seen: Iterable[_Seen], detector: str, part: int, out: object) -> tuple[int, int]:
    """Answers, and those `detector` flagged, of sources other than `out` (by `part`)."""
    n = flagged = 0
    for s in seen:
        if s.source[part] != out:
            n += 1
            flagged += detector in s.flags
    return n, flagged
