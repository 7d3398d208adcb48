"""The control plane's API fixture, for the tests that apply what Terraform renders."""

from tests.controlplane.conftest import api

__all__ = ["api"]
