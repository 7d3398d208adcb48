"""Child processes of Meridian's own, started one way: the control plane, etcd (Debian's
etcd-server), node agents and simulated engines, each started, awaited until it answers, and
stopped.

`meridian up`, the benchmarks and the tests all start them here; what differs between them
(the settings a test speeds up, where the logs go) is what they pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import click
import httpx

STOP_GRACE_S = 10.0


_HANDED_OUT: set[int] = set()  # ports this process was given, perhaps not bound yet


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now, and that this process has
    not been given before: a port handed out and not yet bound is free to the kernel, which
    would give it again (a test's agent port, then its control plane's)."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no loopback port that this process was not given already")


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on host:port already (a bind there would fail)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


async def stop_child(proc: asyncio.subprocess.Process, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL if it has not ended within the grace period."""
    if proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def wait_ready(
    url: str,
    proc: asyncio.subprocess.Process,
    timeout_s: float = 60,
    *,
    path: str = "/readyz",
    what: str = "the control plane",
) -> None:
    """Poll `url + path` until it answers 200; fail if `proc` exits or time runs out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with httpx.AsyncClient(timeout=2) as client:
        while loop.time() < deadline:
            if proc.returncode is not None:
                raise click.ClickException(f"{what} exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{url}{path}")).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise click.ClickException(f"{what} was not ready within {timeout_s:.0f} s")


@dataclass
class ControlPlane:
    """A running `meridian controlplane serve`."""

    process: asyncio.subprocess.Process
    url: str
    grpc_target: str


async def start_control_plane(
    env: Mapping[str, str],
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    grpc_port: int | None = None,
    timeout_s: float = 60,
) -> ControlPlane:
    """Start it with `env` over this process's environment and wait until it is ready."""
    port, grpc_port = port or free_port(), grpc_port or free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "meridian",
        "controlplane",
        "serve",
        "--host",
        host,
        "--port",
        str(port),
        "--grpc-port",
        str(grpc_port),
        env={**os.environ, **env},
    )
    started = ControlPlane(proc, f"http://{host}:{port}", f"{host}:{grpc_port}")
    try:
        await wait_ready(started.url, proc, timeout_s)
    except BaseException:
        await stop_child(proc)
        raise
    return started


@asynccontextmanager
async def running_etcd(data_dir: Path) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """A single-member etcd on loopback, its data in `data_dir`: (host:port, process)."""
    binary = shutil.which("etcd")
    if binary is None:
        raise click.ClickException("etcd is not installed (Debian: apt-get install etcd-server)")
    client_port, peer_port = free_port(), free_port()
    peer = f"127.0.0.1:{peer_port}"
    proc = await start_etcd_member(
        "meridian", data_dir / "data", f"127.0.0.1:{client_port}", peer,
        f"meridian=http://{peer}", log=data_dir / "etcd.log", binary=binary,
    )  # fmt: skip
    try:
        async with asyncio.timeout(30):
            while True:
                if proc.returncode is not None:
                    raise click.ClickException(
                        f"etcd exited with {proc.returncode}; see {data_dir}/etcd.log"
                    )
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", client_port)
                    writer.close()
                    break
                except OSError:
                    await asyncio.sleep(0.1)
        yield f"127.0.0.1:{client_port}", proc
    finally:
        await stop_child(proc)


async def start_etcd_member(
    name: str,
    data_dir: Path,
    client: str,
    peer: str,
    cluster: str,
    *,
    new: bool = True,
    cluster_name: str = "etcd-cluster",
    fast: bool = False,
    log: Path | None = None,
    binary: str = "etcd",
) -> asyncio.subprocess.Process:
    """One etcd member on loopback (`client` and `peer`: host:port), of `cluster` (etcd's
    `--initial-cluster`: name=http://peer,...), a new cluster's or one joining (`new`);
    `cluster_name`: etcd's initial cluster token (its default unless given).
    `fast`: heartbeats of 100 ms and elections within a second, as a test that kills
    members wants."""
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    argv = [
        binary, f"--name={name}", f"--data-dir={data_dir}",
        f"--listen-client-urls=http://{client}", f"--advertise-client-urls=http://{client}",
        f"--listen-peer-urls=http://{peer}", f"--initial-advertise-peer-urls=http://{peer}",
        f"--initial-cluster={cluster}",
        f"--initial-cluster-state={'new' if new else 'existing'}",
        f"--initial-cluster-token={cluster_name}", "--log-level=error",
    ]  # fmt: skip
    if fast:
        argv += ["--heartbeat-interval=100", "--election-timeout=1000"]
    return await _spawn(argv, None, log)


