"""`meridian up`: the main job. A local control plane on an embedded PostgreSQL, the fleet
applied, and one agent per declared node running its simulated engines.

Every part is a real process: PostgreSQL (through pg_ctl), the control plane (`meridian
controlplane serve`), the agents (`meridian agent run`) and their engines (`meridian sim`).
Ctrl-C stops them all: the agents drain and stop their engines, then the control plane and
PostgreSQL stop.

The control plane is supervised, as a production deployment would run it: when it dies, the
agents and engines keep serving from their snapshots (static stability), it is started again
on the same ports, and the agents reconnect. No process of the fleet outlives `meridian up`,
even one killed with SIGKILL: a reaper (meridian/reaper.py) stops them when it goes.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import sys
import webbrowser
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from controlplane.client import apply_file, print_changes
from controlplane.db import migrate
from controlplane.db.embedded import EmbeddedPostgres
from controlplane.db.engine import Database
from controlplane.db.provision import database_url
from controlplane.settings import Settings
from meridian import local_adapters, real_engines
from meridian import reaper as reaper_env
from meridian.local_agents import (
    ENGINES_TIMEOUT_S,
    RunningAgent,
    await_engines,
    gateways,
    local_nodes,
    print_engines,
    start_agents,
)
from meridian.local_cloud import LocalCloud, local_pools
from meridian.local_fleet import (
    describe,
    first_client,
    note_controlplane_pid,
    print_fleet,
    whole,
)
from meridian.local_lb import Balancer
from meridian.procs import port_in_use, start_control_plane, stop_child

RESTART_MIN_S, RESTART_MAX_S = 0.5, 30.0  # the control plane's restart backoff
EXAMPLE_FLEET = Path(__file__).resolve().parents[1] / "examples" / "fleet.yaml"


def admin_token(settings: Settings) -> str:
    """MERIDIAN_ADMIN_TOKEN, or one made once and kept in the data directory."""
    if settings.admin_token is not None:
        return settings.admin_token.get_secret_value()
    path = settings.data_dir / "admin-token"
    if path.exists():
        return path.read_text().strip()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    return token


def open_in_browser(url: str) -> bool:
    """Open the URL in the desktop's browser; never a terminal one (it would take the console
    that the fleet's output goes to), so nothing without a display."""
    if sys.platform not in ("darwin", "win32") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    ):
        return False
    try:
        return webbrowser.open(url, new=2)
    except webbrowser.Error:
        return False


def check_ports(settings: Settings, fleet: Path) -> None:
    """Every port the fleet will listen on is free, or one clear line says which is not."""
    wanted = [
        (settings.host, settings.port, "the API (--port)"),
        (settings.host, settings.grpc_port, "the agents' gRPC (MERIDIAN_GRPC_PORT)"),
    ]
    wanted += [(host, port, f"region {name}'s gateway_url in {fleet.name}")
               for name, (host, port) in gateways(fleet).items()]  # fmt: skip
    for host, port, what in wanted:
        if port_in_use(host, port):
            raise click.ClickException(
                f"{host}:{port}, for {what}, is in use: is another fleet running? "
                "Stop it, or choose other ports"
            )


async def run_local_fleet(
    settings: Settings,
    fleet: Path,
    console: Console,
    *,
    browser: bool = True,
    engines_timeout_s: float = ENGINES_TIMEOUT_S,
) -> None:
    check_ports(settings, fleet)
    token = admin_token(settings)
    reaper = await start_reaper()
    try:
        await _run(settings, fleet, console, token, reaper, browser=browser,
                   engines_timeout_s=engines_timeout_s)  # fmt: skip
    finally:
        if reaper.stdin is not None:  # all stopped: the reaper finds nothing left, and ends
            reaper.stdin.close()
        await reaper.wait()


async def start_reaper() -> asyncio.subprocess.Process:
    """The reaper, and the fleet's id in this process's environment for every child to
    inherit (meridian/reaper.py)."""
    fleet_id = secrets.token_hex(8)
    os.environ[reaper_env.ENV] = fleet_id
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meridian.reaper", fleet_id,
        stdin=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


@dataclass
class Supervised:
    """The control plane's process now (it changes when it is started again)."""

    process: asyncio.subprocess.Process

    async def stop(self) -> None:
        await stop_child(self.process)


