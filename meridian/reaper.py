"""The local fleet's reaper: no process of `meridian up` outlives it, even when it is killed
with SIGKILL and has no chance to stop them.

`meridian up` starts this first, in a session of its own (a Ctrl-C in the terminal does not
reach it), and holds the write end of its stdin. Every process of the fleet (the control
plane, the agents, their engines, PostgreSQL) inherits MERIDIAN_FLEET_ID from `meridian up`.
When the pipe closes, whether `meridian up` ended or was killed, the reaper sends SIGTERM to
every process that carries the fleet's id, SIGINT (a fast shutdown) to the PostgreSQL servers
whose pid files it was told of (one path a line on stdin: PostgreSQL rewrites its environment
for its process titles), and SIGKILL to what is left after GRACE_S.

Run as `python -m meridian.reaper <fleet id>`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from controlplane.db.embedded import pid_alive, server_pid

ENV = "MERIDIAN_FLEET_ID"
GRACE_S = 4.0


def marked(fleet_id: str, spare: frozenset[int] = frozenset()) -> set[int]:
    """The processes that carry the fleet's id in their environment, but for this one and
    `spare`."""
    mark = f"{ENV}={fleet_id}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spare | {os.getpid()}:
            continue
        with contextlib.suppress(OSError):
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
    return found


def postmasters(pid_files: list[Path]) -> set[int]:
    """The servers the pid files name, where the files are still there."""
    return {pid for pid in map(server_pid, pid_files) if pid is not None}


def reap(
    fleet_id: str, pid_files: list[Path], spare: frozenset[int], grace_s: float = GRACE_S
) -> int:
    """Everything of the fleet stopped but `spare`; how many processes there were."""
    servers = postmasters(pid_files)
    targets = marked(fleet_id, spare) | servers
    for pid in targets:  # PostgreSQL's fast shutdown: its clients are going too
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT if pid in servers else signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(pid_alive(p) for p in targets):
        time.sleep(0.1)
    for pid in targets | marked(fleet_id, spare):  # and what started meanwhile
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(targets)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0]:
        print("usage: python -m meridian.reaper <fleet id>", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is meridian up's
    up = os.getppid()  # spared: on a clean exit it closes the pipe last, still alive
    pid_files = [Path(line.strip()) for line in sys.stdin if line.strip()]  # until EOF
    reap(argv[0], pid_files, frozenset({up}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
