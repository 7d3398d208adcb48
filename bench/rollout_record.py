"""What a run of `meridian bench rollout` records and prints (bench/rollout.py): the rollout's
checks through each harmful change, and the tables."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table


async def watch(
    admin: httpx.AsyncClient, revision: int, since: float, timeline: list[dict[str, Any]]
) -> None:
    """The rollout's wave, state and checks every half second, when they change."""
    last = None
    while True:
        try:
            row = (await admin.get("/v1/rollouts")).json()["rollout"]
        except (httpx.HTTPError, ValueError):
            row = None
        if row is not None and row["revision"] == revision:
            seen = (row["wave"], row["state"], [(c["check"], c.get("model"), c["verdict"],
                                                 c["figure"]) for c in row["checks"]])  # fmt: skip
            if seen != last:
                last = seen
                timeline.append({"at_s": round(time.monotonic() - since, 2), "wave": row["wave"],
                                 "state": row["state"], "checks": row["checks"]})  # fmt: skip
        await asyncio.sleep(0.5)


def report(console: Console, result: dict[str, Any]) -> None:
    base = result["baseline"]
    console.print(f"baseline: {base['bad_share']:.1%} of {base['requests']} requests failed "
                  "or missed the SLO")  # fmt: skip
    table = Table(title="harmful changes, each to every region in one revision")
    for column in ("change", "outcome", "regions that held it", "write → rollback s",
                   "→ in force s", "requests harmed (over baseline)", "caught by"):  # fmt: skip
        table.add_column(column)
    for h in result["harmful"]:
        table.add_row(h["change"], h["state"], str(h["regions_held"]),
                      f"{h['write_to_rollback_s']:.1f}", f"{h['write_to_rollback_in_force_s']:.1f}",
                      f"{h['harm_share']:.2%} of {h['requests']}", h["reason"][:60])  # fmt: skip
    console.print(table)
    runs: dict[str, list[dict[str, Any]]] = {}
    for h in result["harmful"]:
        runs.setdefault(h["change"], []).append(h)
    for name, each in runs.items():
        held = max(h["regions_held"] for h in each)
        harm = max(h["harm_share"] for h in each)
        slowest = max(h["write_to_rollback_s"] for h in each)
        failed = sum(not h["contained"] for h in each)
        console.print(f"{name}: {len(each)} runs, {failed} not contained; at worst "
                      f"{held} regions held it, {harm:.2%} harmed, rolled back "
                      f"{slowest:.1f} s after the write")  # fmt: skip
    good = result["good"]
    w = good["write_to_last_region"]
    took = f"write → complete p50 {w['p50_s']:.1f} s, max {w['max_s']:.1f} s" if w else "none"
    console.print(f"good changes: {good['changes']}, outcomes {good['outcomes']}, false "
                  f"rollbacks {good['false_rollbacks']}; {took}")  # fmt: skip
    for reason in good["not_complete"]:
        console.print(f"  {reason[:200]}")
    r = result["revocation"]
    console.print(f"revocation while a rollout is {r['rollout_state_meanwhile']}: p50 "
                  f"{r['p50_s']:.3f} s, p99 {r['p99_s']:.3f} s over {r['samples']} "
                  "(region, key)")  # fmt: skip
