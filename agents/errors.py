"""The agent's one base error, with a stable code, as the control plane has its own."""

from __future__ import annotations


class AgentError(Exception):
    code = "agent_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SnapshotInvalid(AgentError):
    """The snapshot cannot be applied on this node; it is nacked and the old one kept."""

    code = "snapshot_invalid"


class RegistrationFailed(AgentError):
    code = "registration_failed"
