"""`meridian bench ledger`: what the usage ledger costs and how fast it goes.

- **A record's cost on the request's path**, in this process: a usage record made from what a
  request came to (`Settled`), priced, and copied into the journal, CPU µs each (best of five
  runs). The overhead benchmark measures the same end to end: `meridian_tenant` beside
  `meridian_tenant_no_ledger`.
- **Shipping**: records already in an agent's journal (as after a control-plane outage) when
  the agent starts, until PostgreSQL holds every one: records a second from one agent, over
  its gRPC stream, stored by the control plane.
- **Reports**: `GET /v1/usage` for a month over `--records` records (many tenants, models and
  regions), by month and tenant, by day, tenant and model, and one tenant's by day, from the
  sums by quarter hour; by month and tenant in a zone half an hour off UTC, from the same
  sums; and by month and tenant from a second past midnight (its first quarter hour from the
  records, the rest from the sums): seconds, the median and the worst of five.
- **A spend budget under concurrency** (bench/budget.py): Meridian's reservations and leases
  against a check-then-increment limiter, on the same workload: overspend and false refusals.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import timeit
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.prices import PriceList
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from agents.config import ModelConfig, RegionConfig, Tenant
from agents.ledger.journal import Journal
from agents.ledger.record import Ledger
from agents.metrics import Settled
from bench import budget, plots
from bench.harness import IMMEDIATE, apply, start_agent, start_control_on_db
from controlplane.db.engine import Database
from controlplane.services.usage.store import UsageStore

REGION, NODE, MODEL = "bench", "bench-1", "bench-model"


async def sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(statement.encode())
        return await cursor.fetchall() if cursor.description else []


TENANTS, MODELS, REGIONS = 50, 5, 3
STORE_BATCH = 2000


@dataclass
class Options:
    records: int = 1_000_000  # in the database, for the report
    shipped: int = 100_000  # in one agent's journal, for shipping
    out: Path | None = None
    root: Path = Path(".")


def record_cost(number: int = 20_000) -> dict[str, float]:
    """CPU µs a usage record costs the request: made, priced and journaled."""
    prices = PriceList([(0, 150_000, 75_000, 600_000)], {"batch": 0.5})
    tenant = Tenant("acme", "standard", None, None, None)
    config = RegionConfig(1, "", REGION, "local", "local",
                          models={MODEL: ModelConfig(MODEL, 8192, frozenset(), "", prices)},
                          tenants={"acme": tenant})  # fmt: skip
    settled = Settled(model=MODEL, tenant="acme", worker="w1", first_at=1.0,
                      completion_tokens=120, prompt_tokens=800, cached_tokens=512,
                      routed_prompt=800, routed_cached=512, policy="cost", load=1.0,
                      service_class="standard", waited_s=0.01, key="mk-abcdef")  # fmt: skip
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as directory:
        journal = Journal(Path(directory))
        journal.start()
        ledger = Ledger(journal, lambda: NODE)
        try:
            runs = timeit.repeat(
                lambda: ledger.note("req-0123456789", config, 200, settled, "ok", 1.0, 1.5),
                number=number, repeat=5,
            )  # fmt: skip
            out["record_us"] = round(min(runs) / number * 1e6, 2)
            unpriced = RegionConfig(1, "", REGION, "local", "local", tenants={"acme": tenant})
            runs = timeit.repeat(
                lambda: ledger.note("req-0123456789", unpriced, 200, settled, "ok", 1.0, 1.5),
                number=number, repeat=5,
            )  # fmt: skip
            out["unpriced_record_us"] = round(min(runs) / number * 1e6, 2)
        finally:
            journal.close()
    return out


def _document() -> dict[str, Any]:
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "local", "provider": "onprem"}],
        "regions": [{"name": REGION, "cloud": "local", "geography": "local",
                     "jurisdiction": "local"}],
        "nodes": [{"name": NODE, "region": REGION, "hostname": "127.0.0.1"}],
        "models": [{"name": MODEL, "source": "meridian/sim", "context_length": 8192}],
        "rollout_policies": IMMEDIATE,
    }  # fmt: skip


def _records(count: int, month: datetime, start: int = 0) -> list[pb.UsageRecord]:
    """Records spread over the month, many tenants, models and regions."""
    span = 28 * 86400 * 1_000_000
    base = int(month.timestamp() * 1e6)
    return [
        pb.UsageRecord(
            id=f"bench-{n}", seq=n + 1, request_id=f"r{n}", kind="served",
            tenant=f"tenant-{n % TENANTS}", api_key=f"mk-{n % (TENANTS * 2):06d}",
            model=f"model-{n % MODELS}", answered_model=f"model-{n % MODELS}",
            service_class="standard", prompt_tokens=500 + n % 700, cached_tokens=n % 300,
            completion_tokens=50 + n % 400, started_us=base + (n * 7919) % span,
            ended_us=base + (n * 7919) % span + 800_000, outcome="ok", status=200,
            cost_nanos=(500 + n % 700) * 150 + (50 + n % 400) * 600,
        )
        for n in range(start, start + count)
    ]  # fmt: skip


async def _shipping(options: Options, root: Path, console: Console) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        with console.status("a control plane on PostgreSQL"):
            cp, admin, url = await start_control_on_db(stack, root)
            await apply(admin, _document())
        month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        journal = Journal(root / NODE / "ledger")
        for record in _records(options.shipped, month):
            record.id = ""  # the journal names it
            journal.append(record)
        journal.close()
        started = time.monotonic()
        await start_agent(stack, root, cp, admin, REGION, NODE, "operator-token-bench")
        with Progress(console=console) as progress:
            task = progress.add_task("records stored", total=options.shipped)
            while True:
                stored = (await sql(url, "SELECT count(*) FROM usage_records"))[0][0]
                progress.update(task, completed=stored)
                if stored >= options.shipped:
                    break
                await asyncio.sleep(0.2)
        seconds = time.monotonic() - started
    return {"records": options.shipped, "seconds": round(seconds, 2),
            "records_per_s": round(options.shipped / seconds)}  # fmt: skip


async def _reports(options: Options, root: Path, console: Console) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        with console.status("a control plane on PostgreSQL"):
            _, admin, url = await start_control_on_db(stack, root)
        month = datetime(2026, 10, 1, tzinfo=UTC)
        db = Database.connect(url, pool_size=2)
        stack.push_async_callback(db.close)
        store = UsageStore(db)
        with Progress(console=console) as progress:
            task = progress.add_task("records written", total=options.records)
            for start in range(0, options.records, STORE_BATCH):
                batch = _records(min(STORE_BATCH, options.records - start), month, start)
                await store.store(batch, f"region-{start // STORE_BATCH % REGIONS}", NODE)
                progress.update(task, completed=start + len(batch))
        await sql(url, "ANALYZE usage_records")
        end = datetime(2026, 11, 1, tzinfo=UTC)
        period = {"start_time": int(month.timestamp()), "end_time": int(end.timestamp())}
        asks: dict[str, dict[str, str | int]] = {
            "a month by tenant": {"bucket_width": "1mo", "group_by": "tenant"},
            "by day, tenant and model": {"bucket_width": "1d", "group_by": "tenant,model"},
            "one tenant's, by day": {"bucket_width": "1d", "tenants": "tenant-7"},
            # half an hour off UTC: its days begin on quarter hours of the sums
            "a month by tenant, in Asia/Kolkata": {
                "bucket_width": "1mo", "group_by": "tenant", "time_zone": "Asia/Kolkata"},
            "a month by tenant, from a second past midnight": {  # its first quarter: records
                "bucket_width": "1mo", "group_by": "tenant",
                "start_time": period["start_time"] + 1},
        }  # fmt: skip
        out: dict[str, Any] = {"records": options.records}
        for name, params in asks.items():
            times = []
            for _ in range(5):
                began = time.perf_counter()
                answer = await admin.get("/v1/usage", params={**period, **params}, timeout=120)
                times.append(time.perf_counter() - began)
                answer.raise_for_status()
            total = sum(r["num_model_requests"] for b in answer.json()["data"]
                        for r in b["results"])  # fmt: skip
            out[name] = {"median_s": round(statistics.median(times), 3),
                         "max_s": round(max(times), 3), "requests_counted": total}  # fmt: skip
    return out


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=150)
    result: dict[str, Any] = {}
    with console.status("a usage record's cost, in this process"):
        result["record_cost"] = record_cost()
    plots.write_json(console, result, options.out)
    result["shipping"] = await _shipping(options, options.root / "shipping", console)
    plots.write_json(console, result, options.out)
    result["reports"] = await _reports(options, options.root / "reports", console)
    plots.write_json(console, result, options.out)
    with console.status("a spend budget under 200 clients at once, two limiters"):
        result["budget"] = await budget.run()
    _report(console, result)
    plots.write_json(console, result, options.out)
    return result


def _report(console: Console, result: dict[str, Any]) -> None:
    c = result["record_cost"]
    console.print(f"a usage record on the request's path, CPU µs: {c['record_us']:.2f} priced, "
                  f"{c['unpriced_record_us']:.2f} unpriced")  # fmt: skip
    s = result["shipping"]
    console.print(f"shipping: {s['records']:,} records from one agent's journal to PostgreSQL in "
                  f"{s['seconds']:.1f} s: {s['records_per_s']:,} a second")  # fmt: skip
    r = result["reports"]
    table = Table(title=f"GET /v1/usage for a month over {r['records']:,} records")
    for column in ("report", "median s", "worst s", "requests counted"):
        table.add_column(column, justify="right")
    for name, figures in r.items():
        if isinstance(figures, dict):
            table.add_row(name, f"{figures['median_s']:.3f}", f"{figures['max_s']:.3f}",
                          f"{figures['requests_counted']:,}")  # fmt: skip
    console.print(table)
    b = result["budget"]
    table = Table(title=f"a budget of {b['limit']:.2f} under {b['clients']} clients at once over "
                  "3 regions, asked against their static parts")  # fmt: skip
    for column in ("limiter", "served", "spent / limit", "overspend (most-cost requests)",
                   "refused", "false refusals (below 95%)"):  # fmt: skip
        table.add_column(column, justify="right")
    for name, f in b.items():
        if isinstance(f, dict):
            table.add_row(name, f"{f['served']:,}", f"{f['spent_of_limit']:.4f}",
                          f"{f['overspend_requests']:.2f}", f"{f['refused']:,}",
                          f"{f['false_refusals']:,}")  # fmt: skip
    console.print(table)
