"""The quality guard across regions: each region's figures per model (what its agents'
detectors flagged, its canaries' scores, the workers its agents hold), and each region
compared with the same model's other regions. No I/O: the leader's rollup feeds it.

A region's own agents judge each worker against the region's other workers; a region where
every worker answers alike wrong (wrong weights or template rolled out to the whole region,
a kernel bug of its hardware) passes there. Here it is judged by the same rules against the
other regions instead:

- a detector flags a larger share of the region's answers than of the other regions' by
  more than chance explains (agents/quality/peers.py's bound, the regions taken as peers);
- its canaries' median score lies below the other regions' by more than their spread
  (agents/quality/canary.py's `judge`), on the same reference;
- its replicas' majority continued a golden prompt differently from the other regions'
  (a different reference), where most regions agree on one.

A flagged region is an alert for the operator; nothing is taken out of rotation from here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from statistics import median
from typing import Any

from meridian_pb.fleet.v1.judging import DETECTORS, MIN_ANSWERS, MIN_FLAGGED, bound, judge


def region_quality(live: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model, a region's figures from its live nodes' latest telemetry: answers and
    flags summed (each answer passed one gateway), each canary's score the median over the
    nodes that scored it on the same reference, and the workers held, with their evidence."""
    out: dict[str, dict[str, Any]] = {}

    def model(name: str) -> dict[str, Any]:
        return out.setdefault(name, {"answers": 0, "flagged": dict.fromkeys(DETECTORS, 0),
                                     "canaries": {}, "held": {}})  # fmt: skip

    for telemetry in live:
        for q in telemetry.get("quality", []):
            doc = model(str(q.get("model", "")))
            doc["answers"] += int(q.get("answers", 0))
            for name, n in (q.get("flagged") or {}).items():
                doc["flagged"][name] = doc["flagged"].get(name, 0) + int(n)
            for c in q.get("canaries", []):
                key = (str(c.get("name")), str(c.get("reference")))
                doc["canaries"].setdefault(key, []).append(float(c.get("score", 0.0)))
        for e in telemetry.get("quality_held", []):
            model(str(e.get("model", "")))["held"][str(e.get("worker"))] = dict(e)
    for doc in out.values():
        doc["canaries"] = [{"name": n, "reference": r, "score": round(median(s), 4)}
                           for (n, r), s in sorted(doc["canaries"].items())]  # fmt: skip
        doc["held"] = [doc["held"][w] for w in sorted(doc["held"])]
    return out


def compare(regions: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per model: each region's figures (`regions`: region -> model -> region_quality's),
    and the regions flagged against the model's others, each with its evidence."""
    by_model: dict[str, dict[str, Mapping[str, Any]]] = {}
    for region, models in regions.items():
        for name, doc in models.items():
            by_model.setdefault(name, {})[region] = doc
    out = {}
    for name, docs in sorted(by_model.items()):
        flagged = _detectors(docs) + _canaries(docs)
        out[name] = {
            "regions": {
                r: {
                    "answers": d["answers"],
                    "flagged_share": {k: round(n / d["answers"], 4) if d["answers"] else 0.0
                                      for k, n in d["flagged"].items()},
                    "canaries": d["canaries"],
                    "held": d["held"],
                }
                for r, d in sorted(docs.items())
            },
            "flagged": flagged,
            "alert": (f"{len(flagged)} finding(s): "
                      + "; ".join(f"{f['region']} {f['check']}" for f in flagged))
            if flagged else None,
        }  # fmt: skip
    return out


def _detectors(docs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for region, mine in docs.items():
        n = int(mine["answers"])
        others = [d for r, d in docs.items() if r != region]
        peers_n = sum(int(d["answers"]) for d in others)
        if n < MIN_ANSWERS or peers_n < MIN_ANSWERS:
            continue
        for check in DETECTORS:
            flagged = int(mine["flagged"].get(check, 0))
            peers_flagged = sum(int(d["flagged"].get(check, 0)) for d in others)
            if flagged >= MIN_FLAGGED and flagged / n > bound(peers_flagged, peers_n, n):
                out.append({"region": region, "check": check, "figure": round(flagged / n, 4),
                            "peers_figure": round(peers_flagged / peers_n, 4)})  # fmt: skip
    return out


def _canaries(docs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    scores: dict[str, dict[str, tuple[str, float]]] = {}  # canary: region: (reference, score)
    for region, doc in docs.items():
        for c in doc["canaries"]:
            scores.setdefault(c["name"], {})[region] = (c["reference"], c["score"])
    out: list[dict[str, Any]] = []
    for canary, regions in sorted(scores.items()):
        if len(regions) < 3:
            continue  # of two that differ, neither can be told the odd one
        tally = Counter(ref for ref, _ in regions.values())
        common, votes = tally.most_common(1)[0]
        if votes * 2 <= len(regions):
            continue
        same = {}
        for region, (ref, score) in sorted(regions.items()):
            if ref != common:
                out.append({"region": region, "check": f"canary:{canary}:reference",
                            "figure": None, "peers_figure": None})  # fmt: skip
            else:
                same[region] = score
        for verdict in judge(same).values():
            if not verdict.passed:
                out.append({"region": verdict.worker, "check": f"canary:{canary}",
                            "figure": verdict.score, "peers_figure": verdict.bound})  # fmt: skip
    return out
