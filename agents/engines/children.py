"""Engine processes that outlive the agent: recorded in a pid file, adopted on restart.

An engine runs in its own session, so an agent that dies (even by SIGKILL) leaves it
serving; a restarted agent that wants the same engine with the same command line adopts it
instead of restarting it (SGLang takes minutes to load weights). The pid file records the
pid, the process's start time (so a reused pid is not mistaken for it) and a fingerprint of
its command line and environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from agents.engines.base import Launch

log = logging.getLogger(__name__)
POLL_S = 0.2


def fingerprint(launch: Launch) -> str:
    return hashlib.sha256(
        json.dumps([launch.argv, sorted(launch.env.items())]).encode()
    ).hexdigest()


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot; None if it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


@dataclass
class Adopted:
    """A process this agent did not start: watched by polling, signalled by its group."""

    pid: int
    ticks: int
    returncode: int | None = None

    def alive(self) -> bool:
        if self.returncode is None and start_ticks(self.pid) != self.ticks:
            self.returncode = -1  # not ours to reap: its exit status is unknown
        return self.returncode is None

    async def wait(self) -> int:
        while self.alive():  # noqa: ASYNC110 - not our child: nothing to await but /proc
            await asyncio.sleep(POLL_S)
        assert self.returncode is not None
        return self.returncode


@dataclass(frozen=True)
class PidFile:
    path: Path

    def write(self, pid: int, launch: Launch) -> None:
        record = {"pid": pid, "ticks": start_ticks(pid), "fingerprint": fingerprint(launch)}
        self.path.write_text(json.dumps(record))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def adopt(self, launch: Launch) -> Adopted | None:
        """The recorded engine if it still runs with this launch; a different one is stopped."""
        try:
            record = json.loads(self.path.read_text())
            pid, ticks, print_ = int(record["pid"]), record["ticks"], str(record["fingerprint"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None
        if ticks is None or start_ticks(pid) != ticks:
            self.remove()
            return None
        if print_ != fingerprint(launch):
            log.info("engine pid %s runs other settings; stopping it", pid)
            kill_group(pid, signal.SIGKILL)
            self.remove()
            return None
        return Adopted(pid, int(ticks))


def kill_leader(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def reap_strays(directory: Path, keep: set[Path]) -> int:
    """Stop engines a previous agent left running that no one wants now."""
    stopped = 0
    for path in directory.glob("*.pid"):
        if path in keep:
            continue
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
            record = json.loads(path.read_text())
            if record["ticks"] is not None and start_ticks(int(record["pid"])) == record["ticks"]:
                kill_group(int(record["pid"]), signal.SIGTERM)
                stopped += 1
        path.unlink(missing_ok=True)
    return stopped