@dataclass
class Child:
    """A child process of Meridian's own, and the URL it answers on."""

    process: asyncio.subprocess.Process
    url: str


async def _spawn(
    argv: Sequence[str], env: Mapping[str, str] | None, log: Path | None
) -> asyncio.subprocess.Process:
    """`argv` with `env` over this process's environment; its output to `log` (appended),
    else to this process's own."""
    environ = {**os.environ, **(env or {})}
    if log is None:
        return await asyncio.create_subprocess_exec(*argv, env=environ)
    await asyncio.to_thread(log.parent.mkdir, parents=True, exist_ok=True)
    with await asyncio.to_thread(log.open, "ab") as out:
        return await asyncio.create_subprocess_exec(*argv, env=environ, stdout=out, stderr=out)


async def start_agent(
    control_plane: str,
    region: str,
    data_dir: Path,
    *,
    node: str = "",
    hostname: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    bootstrap_token: str | None = None,
    operator_token: str | None = None,
    env: Mapping[str, str] | None = None,
    inside: Sequence[str] = (),
    log: Path | None = None,
    ready_timeout_s: float | None = 30,
) -> Child:
    """`meridian agent run`, awaited until its port answers (`ready_timeout_s` None: not
    awaited). Its tokens go in its environment, never on its command line. `inside`: a
    prefix that runs it elsewhere (a network namespace); `env`: more settings
    (MERIDIAN_AGENT_*)."""
    port = port or free_port()
    args = ["--control-plane", control_plane, "--region", region, "--data-dir", str(data_dir)]
    args += ["--host", host, "--port", str(port)]
    args += ["--node", node] if node else []
    args += ["--hostname", hostname] if hostname else []
    told = dict(env or {})
    if bootstrap_token:
        told["MERIDIAN_AGENT_BOOTSTRAP_TOKEN"] = bootstrap_token
    if operator_token:
        told["MERIDIAN_AGENT_OPERATOR_TOKEN"] = operator_token
    argv = [*inside, sys.executable, "-m", "meridian", "agent", "run", *args]
    process = await _spawn(argv, told, log)
    agent = Child(process, f"http://{host}:{port}")
    if ready_timeout_s is not None:
        try:
            await wait_ready(agent.url, process, ready_timeout_s, path="/healthz", what="an agent")
        except BaseException:
            await stop_child(process)
            raise
    return agent


async def start_sim(
    args: Sequence[str],
    *,
    port: int | None = None,
    log: Path | None = None,
    ready_timeout_s: float | None = 30,
) -> Child:
    """`meridian sim` (the SGLang simulator) on `port` with `args`, awaited until it is ready
    (`/ready`; `ready_timeout_s` None: not awaited, for several started together)."""
    port = port or free_port()
    argv = [sys.executable, "-m", "meridian", "sim", "--port", str(port), *args]
    process = await _spawn(argv, None, log)
    sim = Child(process, f"http://127.0.0.1:{port}")
    if ready_timeout_s is not None:
        await sim_ready(sim, ready_timeout_s)
    return sim


async def sim_ready(sim: Child, timeout_s: float = 30) -> None:
    """Until the simulator is ready; stopped if it is not."""
    try:
        await wait_ready(sim.url, sim.process, timeout_s, path="/ready", what="a simulator")
    except BaseException:
        await stop_child(sim.process)
        raise