async def _run(
    settings: Settings,
    fleet: Path,
    console: Console,
    token: str,
    reaper: asyncio.subprocess.Process,
    *,
    browser: bool,
    engines_timeout_s: float,
) -> None:
    api = f"http://{settings.host}:{settings.port}"
    async with AsyncExitStack() as stack:
        with console.status("starting PostgreSQL") as status:
            db_url = await stack.enter_async_context(database_url(settings))
            where = "external" if settings.database_url else f"embedded, {settings.data_dir}"
            if not settings.database_url and reaper.stdin is not None:
                pid_file = EmbeddedPostgres(settings.data_dir / "postgres").pid_file
                reaper.stdin.write(f"{pid_file}\n".encode())
            console.print(f"[green]✓[/] PostgreSQL ready ({where})")
            status.update("migrating the schema")
            db = Database.connect(db_url, pool_size=1)
            try:
                await migrate.upgrade(db.engine)
            finally:
                await db.close()
            console.print(f"[green]✓[/] schema at {migrate.head()}")
            key_file = settings.kms_key_file or settings.data_dir / "kek.json"  # its secrets' KEK
            env = {"MERIDIAN_DATABASE_URL": db_url, "MERIDIAN_ADMIN_TOKEN": token,
                   "MERIDIAN_KMS_KEY_FILE": str(key_file.absolute())}  # fmt: skip
            cloud = await _local_cloud(stack, settings, fleet, api, token)
            if cloud is not None:
                env |= {"MERIDIAN_LOCAL_CLOUD_URL": cloud.url,
                        "MERIDIAN_LOCAL_CLOUD_TOKEN": cloud.token}  # fmt: skip
                groups = ", ".join(p.name for p in cloud.pools.values())
                console.print(f"[green]✓[/] local cloud on {cloud.url}: the planner resizes "
                              f"pools {groups}")  # fmt: skip
            status.update("starting the control plane")
            cp = await start_control_plane(
                env, host=settings.host, port=settings.port, grpc_port=settings.grpc_port
            )
            supervised = Supervised(cp.process)
            stack.push_async_callback(supervised.stop)
            console.print(f"[green]✓[/] control plane ready on {api}")
            status.update(f"applying {fleet}")
            # beside what an operator added since the last run (tenants, keys, ...): its own
            # objects are brought to the document, nothing else is deleted
            response = await asyncio.to_thread(
                apply_file, api, token, fleet, dry_run=False, prune=False
            )
            if response.status_code != 200:
                raise click.ClickException(f"applying {fleet} failed: {response.text}")
            print_changes(console, response.json())
        nodes = local_nodes(fleet)
        agents = await start_agents(
            stack,
            nodes,
            api=api,
            admin_token=token,
            grpc_target=cp.grpc_target,
            data_dir=settings.data_dir / "agents",
            log_dir=settings.data_dir / "logs",
            envs=cloud.declared_env() if cloud is not None else None,
        )
        if cloud is not None:
            for agent in agents:
                cloud.adopt(agent.node.name, agent.process)
        await _balancers(stack, fleet, agents, cloud)
        console.print(f"[green]✓[/] {len(agents)} agent(s) started; waiting for their engines")
        statuses = await await_engines(console, agents, token, engines_timeout_s)
        print_engines(console, agents, statuses)
        out = settings.data_dir / "local-fleet.json"
        doc = await describe(
            fleet,
            out,
            api=api,
            admin_token=token,
            controlplane_pid=cp.process.pid,
            agents=agents,
            statuses=statuses,
            local_cloud={"url": cloud.url, "token": cloud.token} if cloud is not None else None,
        )
        print_fleet(console, doc, out)
        page = f"{api}/status"
        table = Table(show_header=False, box=None)
        table.add_row("status page", f"{page} (log in with the admin token)")
        table.add_row("API", api)
        table.add_row("API docs", f"{api}/docs")
        table.add_row("agents (gRPC)", f"{settings.host}:{settings.grpc_port}")
        for agent in agents:
            table.add_row(
                f"agent {agent.node.name}", f"{agent.node.url}/agent/status (with the admin token)"
            )
        table.add_row("logs", str(settings.data_dir / "logs"))
        console.print(table)
        console.print(f"[bold]admin token[/] (also in {settings.data_dir / 'admin-token'}):")
        whole(console, f"    {token}")
        console.print("[bold]try[/]:")
        whole(console, f"curl -H 'Authorization: Bearer {token}' {api}/v1/regions")
        first = first_client(doc)
        if first is not None:
            whole(
                console,
                f'curl {first[0]}/chat/completions -H "Authorization: Bearer {first[1]}" '
                """-H 'Content-Type: application/json' -d '{"model": "%s", "messages": """
                """[{"role": "user", "content": "hi"}]}'""" % doc["models"][0],
            )
        if browser and await asyncio.to_thread(open_in_browser, page):
            console.print(f"opened {page} in your browser")
        console.print("Ctrl-C stops everything.")
        await supervise(supervised, settings, env, console, out)


