"""Who listens on an engine's port: an engine is ready only when the process answering on its
port is its own (its process group), never whatever else happens to answer there; and an
engine is not started on a port another process holds.

Read from Linux's /proc: the listening TCP sockets of /proc/net/tcp{,6} with the port, and
the processes whose open files are those sockets. Elsewhere nothing can be known, and nothing
is refused.
"""

from __future__ import annotations

import contextlib
import ipaddress
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


def holders(host: str, port: int) -> list[Holder]:
    """The processes with a socket listening on `port` where it takes `host`'s: the same
    address, or one of them any address (0.0.0.0, ::)."""
    inodes = _listening(host, port)
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


def held_by_others(host: str, port: int, group: int | None = None) -> Holder | None:
    """A process outside `group` (none: any process) listening on `host`:`port`."""
    return next((h for h in holders(host, port) if h.group != group), None)


def owned(host: str, port: int, group: int) -> bool:
    """Whether a process of `group` listens on `host`:`port`; True where it cannot be known."""
    if not known():
        return True
    return any(h.group == group for h in holders(host, port))


def _listening(host: str, port: int) -> set[str]:
    wanted = _address(host)
    inodes = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (PROC / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                address, _, hex_port = local.rpartition(":")
                if state != LISTEN or int(hex_port, 16) != port:
                    continue
                if _overlap(wanted, _kernel_address(address)):
                    inodes.add(inode)
    return inodes


Address = ipaddress.IPv4Address | ipaddress.IPv6Address | None  # None: not an address


def _address(host: str) -> Address:
    try:
        return _plain(ipaddress.ip_address(host))
    except ValueError:
        return None  # a name: taken to overlap any address


def _kernel_address(hex_address: str) -> Address:
    """/proc/net/tcp{,6}'s address: 32-bit words in the host's (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return _plain(ipaddress.ip_address(words))


def _plain(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _overlap(a: Address, b: Address) -> bool:
    if a is None or b is None or a.is_unspecified or b.is_unspecified:
        return True
    return a == b


def _holder(pid: int) -> Holder:
    group, command = pid, "?"
    with contextlib.suppress(OSError):
        group = os.getpgid(pid)
    with contextlib.suppress(OSError):
        raw = (PROC / str(pid) / "cmdline").read_bytes()
        command = raw.replace(b"\0", b" ").decode(errors="replace").strip()[:120] or "?"
    return Holder(pid, group, command)
