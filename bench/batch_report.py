"""`meridian bench batch`'s reading of its results: interactive misses (and those the
batch may be blamed for), failed lines by what they said, and the table."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from bench.load import Result

TTFT_S, ITL_S = 2.0, 0.05


def errors(file: bytes) -> dict[str, int]:
    """The error file's lines, counted by what each says (its status and message)."""
    said: Counter[str] = Counter()
    for line in file.splitlines():
        if not line:
            continue
        entry = orjson.loads(line)
        if entry.get("error"):
            said[f"{entry['error'].get('code')}: {entry['error'].get('message')}"[:160]] += 1
            continue
        response = entry.get("response") or {}
        body = response.get("body")
        error = body.get("error") if isinstance(body, dict) else body
        message = error.get("message") if isinstance(error, dict) else error
        said[f"{response.get('status_code')}: {message}"[:160]] += 1
    return dict(said.most_common(10))


def misses(results: list[Result]) -> dict[str, Any]:
    ok = [r for r in results if r.status == 200]
    misses = sum(1 for r in results if not r.meets(TTFT_S, ITL_S))
    ttfts = sorted(r.ttft_s for r in ok)
    p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else 0.0
    return {"requests": len(results), "slo_misses": misses, "refused": len(results) - len(ok),
            # of the answered misses, those whose first token came late, and those whose
            # tokens came too slowly after it (a request may be both)
            "ttft_over": sum(1 for r in ok if r.ttft_s > TTFT_S),
            "itl_over": sum(1 for r in ok if r.itl_s > ITL_S),
            "ttft_p99_s": round(p99, 4)}  # fmt: skip


def misses_in_time(results: list[Result], since: float) -> dict[int, int]:
    """Misses by the 10 s (from `since`) in which each was sent: when the batch hurt."""
    when: Counter[int] = Counter()
    for r in results:
        if not r.meets(TTFT_S, ITL_S):
            when[int((r.sent_at - since) // 10) * 10] += 1
    return dict(sorted(when.items()))


def attribute(result: dict[str, Any]) -> None:
    """Misses above the baseline's rate, per region: those the batch may be blamed for."""
    base, runs = result["results"]["baseline"], result["results"].get("batch")
    if runs is None:
        return
    for region, seen in runs["interactive"].items():
        rate = base[region]["slo_misses"] / max(1, base[region]["requests"])
        expected = rate * seen["requests"]
        seen["attributable_to_batch"] = max(0, round(seen["slo_misses"] - expected))


def report(console: Console, result: dict[str, Any]) -> None:
    runs = result["results"]
    batch = runs.get("batch")
    if batch is None:
        return
    b = batch["batch"]
    console.print(f"batch {b['status']}: {b['completed']} completed, {b['failed']} failed, "
                  f"{b['answered_once']} answered once, {b['answered_twice_or_more']} more "
                  f"than once; {batch['seconds']} s ({batch['lines_per_s']} lines/s)")  # fmt: skip
    for said, n in b.get("errors", {}).items():
        console.print(f"  {n} failed: {said}", highlight=False, markup=False)
    table = Table(title="per region")
    for column in (
        "region",
        "UTC offset h",
        "lines",
        "lines/s",
        "by local hour",
        "interactive SLO misses (baseline)",
        "with batch",
        "of which refused / TTFT / ITL",
        "admission wait p99 s",
        "engines' TTFT p99 s",
        "attributable",
    ):
        table.add_column(column, justify="right")
    for region, offset in result["offsets_h"].items():
        base, seen = runs["baseline"][region], batch["interactive"][region]
        hours = ", ".join(f"{h}: {n}" for h, n in
                          sorted(batch["by_local_hour"].get(region, {}).items()))  # fmt: skip
        table.add_row(
            region, f"{offset:+g}", str(batch["by_region"].get(region, 0)),
            f"{batch['per_region_lines_per_s'].get(region, 0)}", hours,
            f"{base['slo_misses']}/{base['requests']}",
            f"{seen['slo_misses']}/{seen['requests']}",
            f"{seen['refused']} / {seen['ttft_over']} / {seen['itl_over']}",
            f"{seen['admission_wait_p99_s']:.3f}", f"{seen['engine_ttft_p99_s']:.3f}",
            str(seen["attributable_to_batch"]),
        )  # fmt: skip
    console.print(table)
