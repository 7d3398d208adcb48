"""What an operator sees when a command cannot do its job: one clear line and a status, never a
traceback, and no process left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import httpx

from controlplane.db import migrate
from controlplane.db.embedded import EmbeddedPostgres
from meridian.procs import free_port
from tests.kits.controlplane import run_cli


def _one_clear_line(output: str) -> str:
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, output
    return errors[0]


async def test_a_database_url_that_is_not_postgres_is_named() -> None:
    env = {"MERIDIAN_DATABASE_URL": "mysql://u:p@db/x"}
    code, output = await run_cli("controlplane", "serve", env=env)
    assert code == 2
    assert "MERIDIAN_DATABASE_URL must be a postgresql:// URL" in _one_clear_line(output)


async def test_a_database_that_cannot_be_reached_is_named() -> None:
    url = f"postgresql+psycopg://meridian:hidden@127.0.0.1:{free_port()}/fleet"
    for command in (("serve",), ("migrate",)):
        code, output = await run_cli("controlplane", *command, env={"MERIDIAN_DATABASE_URL": url})
        assert code == 1
        line = _one_clear_line(output)
        assert "cannot reach PostgreSQL at postgresql+psycopg://meridian:***@127.0.0.1" in line
        assert "hidden" not in output  # the password is never printed


async def test_serve_on_a_database_never_migrated_says_what_to_run(
    empty_database_url: str,
) -> None:
    url = empty_database_url.replace("postgresql://", "postgres://")  # another usual spelling
    code, output = await run_cli("controlplane", "serve", env={"MERIDIAN_DATABASE_URL": url})
    assert code == 1
    line = _one_clear_line(output)
    assert "empty (never migrated)" in line
    assert "run `meridian controlplane migrate` first" in line
    code, output = await run_cli("controlplane", "migrate", env={"MERIDIAN_DATABASE_URL": url})
    assert code == 0, output
    assert f"schema at {migrate.head()}" in output


async def test_a_grpc_port_in_use_is_named(database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = await run_cli(
            "controlplane", "serve", "--port", str(free_port()), "--grpc-port", str(port),
            env={"MERIDIAN_DATABASE_URL": database_url},
        )  # fmt: skip
    assert code == 1
    assert f"the gRPC port 127.0.0.1:{port} cannot be bound" in _one_clear_line(output)


async def test_serve_in_a_new_directory_runs_its_own_database_and_stops_it(
    tmp_path: Path,
) -> None:
    """No MERIDIAN_DATABASE_URL, no .meridian yet: an embedded PostgreSQL is made, migrated and
    served; SIGTERM stops the replica and the database it started, and exits 0."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MERIDIAN_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meridian", "controlplane", "serve", "--port", str(port),
        "--grpc-port", str(free_port()), cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            for _ in range(300):
                try:
                    ready = await http.get("/readyz")
                    if ready.status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
            assert ready.json() == {"status": "ready", "schema": migrate.head()}
        # where it keeps its files (under root, a place of its own when tmp_path is private)
        pgdata = EmbeddedPostgres(tmp_path / ".meridian" / "postgres").pgdata
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, output.decode()
    assert "Traceback" not in output.decode()
    for _ in range(50):  # pg_ctl stop -w has returned; the postmaster's pid is reaped
        if not _alive(postmaster):
            break
        await asyncio.sleep(0.1)
    assert not _alive(postmaster), "the embedded PostgreSQL was left running"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_up_on_a_port_in_use_says_which_before_starting_anything(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = await run_cli(
            "up", "--no-browser", "--port", str(port),
            env={"MERIDIAN_DATA_DIR": str(tmp_path / "up")},
        )  # fmt: skip
    assert code == 1
    assert f"127.0.0.1:{port}, for the API (--port), is in use" in _one_clear_line(output)
    assert not (tmp_path / "up" / "postgres").exists()  # nothing was started
