"""The control plane's fixtures (tests/kits/controlplane.py): its API in-process, and as a real
server process."""

from tests.kits.controlplane import api, server

__all__ = ["api", "server"]
