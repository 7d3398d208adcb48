"""What a user of the local fleet needs to send requests: each region's OpenAI base URL, an API
key per tenant, the admin API, and the processes; printed, and written to
`.meridian/local-fleet.json`. Keys made by an earlier run are reused while they still work."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console
from rich.table import Table

from meridian.local_agents import RunningAgent


async def describe(
    fleet: Path,
    out: Path,
    *,
    api: str,
    admin_token: str,
    controlplane_pid: int,
    agents: list[RunningAgent],
    statuses: dict[str, dict[str, Any]],
    local_cloud: dict[str, str] | None = None,
) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(await asyncio.to_thread(fleet.read_text)) or {}
    old = await asyncio.to_thread(_read, out)
    kept = {t["name"]: t.get("api_key") for t in old.get("tenants", [])}
    tenants = []
    async with httpx.AsyncClient(
        base_url=api, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30
    ) as http:
        for tenant in document.get("tenants", []):
            name = tenant["name"]
            key = kept.get(name)
            if not key or not await _still_valid(http, key):
                response = await http.post("/v1/api-keys", json={"tenant": name})
                response.raise_for_status()
                key = str(response.json()["key"])
            tenants.append(
                {"name": name, "api_key": key,
                 "jurisdictions": tenant.get("allowed_jurisdictions") or []}
            )  # fmt: skip
    engines: dict[str, list[int]] = {}
    for agent in agents:
        status = statuses.get(agent.node.name, {})
        pids = [e["pid"] for e in status.get("engines", []) if e.get("pid")]
        engines.setdefault(agent.node.region, []).extend(pids)
    doc = {
        "admin_url": api,
        "admin_token": admin_token,
        "regions": [
            {"name": r["name"], "cloud": r["cloud"], "jurisdiction": r["jurisdiction"],
             "gateway_url": r.get("gateway_url")}
            for r in document.get("regions", [])
        ],
        "tenants": tenants,
        "models": [m["name"] for m in document.get("models", [])],
        "processes": {
            "controlplane": controlplane_pid,
            "agents": {a.node.region: a.process.pid for a in agents},
            "engines": engines,
        },
    }  # fmt: skip
    if local_cloud is not None:  # its URL and token: to take a spot machine back, say
        doc["local_cloud"] = local_cloud
    await asyncio.to_thread(_write, out, doc)
    return doc


async def _still_valid(http: httpx.AsyncClient, key: str) -> bool:
    """Whether the key an earlier run made is still a live key of this control plane."""
    prefix = key.split(".", 1)[0]
    response = await http.get("/v1/api-keys", params={"limit": 500})
    if response.status_code != 200:
        return False
    return any(k["prefix"] == prefix and not k["revoked"] for k in response.json()["items"])


def note_controlplane_pid(path: Path, pid: int) -> None:
    """The control plane was started again: its new pid, for `meridian demo traffic`."""
    doc = _read(path)
    if doc:
        doc.setdefault("processes", {})["controlplane"] = pid
        _write(path, doc)


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)  # it holds keys
    path.write_text(json.dumps(doc, indent=2) + "\n")


def _read(path: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc
    return {}


def whole(console: Console, text: str) -> None:
    """`text` as it is: no markup, no highlighting, no line broken to fit the terminal."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def serves(region: dict[str, Any], tenant: dict[str, Any]) -> bool:
    """Whether the region's gateway takes the tenant's requests (its jurisdictions allow)."""
    allowed = tenant["jurisdictions"]
    return bool(region["gateway_url"]) and (not allowed or region["jurisdiction"] in allowed)


def first_client(doc: dict[str, Any]) -> tuple[str, str] | None:
    """The first region's OpenAI base URL and the key of the first tenant served there."""
    region = next((r for r in doc["regions"] if r["gateway_url"]), None)
    tenant = next((t for t in doc["tenants"] if region and serves(region, t)), None)
    if region is None or tenant is None:
        return None
    return f"{region['gateway_url']}/v1", str(tenant["api_key"])


def print_fleet(console: Console, doc: dict[str, Any], out: Path) -> None:
    table = Table(title="OpenAI endpoints", box=None)
    table.add_column("region")
    table.add_column("cloud")
    table.add_column("jurisdiction")
    table.add_column("base URL")
    for region in doc["regions"]:
        base = f"{region['gateway_url']}/v1" if region["gateway_url"] else "-"
        table.add_row(region["name"], region["cloud"], region["jurisdiction"], base)
    console.print(table)
    # Keys and commands are printed whole, each on a line of its own, whatever the terminal's
    # width: a table would cut or fold them, and they are there to be copied.
    console.print("[bold]API keys[/] (one per tenant, for this local fleet):")
    for tenant in doc["tenants"]:
        where = ", ".join(tenant["jurisdictions"]) or "any region"
        console.print(f"  {tenant['name']}, served in {where}:", highlight=False)
        whole(console, f"    {tenant['api_key']}")
    first = first_client(doc)
    if first is not None:
        base, key = first
        console.print("[bold]Any OpenAI client[/], in this shell:")
        whole(console, f"export OPENAI_BASE_URL={base} \\\n       OPENAI_API_KEY={key}")
    console.print(f"written to {out}")
