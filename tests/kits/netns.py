"""A network namespace joined to this one by a veth pair, made by the test and removed after:
a region inside it can be cut off without a word (its end of the pair goes down, so packets to
it vanish, as in a partition) and joined again. Needs root (the test command runs as root);
where namespaces cannot be made, the test is skipped and says why."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Netns:
    name: str
    host_ip: str  # this side of the pair
    inner_ip: str  # the namespace's side
    inner_if: str

    def run(self) -> list[str]:
        """The prefix that runs a command inside."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        _ip("netns", "exec", self.name, "ip", "link", "set", self.inner_if, "down")

    def heal(self) -> None:
        _ip("netns", "exec", self.name, "ip", "link", "set", self.inner_if, "up")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def namespace(tag: str) -> Iterator[Netns]:
    unique = os.getpid() % 100_000
    name, outer_if, inner_if = f"mrd{unique}{tag}", f"mrd{unique}{tag}o", f"mrd{unique}{tag}i"
    third = 1 + unique % 250
    host_ip, inner_ip = f"10.213.{third}.1", f"10.213.{third}.2"
    try:
        _ip("netns", "add", name)
    except (OSError, subprocess.SubprocessError) as error:
        pytest.skip(f"network namespaces cannot be made here: {error}")
    try:
        _ip("link", "add", outer_if, "type", "veth", "peer", "name", inner_if)
        _ip("link", "set", inner_if, "netns", name)
        _ip("addr", "add", f"{host_ip}/30", "dev", outer_if)
        _ip("link", "set", outer_if, "up")
        for command in (
            ("addr", "add", f"{inner_ip}/30", "dev", inner_if),
            ("link", "set", inner_if, "up"),
            ("link", "set", "lo", "up"),
        ):
            _ip("netns", "exec", name, "ip", *command)
        yield Netns(name, host_ip, inner_ip, inner_if)
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            _ip("link", "del", outer_if)
        with contextlib.suppress(subprocess.SubprocessError):
            _ip("netns", "del", name)
