"""An embedded PostgreSQL: the machine's own server binaries, run in a local data directory.

It is a real PostgreSQL, started with initdb and pg_ctl, listening on 127.0.0.1 only with a
password of its own. A second start reuses the running server, or the data directory.
PostgreSQL refuses to run as root, so under root the server runs as the `postgres` user.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import pwd
import secrets
import shutil
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

import psycopg

from controlplane.errors import EmbeddedDatabaseError

log = logging.getLogger(__name__)

DATABASE = "meridian"
SUPERUSER = "meridian"

PID_FILE = "postmaster.pid"  # in the data directory, while the server runs
MOVED_ROOT = Path("/var/lib/meridian")  # under root, for data directories postgres cannot reach

# Settings for throwaway clusters (tests): durability traded for speed.
UNSAFE_FAST = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


@dataclass(frozen=True)
class Credentials:
    port: int
    user: str
    password: str

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"


def find_bin_dir(explicit: Path | None = None) -> Path:
    """The directory holding initdb and pg_ctl: explicit, Debian's newest, or on PATH."""
    if explicit is not None:
        candidates = [explicit]
    else:
        debian = sorted(
            Path("/usr/lib/postgresql").glob("*/bin"),
            key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
            reverse=True,
        )
        on_path = shutil.which("pg_ctl")
        candidates = [*debian, *([Path(on_path).resolve().parent] if on_path else [])]
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    raise EmbeddedDatabaseError(
        "PostgreSQL server binaries (initdb, pg_ctl) were not found. Install them "
        "(Debian/Ubuntu: apt-get install postgresql) or set MERIDIAN_DATABASE_URL."
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedPostgres:
    """Starts (or reuses) a PostgreSQL server whose files live under `root`."""

    def __init__(
        self,
        root: Path,
        *,
        bin_dir: Path | None = None,
        server_settings: dict[str, str] | None = None,
    ) -> None:
        self._os_user = self._server_user()
        self.requested = root.resolve()
        self.root = self._reachable_root(self.requested)
        self.pgdata = self.root / "data"
        self.logfile = self.root / "server.log"
        self._credentials_file = self.root / "credentials.json"
        self.pid_file = self.pgdata / PID_FILE
        self._bin_dir = bin_dir
        self._server_settings = server_settings or {}
        self._started_here = False

    @staticmethod
    def _server_user() -> pwd.struct_passwd | None:
        """The OS account to run the server as: None for ourselves, `postgres` under root."""
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam("postgres")
        except KeyError as exc:
            raise EmbeddedDatabaseError(
                "PostgreSQL will not run as root and there is no 'postgres' user to run it as. "
                "Run as an ordinary user, install PostgreSQL from your distribution (which "
                "creates that user), or set MERIDIAN_DATABASE_URL."
            ) from exc

    @property
    def credentials(self) -> Credentials:
        data = json.loads(self._credentials_file.read_text())
        return Credentials(port=int(data["port"]), user=data["user"], password=data["password"])

    async def start(self) -> Credentials:
        """Initialise the cluster if new, start it unless it runs, and create the database."""
        bin_dir = find_bin_dir(self._bin_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        if self.root != self.requested:  # moved under MOVED_ROOT: say whose it is
            (self.root / "owner").write_text(f"{self.requested}\n")
            await asyncio.to_thread(sweep_orphans, MOVED_ROOT, keep=self.root)
        if not (self.pgdata / "PG_VERSION").exists():
            await self._initdb(bin_dir)
        creds = self.credentials
        if await self._run(bin_dir / "pg_ctl", "status", "-D", str(self.pgdata), check=False) != 0:
            log.info("starting embedded PostgreSQL", extra={"port": creds.port})
            await self._run(
                bin_dir / "pg_ctl",
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                str(self.pgdata),
                "-l",
                str(self.logfile),
            )
            self._started_here = True
        await self._ensure_database(creds)
        return creds

    async def stop(self) -> None:
        """Stop the server if this object started it; a server found running is left alone."""
        if not self._started_here:
            return
        bin_dir = find_bin_dir(self._bin_dir)
        await self._run(bin_dir / "pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.pgdata))
        self._started_here = False

    async def _initdb(self, bin_dir: Path) -> None:
        if self.pgdata.exists() and any(self.pgdata.iterdir()):
            raise EmbeddedDatabaseError(f"{self.pgdata} exists, is not empty and holds no cluster")
        creds = Credentials(port=_free_port(), user=SUPERUSER, password=secrets.token_urlsafe(24))
        pwfile = self.root / ".pwfile"
        pwfile.write_text(creds.password + "\n")
        pwfile.chmod(0o600)
        self._give_to_server(pwfile)
        self._give_to_server(self.root)
        try:
            await self._run(
                bin_dir / "initdb",
                "-D",
                str(self.pgdata),
                "-U",
                SUPERUSER,
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            )
        finally:
            pwfile.unlink(missing_ok=True)
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(creds.port),
            "unix_socket_directories": "''",
            "max_connections": "200",
            **{key: f"'{value}'" for key, value in self._server_settings.items()},
        }
        with (self.pgdata / "postgresql.conf").open("a") as handle:
            handle.write("\n# written by meridian\n")
            handle.writelines(f"{key} = {value}\n" for key, value in conf.items())
        self._credentials_file.write_text(
            json.dumps({"port": creds.port, "user": creds.user, "password": creds.password})
        )
        self._credentials_file.chmod(0o600)

    async def _ensure_database(self, creds: Credentials) -> None:
        async with await psycopg.AsyncConnection.connect(
            creds.url("postgres"), autocommit=True
        ) as conn:
            found = await conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
            if await found.fetchone() is None:
                await conn.execute(f'CREATE DATABASE "{DATABASE}"')

    def _give_to_server(self, path: Path) -> None:
        if self._os_user is not None:
            os.chown(path, self._os_user.pw_uid, self._os_user.pw_gid)

    def _reachable_root(self, root: Path) -> Path:
        """Under root, a place the `postgres` user can reach: `root` itself if every parent
        lets it pass, else a directory of its own under /var/lib/meridian (say, for a
        checkout under /root, which is private)."""
        if self._os_user is None:
            return root
        uid = self._os_user.pw_uid
        for parent in root.parents:
            if not parent.exists():
                continue  # made by start(), with the umask's mode
            info = parent.stat()
            if info.st_uid != uid and not info.st_mode & stat.S_IXOTH:
                digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
                moved = MOVED_ROOT / f"postgres-{digest}"
                log.warning("%s is private to root; PostgreSQL keeps its files in %s", root, moved)
                return moved
        return root

    async def _run(self, program: Path, *args: str, check: bool = True) -> int:
        kwargs: dict[str, object] = {}
        if self._os_user is not None:
            kwargs = {
                "user": self._os_user.pw_uid,
                "group": self._os_user.pw_gid,
                "extra_groups": [],
                "cwd": str(self.root),
            }
        proc = await asyncio.create_subprocess_exec(
            str(program),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "LC_ALL": "C.UTF-8"},
            **kwargs,  # type: ignore[arg-type]
        )
        output, _ = await proc.communicate()
        code = proc.returncode if proc.returncode is not None else -1
        if check and code != 0:
            tail = ""
            if self.logfile.exists():
                tail = "\n".join(self.logfile.read_text(errors="replace").splitlines()[-15:])
            raise EmbeddedDatabaseError(
                f"{program.name} {' '.join(args[:1])} failed ({code}): "
                f"{output.decode(errors='replace').strip()}\n{tail}".strip()
            )
        return code


def sweep_orphans(moved_root: Path, keep: Path) -> list[Path]:
    """Data directories moved under `moved_root` whose owner (the directory they were asked
    for) is gone and whose server does not run: removed, so that runs from places that come
    and go (temporary directories) do not pile them up. Returns those removed."""
    removed = []
    for directory in sorted(moved_root.glob("postgres-*")):
        owner_file = directory / "owner"
        if directory == keep or not owner_file.is_file():
            continue  # one of ours without an owner is left alone: whose it is is not known
        if Path(owner_file.read_text().strip()).exists() or _server_runs(directory / "data"):
            continue
        shutil.rmtree(directory, ignore_errors=True)
        log.info("removed %s: the data directory it served is gone", directory)
        removed.append(directory)
    return removed


def _server_runs(pgdata: Path) -> bool:
    pid = server_pid(pgdata / PID_FILE)
    return pid is not None and pid_alive(pid)


def server_pid(pid_file: Path) -> int | None:
    """The server a PostgreSQL pid file names (its first line), if the file is there."""
    try:
        return int(pid_file.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        return b") Z " not in Path(f"/proc/{pid}/stat").read_bytes()[:64]
    return True
