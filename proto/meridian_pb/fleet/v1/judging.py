"""How a worker's answers are judged against its peers': part of the contract between the
planes, since a region's agents judge each worker against the region's others
(agents/quality) and the control plane judges each region against the others by the same
rules (controlplane/services/quality.py). Written once, for both.

- Detectors: what an ended answer is flagged for, by name.
- Flagged shares: a worker fails a detector when it has at least `MIN_ANSWERS` answers and
  `MIN_FLAGGED` flagged ones, its peers at least `MIN_ANSWERS` between them, and its share
  of flagged answers is past `bound`: `Z` standard errors of a share of its size at the
  peers' rate (with one flagged and one clean answer added), and twice the peers' rate.
- Canaries: a worker fails one when its score lies below its peers' median by more than `K`
  times their spread (the median absolute deviation, scaled to a standard deviation) and by
  more than `FLOOR` nats a token; judged against the score the canary was made with alone,
  the bound is `LONE` below it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping
from dataclasses import dataclass

DETECTORS = ("repetition", "length", "empty", "foreign", "invalid")
MIN_ANSWERS = 10
MIN_FLAGGED = 5
Z = 4.0
K = 6.0
FLOOR = 0.05  # nats a token
SCALE = 1.4826  # MAD to a standard deviation, for normal noise
LONE = 0.2  # nats a token below the score it was made with: a lone worker's bound


def bound(peers_flagged: int, peers_n: int, n: int) -> float:
    """The share of `n` answers past which a worker's flags are more than chance, at its
    peers' rate (with one flagged and one clean answer added)."""
    rate = (peers_flagged + 1) / (peers_n + 2)
    return max(2 * rate, rate + Z * math.sqrt(rate * (1 - rate) / n))


@dataclass(frozen=True, slots=True)
class Verdict:
    worker: str
    score: float
    peers_median: float
    bound: float  # the least score that passes
    passed: bool


def judge(
    scores: Mapping[str, float], expected: float | None = None, held: Collection[str] = ()
) -> dict[str, Verdict]:
    """Each worker's score of one canary against the others' (not those `held` out of
    rotation: they are no reference) and, when the canary was made from its replicas'
    majority, the score they had then (`expected`). Against one other worker a departure
    cannot be told from the peer's own: no verdict. Against `expected` alone (the model's
    last worker in rotation) the bound is `LONE` below it, wider than any spread."""
    out = {}
    for worker, mine in scores.items():
        peers = [s for w, s in scores.items() if w != worker and w not in held]
        if expected is not None:
            peers.append(expected)
        if not peers or (len(peers) < 2 and expected is None):
            continue
        median = statistics.median(peers)
        spread = SCALE * statistics.median(abs(s - median) for s in peers)
        bound = median - (LONE if len(peers) == 1 else max(K * spread, FLOOR))
        out[worker] = Verdict(worker, round(mine, 4), round(median, 4), round(bound, 4),
                              mine >= bound)  # fmt: skip
    return out
