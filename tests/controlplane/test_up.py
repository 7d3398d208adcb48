"""The main job, run as a user runs it, and the embedded PostgreSQL it stands on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest
import yaml
from rich.console import Console

from controlplane.db.embedded import UNSAFE_FAST, EmbeddedPostgres
from meridian import local_adapters
from meridian.procs import free_port
from tests.kits.push import eventually
from tests.kits.services import sql


async def test_embedded_postgres_keeps_data_across_restarts(workdir: Path) -> None:
    root = workdir / "embedded-restart"
    first = EmbeddedPostgres(root, server_settings=UNSAFE_FAST)
    credentials = await first.start()
    await sql(
        credentials.url(), "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')"
    )
    await first.stop()

    second = EmbeddedPostgres(root)
    again = await second.start()
    assert again == credentials
    assert await sql(again.url(), "SELECT v FROM kept") == [("still here",)]
    await second.stop()
    with pytest.raises(psycopg.OperationalError):
        await sql(again.url(), "SELECT 1", timeout_s=2)


async def _run_up(data_dir: Path, port: int) -> tuple[asyncio.subprocess.Process, str]:
    env = {
        **os.environ,
        "MERIDIAN_DATA_DIR": str(data_dir),
        "COLUMNS": "80",  # an ordinary terminal: keys and commands must still come whole
        "MERIDIAN_GRPC_PORT": str(free_port()),
    }
    env.pop("MERIDIAN_DATABASE_URL", None)
    env.pop("MERIDIAN_ADMIN_TOKEN", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "meridian",
        "up",
        "--port",
        str(port),
        "--no-browser",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    assert proc.stdout is not None
    output = ""
    while "Ctrl-C stops everything" not in output:
        line = await asyncio.wait_for(proc.stdout.readline(), 90)
        assert line, f"meridian up ended early:\n{output}"
        output += line.decode()
    # Go on reading, as a terminal would: a full pipe would block whoever writes to it (the
    # control plane logs to the same stdout).
    _DRAINS[proc.pid] = asyncio.create_task(proc.stdout.read())
    return proc, output


_DRAINS: dict[int, asyncio.Task[bytes]] = {}


def _kill_fleet(data_dir: Path | None) -> None:
    """The processes local-fleet.json names, killed."""
    if data_dir is None or not (data_dir / "local-fleet.json").exists():
        return
    processes = json.loads((data_dir / "local-fleet.json").read_text())["processes"]
    pids = [processes["controlplane"], *processes["agents"].values()]
    pids += [pid for engines in processes["engines"].values() for pid in engines]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def _interrupt(proc: asyncio.subprocess.Process, data_dir: Path | None = None) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(proc.wait(), 60)
    except TimeoutError:  # what it said while it did not stop, to see why
        proc.kill()
        await proc.wait()
        _kill_fleet(data_dir)  # its agents and engines would hold their ports for later tests
        said = (await asyncio.wait_for(_DRAINS.pop(proc.pid), 10)).decode()
        logs = sorted((data_dir / "logs").glob("agent-*.log")) if data_dir else []
        tails = "".join(f"\n--- {p.name}:\n{p.read_text()[-1500:]}" for p in logs)
        stuck = f"meridian up did not stop within 60 s:\n{said[-3000:]}{tails}"
        raise AssertionError(stuck) from None
    rest = await asyncio.wait_for(_DRAINS.pop(proc.pid), 10)
    return rest.decode()


async def test_up_runs_the_example_fleet_and_stops_cleanly(workdir: Path) -> None:
    data_dir = workdir / "up"
    port = free_port()
    proc, output = await _run_up(data_dir, port)
    try:
        token = (data_dir / "admin-token").read_text().strip()
        assert token in output
        assert f"http://127.0.0.1:{port}" in output
        assert "28 object(s) changed; revision 1" in output
        assert "LoRA adapter(s) acme-support made in" in output
        # the example's pools name groups: `meridian up` plays their clouds
        assert "local cloud on http://127.0.0.1:" in output
        for engine in ENGINES:
            assert f"✓ {engine}  ready" in output, output
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}
        ) as client:
            regions = (await client.get("/v1/regions")).json()["items"]
            assert sorted(r["name"] for r in regions) == ["eu-west", "us-east", "us-west"]
            engine_pids = []
            for agent_port in (8501, 8502, 8503):
                status = (await client.get(f"http://127.0.0.1:{agent_port}/agent/status")).json()
                assert status["source"] == "control-plane"
                engine_pids += [e["pid"] for e in status["engines"]]
        local = json.loads((data_dir / "local-fleet.json").read_text())
        answer = await _chat_through(local, "eu-west", "eurobank")
        assert answer.headers["x-meridian-region"] == "eu-west"
        # the example's adapter, made by `meridian up`, served to acme
        tuned = await _chat_through(local, "us-east", "acme", model="acme-support")
        assert tuned.headers["x-meridian-region"] == "us-east"
        assert local["admin_url"] == f"http://127.0.0.1:{port}"
        assert local["admin_token"] == token
        assert sorted(local["models"]) == ["llama-3.1-8b-instruct", "qwen2.5-32b-instruct"]
        assert {t["name"]: t["jurisdictions"] for t in local["tenants"]} == {
            "acme": [],
            "eurobank": ["eu"],
        }
        assert sorted(local["processes"]["agents"]) == ["eu-west", "us-east", "us-west"]
        assert sorted(local["processes"]["engines"]["us-east"]) == sorted(engine_pids[:3])
        lines = [line.strip() for line in output.splitlines()]
        assert token in lines  # whole, on a line of its own, to be copied
        for tenant in local["tenants"]:
            assert tenant["api_key"] in lines
        us_east = next(r for r in local["regions"] if r["name"] == "us-east")
        export = lines.index(f"export OPENAI_BASE_URL={us_east['gateway_url']}/v1 \\")
        assert lines[export + 1] == f"OPENAI_API_KEY={local['tenants'][0]['api_key']}"
        demo = await _demo(data_dir / "local-fleet.json")
        final = demo[demo.rindex("requests (phase") :]  # the last frame of the live view
        (eurobank,) = [line for line in final.splitlines() if "eurobank" in line]
        assert "eu-west" in eurobank
        assert "us-" not in eurobank  # residency: served in its jurisdiction only
        assert "us-west  → out to" in final  # the surge and the fault escalated
        assert "failure" in final
        # the control plane was killed with kill -9 while traffic flowed: nothing failed,
        # and `meridian up` started it again
        # every refusal shown is explained, and the calm phase has none
        table = final[: final.index("escalations since")]
        shown = set(re.findall(r"\b([a-z_]+): \d+", table))
        explained = dict(re.findall(r"(?m)^why ([a-z_]+) \(\d+, ([^)]*)\)", final))
        assert shown <= set(explained), final
        assert not [code for code, phases in explained.items() if "calm" in phases], final
        outage = next(line for line in final.splitlines() if line.startswith("control plane"))
        assert "killed (kill -9), back after" in outage, outage
        assert " 0 failed" in outage, outage
        assert (
            json.loads((data_dir / "local-fleet.json").read_text())["processes"]["controlplane"]
            != local["processes"]["controlplane"]
        )
        since = datetime.now(UTC)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}
        ) as client:  # an operator adds a tenant and a key beside the example's
            made = await client.post("/v1/tenants", json={"name": "extra", "tier": "standard"})
            assert made.status_code == 201, made.text
            assert (await client.post("/v1/api-keys", json={"tenant": "extra"})).status_code == 201
            revision = (await client.get("/v1/revision")).json()["revision"]

            async def heard_again() -> bool:  # every agent reports to the new control plane
                nodes = (await client.get("/v1/nodes")).json()["items"]
                beats = [n["status"]["last_heartbeat_at"] for n in nodes]
                return all(b and datetime.fromisoformat(b) > since for b in beats)

            await eventually(heard_again, within_s=30)
    finally:
        await _interrupt(proc, data_dir)
    assert proc.returncode == 0
    assert len(engine_pids) == len(ENGINES)
    for pid in engine_pids:  # every engine was stopped, not orphaned
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    # Again on the same data directory: the same database, nothing to change (what the
    # operator added stays), the agents keep their identities.
    proc, output = await _run_up(data_dir, port)
    try:
        assert f"no changes; revision {revision}" in output  # no new bootstrap tokens either
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}
        ) as client:
            assert (await client.get("/v1/tenants/extra")).status_code == 200
        assert f"✓ {ENGINES[0]}  ready" in output
        again = json.loads((data_dir / "local-fleet.json").read_text())
        assert again["tenants"] == local["tenants"]  # the keys still work: kept
        processes = again["processes"]
        pids = [processes["controlplane"], *processes["agents"].values()]
        pids += [pid for engines in processes["engines"].values() for pid in engines]
        pid_file = next((data_dir / "postgres").rglob("postmaster.pid"))
        pids.append(int(pid_file.read_text().splitlines()[0]))
    finally:
        proc.kill()  # kill -9 of `meridian up` itself: it cannot stop what it started
        await proc.wait()
        _DRAINS.pop(proc.pid).cancel()

    async def all_gone() -> bool:
        return not any(_alive(pid) for pid in pids)

    await eventually(all_gone, within_s=10)  # no process of the fleet is left
    assert not pid_file.exists(), "PostgreSQL was not shut down"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or b") Z " not in stat.read_bytes()[:64]  # a zombie is gone


async def _demo(fleet_file: Path) -> str:
    """`meridian demo traffic`, short, as a user would run it beside `meridian up`."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meridian", "demo", "traffic", "--fleet-file", str(fleet_file),
        "--seconds", "15", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode()
    return out.decode()


