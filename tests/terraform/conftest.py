"""The control plane's fixtures, for the tests that give it what Terraform renders: its API
in-process, and a real server for `meridian join`."""

from tests.kits.controlplane import api, server

__all__ = ["api", "server"]
