"""`meridian demo bad-change`: a harmful change caught at the canary and rolled back under
sample traffic, then a good change that rolls out to every region, shown live.

It reads `.meridian/local-fleet.json` (written by `meridian up`) and:
1. shortens the rollout policy's bake to `--bake` seconds for its run (and puts the policy
   back at the end), so that the scenario takes a minute or two, not ten;
2. sends calm traffic into every region, for every model it serves;
3. applies a harmful change: every region's engines of the first model get an argument that
   crashes them as they start (the simulator's `crash-after-s`), in one revision;
4. shows the rollout's waves and checks as the canary catches it and rolls it back;
5. applies a good change (the engines' arguments back, and the model's TTFT SLO eased a
   little), and shows it roll out wave after wave to every region.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import click
import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from meridian.demo import Demo, read_fleet_file

ENDED = {"complete", "rolled_back", "aborted", "superseded", "immediate"}
RESERVED = {"version", "created_at", "updated_at", "status"}


class Scenario:
    def __init__(self, fleet: dict[str, Any], http: httpx.AsyncClient, bake_s: float) -> None:
        self.fleet, self.http, self.bake_s = fleet, http, bake_s
        self.demo = Demo(fleet, fleet["regions"][0]["name"], 0, 2.0)
        self.step = "starting"
        self.doc: dict[str, Any] = {}
        self.admin = {"Authorization": f"Bearer {fleet['admin_token']}"}
        self.serves: dict[str, list[str]] = {}  # region: the models deployed there
        self.known = asyncio.Event()  # set once `serves` is read
        self.url = str(fleet["admin_url"]).rstrip("/")

    async def api(self, method: str, path: str, **kwargs: Any) -> Any:
        answer = await self.http.request(method, f"{self.url}{path}", headers=self.admin, **kwargs)
        if answer.status_code >= 400:
            raise click.ClickException(f"{method} {path}: {answer.status_code} {answer.text}")
        return answer.json()

    async def traffic(self, stop: asyncio.Event) -> None:
        """Every model a region serves, for every tenant: the checks wait for evidence of
        each model a wave's targets serve, and never pass a model nobody asked for."""
        tasks: set[asyncio.Task[None]] = set()
        await self.known.wait()
        while not stop.is_set():
            for region, tenant in self.demo.entries():
                for model in self.serves.get(region, []):
                    sent = self.demo.send(self.http, region, tenant, 20, model)
                    tasks.add(asyncio.create_task(sent))
            tasks = {t for t in tasks if not t.done()}
            await asyncio.sleep(0.3)
        await asyncio.gather(*tasks)

    async def follow(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError, click.ClickException):
                self.doc = await self.api("GET", "/v1/rollouts")
            await asyncio.sleep(0.5)

    async def apply(self, **kinds: list[dict[str, Any]]) -> int:
        body = {k: [{f: v for f, v in o.items() if f not in RESERVED} for o in objects]
                for k, objects in kinds.items()}  # fmt: skip
        done = await self.api("POST", "/v1/apply", params={"prune": "false"}, json=body)
        return int(done["revision"])

    async def ended(self, revision: int, within_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            row = (self.doc or {}).get("rollout") or {}
            if row.get("revision") == revision and row.get("state") in ENDED:
                return dict(row)
            await asyncio.sleep(0.5)
        raise click.ClickException(f"the rollout of revision {revision} did not end in time")

    async def run(self) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            return await self._run()
        finally:
            self.known.set()  # the traffic goes on to its stop, whatever failed

    async def _run(self) -> tuple[dict[str, Any], dict[str, Any]]:
        policy = await self._policy()
        model = self.fleet["models"][0]
        every = (await self.api("GET", "/v1/deployments"))["items"]
        for d in every:
            self.serves.setdefault(d["region"], []).append(d["model"])
        self.known.set()
        deployments = [d for d in every if d["model"] == model and d["backend"] == "sim"]
        routes = [p for p in (await self.api("GET", "/v1/routing-policies"))["items"]
                  if p["model"] == model and p["region"] is None]  # fmt: skip
        try:
            await self._set_policy({**policy, "bake_s": self.bake_s})
            await asyncio.sleep(3)  # calm traffic first: the checks' baseline
            self.step = "harmful: engines that crash as they start, in every region"
            crash = [{**d, "engine_args": {**d["engine_args"], "crash-after-s": 0.5}}
                     for d in deployments]  # fmt: skip
            bad = await self.ended(await self.apply(deployments=crash), 300)
            self.step = f"harmful change {bad['state'].replace('_', ' ')}; now a good change"
            await asyncio.sleep(5)  # the canary's engines come back
            eased = [{**r, "slo_ttft_ms": (r["slo_ttft_ms"] or 1000) + 50} for r in routes]
            good = await self.ended(
                await self.apply(deployments=deployments, routing_policies=eased), 600
            )
            self.step = f"good change {good['state']}"
            return bad, good
        finally:
            await self._set_policy(policy)

    async def _policy(self) -> dict[str, Any]:
        answer = await self.http.get(f"{self.url}/v1/rollout-policies/default", headers=self.admin)
        if answer.status_code == 404:
            return {"name": "default"}
        answer.raise_for_status()
        return {k: v for k, v in answer.json().items() if k not in RESERVED}

    async def _set_policy(self, policy: dict[str, Any]) -> None:
        await self.apply(rollout_policies=[policy])

    def view(self) -> Group:
        doc = self.doc or {}
        row = doc.get("rollout") or {}
        force = doc.get("in_force") or {}
        head = (f"step: {self.step}\ndeclared intent {doc.get('declared_intent')} · in force "
                f"{force.get('intent')}: {force.get('why', '')}")  # fmt: skip
        waves = Table(title=f"rollout of revision {row.get('revision', '-')}: "
                      f"{row.get('state', '-')} {row.get('reason', '')}", box=None)  # fmt: skip
        for column in ("wave", "targets", "status"):
            waves.add_column(column)
        for wave in row.get("waves", []):
            waves.add_row(wave["name"], ", ".join(wave["targets"]), wave["status"])
        checks = Table(title="checks of the wave (updated targets against the rest)", box=None)
        for column in ("check", "model", "verdict", "figure"):
            checks.add_column(column)
        for check in row.get("checks", []):
            checks.add_row(check["check"], check.get("model") or "", check["verdict"],
                           check["figure"])  # fmt: skip
        requests = Table(title="requests since the demo began", box=None)
        for column in ("sent to", "tenant", "sent", "served by", "refused or failed"):
            requests.add_column(column)
        for (region, tenant), t in sorted(self.demo.tallies.items()):
            served = ", ".join(f"{r} {n}" for r, n in t.served_by.most_common())
            refused = ", ".join(f"{c}: {n}" for c, n in t.refused.most_common()) or "-"
            requests.add_row(region, tenant, str(t.sent), served, refused)
        return Group(head, waves, checks, requests)


@click.command("bad-change")
@click.option("--fleet-file", type=click.Path(dir_okay=False, path_type=Path),
              default=Path(".meridian/local-fleet.json"), show_default=True,
              help="what `meridian up` wrote")  # fmt: skip
@click.option("--bake", type=click.FloatRange(3, 600), default=10.0, show_default=True,
              help="seconds each wave is watched, for the demo's run")  # fmt: skip
def bad_change_command(fleet_file: Path, bake: float) -> None:
    """A harmful change caught at the canary and rolled back, then a good one everywhere."""
    fleet = read_fleet_file(fleet_file)
    console = Console()

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as http:
            scenario, stop = Scenario(fleet, http, bake), asyncio.Event()
            background = [asyncio.create_task(scenario.traffic(stop)),
                          asyncio.create_task(scenario.follow(stop))]  # fmt: skip
            with Live(scenario.view(), console=console, refresh_per_second=4) as live:

                async def refresh() -> None:
                    while not stop.is_set():
                        live.update(scenario.view())
                        await asyncio.sleep(0.25)

                background.append(asyncio.create_task(refresh()))
                try:
                    return await scenario.run()
                finally:
                    stop.set()
                    await asyncio.gather(*background)
                    live.update(scenario.view())

    try:
        bad, good = asyncio.run(main())
    except httpx.ConnectError as error:
        raise click.ClickException(
            f"the local fleet does not answer ({error}): is `meridian up` running?"
        ) from None
    console.print(f"harmful change: {bad['state'].replace('_', ' ')}: {bad['reason']}")
    console.print(f"good change: {good['state']} in {len(good['waves'])} wave(s)")
