"""`meridian demo traffic`: sample traffic across the local fleet's regions, shown live: where
each region's requests were served, and the escalations between regions with their reasons.
(`meridian demo bad-change`, in demo_rollout.py, shows a rollout catching a harmful change.)

It reads `.meridian/local-fleet.json` (written by `meridian up`) and runs four phases:
- **calm**: a few requests a second into every region; each serves its own;
- **surge**: long, uncached prompts into one region, past what its engines prefill in time, so
  that the excess escalates (overload) to a peer with room;
- **fault**: that region's engines answer every request with an error (the simulator's fault
  knob), so that its requests escalate (failure);
- **recovered**: the fault is lifted and the region serves its own again;
- **control plane down**: the control plane is killed (kill -9) while traffic flows; the
  gateways serve from their snapshots, `meridian up` starts it again, and the screen shows
  what the requests of the outage came to.

The residency-restricted tenant's requests go only to regions of its jurisdictions, and are
never served outside them, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from meridian.local_fleet import serves

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
    "region",
    "cloud",
]
PHASES = ("calm", "surge", "fault", "recovered", "control plane down")
BACK_WITHIN_S = 90.0  # the longest the demo waits for the control plane to come back
SURGE_RPS = 8.0


# Each refusal or failure the demo can show, by the OpenAI error's `code` (or the client's
# error when no answer came): what it means, and what would change it.
WHY = {
    "quota_exceeded": (
        "the tenant's quota (requests or tokens a minute, shared between regions by leases) "
        "was spent",
        "a larger requests_per_minute or tokens_per_minute for the tenant, or fewer requests",
    ),
    "queue_full": (
        "the model's admission queue at this gateway was full",
        "more engines for the model in the region, or a larger max_queue in its routing policy",
    ),
    "overloaded": (
        "no engine here could answer within the routing policy's SLO, and no peer region took it",
        "more engines in the region, a fallback rule to a peer with room, or a looser slo_ttft_ms",
    ),
    "no_healthy_worker": (
        "no engine of the model was healthy in the region, and no peer region took it",
        "the engines back (the agent's /agent/status says why they are not), or a fallback "
        "rule to a peer",
    ),
    "upstream_failed": (
        "the engine failed the request, and no other engine or peer could take it",
        "healthy engines; the fault phase makes the target's engines fail on purpose",
    ),
    "not_ready": ("the agent had no snapshot yet", "wait until it reaches the control plane"),
    "no_answer": (
        "no answer came: the connection failed or timed out",
        "a gateway that is up (is `meridian up` running?)",
    ),
}
UNKNOWN = ("an answer this demo does not explain", "reading the error's message")


@dataclass
class Tally:
    sent: int = 0
    served_by: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # by error code
    latencies: list[float] = field(default_factory=list)


def error_code(answer: httpx.Response) -> str:
    """The OpenAI error's `code`, else the HTTP status."""
    with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
        return str(answer.json()["error"]["code"])
    return str(answer.status_code)


@dataclass
class Outage:
    """The control plane's kill -9, and what the requests sent meanwhile came to."""

    killed_at: float | None = None
    back_after_s: float | None = None
    sent: int = 0
    served: int = 0
    failed: int = 0  # a 5xx, or no answer
    refused: int = 0  # a 4xx (a quota, admission)
    note: str = ""

    def line(self) -> str:
        if self.killed_at is None:
            return f"control plane: up{f' ({self.note})' if self.note else ''}"
        back = (f"back after {self.back_after_s:.1f} s" if self.back_after_s is not None
                else "not back yet")  # fmt: skip
        return (
            f"control plane: killed (kill -9), {back}; requests meanwhile: {self.sent} sent, "
            f"{self.served} served, {self.failed} failed, {self.refused} refused"
        )


