"""Who listens on an engine's port: an engine is ready only when the process answering on its
port is its own (its process group), never whatever else happens to answer there; and an
engine is not started on a port another process holds.

Read from Linux's /proc: the listening TCP sockets of /proc/net/tcp{,6} with the port, and
the processes whose open files are those sockets. Elsewhere nothing can be known, and nothing
is refused.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"


@dataclass(frozen=True)
class Holder:
    pid: int
    group: int  # its process group
    command: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command})"


def known() -> bool:
    return (PROC / "net" / "tcp").exists()


def holders(port: int) -> list[Holder]:
    """The processes with a socket listening on `port` (any address)."""
    inodes = _listening(port)
    if not inodes:
        return []
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    found.append(_holder(int(entry.name)))
                    break
    return found


def held_by_others(port: int, group: int | None = None) -> Holder | None:
    """A process outside `group` (none: any process) listening on `port`."""
    return next((h for h in holders(port) if h.group != group), None)


def owned(port: int, group: int) -> bool:
    """Whether a process of `group` listens on `port`; True where it cannot be known."""
    if not known():
        return True
    return any(h.group == group for h in holders(port))


def _listening(port: int) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (PROC / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                    inodes.add(inode)
    return inodes


def _holder(pid: int) -> Holder:
    group, command = pid, "?"
    with contextlib.suppress(OSError):
        group = os.getpgid(pid)
    with contextlib.suppress(OSError):
        raw = (PROC / str(pid) / "cmdline").read_bytes()
        command = raw.replace(b"\0", b" ").decode(errors="replace").strip()[:120] or "?"
    return Holder(pid, group, command)