async def _local_cloud(
    stack: AsyncExitStack, settings: Settings, fleet: Path, api: str, token: str
) -> LocalCloud | None:
    """The fleet's clouds, played here for its pools that name a group (None: it has none)."""
    pools, declared = await asyncio.to_thread(local_pools, fleet)
    if not pools:
        return None
    cloud = LocalCloud(
        pools, declared, data_dir=settings.data_dir, log_dir=settings.data_dir / "logs",
        api=api, admin_token=token, grpc_target=f"{settings.host}:{settings.grpc_port}",
    )  # fmt: skip
    await cloud.start()
    stack.push_async_callback(cloud.close)
    return cloud


async def _balancers(
    stack: AsyncExitStack, fleet: Path, agents: list[RunningAgent], cloud: LocalCloud | None
) -> None:
    """Each region's gateway_url: a balancer in front of its agents now, the document's
    nodes' and the machines its pools have grown."""
    for region, (host, port) in gateways(fleet).items():

        def backends(region: str = region) -> list[tuple[str, int]]:
            mine = [(a.node.hostname, a.node.port) for a in agents
                    if a.node.region == region and a.process.returncode is None]  # fmt: skip
            return mine + (cloud.agents(region) if cloud is not None else [])

        balancer = Balancer(region, backends)
        await balancer.start(host, port)
        stack.push_async_callback(balancer.close)


async def supervise(
    supervised: Supervised, settings: Settings, env: dict[str, str], console: Console, out: Path
) -> None:
    """The control plane started again whenever it exits, on the same ports, with backoff;
    the agents keep serving meanwhile, and reconnect."""
    while True:
        code = await supervised.process.wait()
        console.print(
            f"[yellow]![/] the control plane exited ({_exit(code)}); the agents and engines "
            "keep serving from their snapshots. Starting it again"
        )
        backoff = RESTART_MIN_S
        while True:
            await asyncio.sleep(backoff)
            try:
                cp = await start_control_plane(
                    env, host=settings.host, port=settings.port, grpc_port=settings.grpc_port
                )
            except click.ClickException as error:
                backoff = min(RESTART_MAX_S, backoff * 2)
                console.print(f"[red]✗[/] {error.message}; trying again in {backoff:g} s")
                continue
            break
        supervised.process = cp.process
        await asyncio.to_thread(note_controlplane_pid, out, cp.process.pid)
        console.print(f"[green]✓[/] control plane back on {cp.url}; the agents reconnect to it")


def _exit(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


@click.command("up")
@click.option(
    "--fleet",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help=f"fleet document to apply [{EXAMPLE_FLEET.relative_to(EXAMPLE_FLEET.parents[1])}]",
)
@click.option(
    "--engines",
    type=click.Choice(["sim", "sglang"]),
    default="sim",
    show_default=True,
    help="sim: simulated engines; sglang: the real SGLang on this machine's CPU serving a "
    "tiny model made here (default fleet examples/fleet-sglang.yaml; SGLang's environment "
    "is installed once, about 11 GB)",
)
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="REST port [8400]")
@click.option(
    "--no-browser", is_flag=True, help="do not open the status page in a browser (it is printed)"
)
def up_command(fleet: Path | None, engines: str, port: int | None, no_browser: bool) -> None:
    """Run a local fleet: PostgreSQL, the control plane, the fleet applied, agents and engines."""
    settings = Settings().with_overrides(port=port)
    console = Console()
    timeout_s = ENGINES_TIMEOUT_S
    if engines == "sglang":
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        fleet = real_engines.prepare(settings.data_dir, fleet or real_engines.SGLANG_FLEET, console)
        timeout_s = real_engines.ENGINES_TIMEOUT_S
    fleet = fleet or EXAMPLE_FLEET
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    fleet = local_adapters.prepare(settings.data_dir, fleet, console)

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        # SIGINT too, explicitly: a process started in the background of a shell that is not
        # interactive inherits SIGINT ignored, and would not stop on it
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        await run_local_fleet(
            settings, fleet, console, browser=not no_browser, engines_timeout_s=timeout_s
        )

    try:
        asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("stopped")