async def _chat_through(
    local: dict[str, Any], region: str, tenant: str, model: str | None = None
) -> Any:
    """A chat completion through a region's gateway, with the openai client, as a user would."""
    gateway = next(r["gateway_url"] for r in local["regions"] if r["name"] == region)
    key = next(t["api_key"] for t in local["tenants"] if t["name"] == tenant)
    async with openai.AsyncOpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=model or local["models"][0],
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
        )
    assert raw.parse().choices[0].message.content
    return raw


ENGINES = [
    "llama-us-east/unified-0",
    "qwen-us-east/prefill-0",
    "qwen-us-east/decode-0",
    "llama-us-west/unified-0",
    "llama-eu-west/unified-0",
    "llama-eu-west/unified-1",
]


def test_the_adapters_up_makes_are_named_by_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`./scripts/up` in a fresh clone runs with the data directory `.meridian`, relative: the
    adapters it makes must still be named by paths the control plane takes (absolute)."""
    monkeypatch.chdir(tmp_path)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"adapters": [
        {"name": "acme-support", "base_model": "m", "source": "/var/lib/none/acme-support",
         "rank": 8, "tenants": ["acme"]}]}))  # fmt: skip
    made = local_adapters.prepare(Path(".meridian"), fleet, Console(quiet=True))
    (adapter,) = yaml.safe_load(made.read_text())["adapters"]
    source = Path(adapter["source"])
    assert source.is_absolute(), source
    assert (source / "adapter_config.json").is_file()
    config = json.loads((source / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]).is_absolute()