@dataclass
class Demo:
    fleet: dict[str, Any]
    target: str  # the region the surge and the fault hit
    seconds: float
    rps: float
    tallies: dict[tuple[str, str], Tally] = field(default_factory=lambda: defaultdict(Tally))
    escalations: dict[tuple[str, ...], int] = field(default_factory=dict)
    phase: str = "calm"
    refusals: Counter[tuple[str, str]] = field(default_factory=Counter)  # (code, phase)
    fleet_file: Path | None = None  # read again for the control plane's pid, which changes
    outage: Outage = field(default_factory=Outage)

    @property
    def operator(self) -> dict[str, str]:
        """The agents' operator token (the local fleet's admin token), for /agent/status."""
        return {"Authorization": f"Bearer {self.fleet.get('admin_token', '')}"}

    def url(self, region: str) -> str:
        return str(next(r["gateway_url"] for r in self.fleet["regions"] if r["name"] == region))

    def entries(self) -> list[tuple[str, dict[str, Any]]]:
        """(region, tenant) pairs to send to: every tenant into every region it may use."""
        return [(region["name"], tenant) for region in self.fleet["regions"]
                for tenant in self.fleet["tenants"] if serves(region, tenant)]  # fmt: skip

    async def send(
        self, http: httpx.AsyncClient, region: str, tenant: dict[str, Any], words: int,
        model: str | None = None,
    ) -> None:  # fmt: skip
        prompt = " ".join(random.choices(WORDS, k=words))
        body = {"model": model or self.fleet["models"][0], "max_tokens": 32,
                "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
        tally = self.tallies[region, tenant["name"]]
        tally.sent += 1
        started = time.monotonic()
        outage = self.outage if self.outage.killed_at and self.outage.back_after_s is None else None
        if outage is not None:
            outage.sent += 1
        try:
            answer = await http.post(
                f"{self.url(region)}/v1/chat/completions", json=body,
                headers={"Authorization": f"Bearer {tenant['api_key']}"},
            )  # fmt: skip
        except httpx.HTTPError:
            tally.refused["no_answer"] += 1
            self.refusals["no_answer", self.phase] += 1
            if outage is not None:
                outage.failed += 1
            return
        if answer.status_code == 200:
            tally.served_by[answer.headers.get("x-meridian-region", "?")] += 1
            tally.latencies.append(time.monotonic() - started)
        else:
            code = error_code(answer)
            tally.refused[code] += 1
            self.refusals[code, self.phase] += 1
        if outage is not None:
            status = answer.status_code
            outage.served += status == 200
            outage.failed += status >= 500
            outage.refused += 400 <= status < 500

    async def traffic(self, http: httpx.AsyncClient) -> None:
        tasks: set[asyncio.Task[None]] = set()
        end = time.monotonic() + self.seconds
        part = self.seconds / len(PHASES)
        while (now := time.monotonic()) < end:
            self.phase = PHASES[min(len(PHASES) - 1, int((self.seconds - (end - now)) / part))]
            for region, tenant in self.entries():
                if random.random() < self.rps / 10:
                    tasks.add(asyncio.create_task(self.send(http, region, tenant, 20)))
            if self.phase == "surge" and random.random() < SURGE_RPS / 10:
                # long uncached prompts: more prefill than the region's one engine does in time
                tenant = self.fleet["tenants"][0]
                tasks.add(asyncio.create_task(self.send(http, self.target, tenant, 4000)))
            tasks = {t for t in tasks if not t.done()}
            await asyncio.sleep(0.1)
        await asyncio.gather(*tasks)

    async def faults(self, http: httpx.AsyncClient) -> None:
        """The fault phase: the target's engines fail every request, then recover."""
        part = self.seconds / len(PHASES)
        await asyncio.sleep(2 * part)
        await self._set_faults(http, 1.0)
        try:
            await asyncio.sleep(part)
        finally:
            await self._set_faults(http, 0.0)

    async def control_plane(self, http: httpx.AsyncClient) -> None:
        """The last phase: the control plane killed, and awaited until it is back."""
        await asyncio.sleep(4 * self.seconds / len(PHASES))
        fleet = json.loads(self.fleet_file.read_text()) if self.fleet_file else self.fleet
        pid = fleet.get("processes", {}).get("controlplane")
        if not isinstance(pid, int):
            self.outage.note = "its pid is not known: not killed"
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError as error:
            self.outage.note = f"not killed: {error}"
            return
        killed = self.outage.killed_at = time.monotonic()
        async with asyncio.timeout(BACK_WITHIN_S):
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"{fleet['admin_url']}/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.2)
        self.outage.back_after_s = time.monotonic() - killed

    async def _set_faults(self, http: httpx.AsyncClient, error_rate: float) -> None:
        status = (await http.get(f"{self.url(self.target)}/agent/status",
                                 headers=self.operator)).json()  # fmt: skip
        for engine in status["engines"]:
            with contextlib.suppress(httpx.HTTPError):
                await http.post(f"{engine['url']}/sim/faults", json={"error_rate": error_rate})

    async def counts(self, http: httpx.AsyncClient) -> dict[tuple[str, ...], int]:
        """Each agent's escalation counts: (region, direction, peer, reason): requests."""
        counts: dict[tuple[str, ...], int] = {}
        for region in self.fleet["regions"]:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                status = (await http.get(f"{region['gateway_url']}/agent/status",
                                         headers=self.operator)).json()  # fmt: skip
                for c in status["escalation"]["counts"]:
                    key = (region["name"], c["direction"], c["peer"], c["reason"])
                    counts[key] = int(c["count"])
        return counts

    async def watch(self, http: httpx.AsyncClient, before: dict[tuple[str, ...], int]) -> None:
        """Escalations since the demo began, as the agents count them."""
        while True:
            now = await self.counts(http)
            self.escalations = {k: n - before.get(k, 0) for k, n in now.items()}
            await asyncio.sleep(0.5)

    def view(self) -> Group:
        requests = Table(title=f"requests (phase: {self.phase}; surge and fault hit "
                               f"{self.target})", box=None)  # fmt: skip
        for column in ("sent to", "tenant", "sent", "served by", "refused", "p50 s"):
            requests.add_column(column)
        for (region, tenant), t in sorted(self.tallies.items()):
            served = ", ".join(f"{r} {n}" for r, n in t.served_by.most_common())
            refused = ", ".join(f"{c}: {n}" for c, n in t.refused.most_common()) or "-"
            p50 = sorted(t.latencies)[len(t.latencies) // 2] if t.latencies else 0.0
            requests.add_row(region, tenant, str(t.sent), served, refused, f"{p50:.2f}")
        flows = Table(title="escalations since the demo began, as the agents count them", box=None)
        for column in ("region", "direction", "peer", "reason", "requests"):
            flows.add_column(column)
        for (region, direction, peer, reason), count in sorted(self.escalations.items()):
            if count:
                arrow = "→ out to" if direction == "out" else "← in from"
                flows.add_row(region, arrow, peer, reason, str(count))
        return Group(requests, flows, self.outage.line(), *self.explained())

    def explained(self) -> list[str]:
        """A line for each kind of refusal or failure shown: when, why, what would change it."""
        counts: Counter[str] = Counter()
        for (code, _), n in self.refusals.items():
            counts[code] += n
        lines = []
        for code, n in counts.most_common():
            what, change = WHY.get(code, UNKNOWN)
            when = ", ".join(p for p in PHASES if self.refusals[code, p])
            lines.append(f"why {code} ({n}, {when}): {what}; what would change it: {change}")
        return lines


def read_fleet_file(path: Path) -> dict[str, Any]:
    """What `meridian up` wrote, or a one-line error that says to run it."""
    try:
        fleet: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise click.ClickException(
            f"cannot read {path} ({error}): start the local fleet with `meridian up` first"
        ) from None
    return fleet


@click.group("demo")
def demo() -> None:
    """Show the local fleet at work."""


@demo.command("traffic")
@click.option("--fleet-file", type=click.Path(dir_okay=False, path_type=Path),
              default=Path(".meridian/local-fleet.json"), show_default=True,
              help="what `meridian up` wrote")  # fmt: skip
@click.option("--seconds", type=click.FloatRange(10, 3600), default=50.0, show_default=True)
@click.option("--rps", type=click.FloatRange(0.1, 50), default=2.0, show_default=True,
              help="calm requests a second into each region, per tenant")  # fmt: skip
@click.option("--target", default="us-west", show_default=True,
              help="the region the surge and the fault hit")  # fmt: skip
def traffic_command(fleet_file: Path, seconds: float, rps: float, target: str) -> None:
    """Send sample traffic across the regions and show, live, where it went and why."""
    fleet = read_fleet_file(fleet_file)
    regions = {r["name"] for r in fleet.get("regions", [])}
    if target not in regions:
        raise click.BadParameter(
            f"not a region of the fleet: {sorted(regions)}", param_hint="--target"
        )
    console = Console()
    run = Demo(fleet, target, seconds, rps, fleet_file=fleet_file)

    async def main() -> None:
        limits = httpx.Limits(max_connections=256)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            watcher = asyncio.create_task(run.watch(http, await run.counts(http)))
            with Live(run.view(), console=console, refresh_per_second=4) as live:
                refresh = asyncio.create_task(_refresh(live, run))
                try:
                    await asyncio.gather(
                        run.traffic(http), run.faults(http), run.control_plane(http)
                    )
                finally:
                    refresh.cancel()
                    watcher.cancel()
                    await asyncio.sleep(0.6)
                live.update(run.view())

    try:
        asyncio.run(main())
    except httpx.ConnectError as error:
        raise click.ClickException(
            f"the local fleet does not answer ({error}): is `meridian up` running?"
        ) from None


async def _refresh(live: Live, run: Demo) -> None:
    while True:
        live.update(run.view())
        await asyncio.sleep(0.25)


# The rollout scenario builds on Demo above; it is a command of this group.
from meridian.demo_rollout import bad_change_command  # noqa: E402

demo.add_command(bad_change_command)
