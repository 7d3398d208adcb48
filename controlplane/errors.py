"""The control plane's errors. Each has a stable `code`; api/problems.py maps them to HTTP."""

from __future__ import annotations

from typing import Any


class MeridianError(Exception):
    """Base of every error the control plane reports to a caller."""

    code = "internal"
    status = 500
    title = "Internal error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class ValidationFailed(MeridianError):
    code = "validation_failed"
    status = 422
    title = "The request is not valid"

    def __init__(self, detail: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(detail, errors=errors)


class PriceInEffect(MeridianError):
    code = "price_in_effect"
    status = 409
    title = "A price in effect cannot change"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, errors=[{"field": "pricing.prices", "message": detail}])


class MalformedBody(MeridianError):
    code = "malformed_body"
    status = 422
    title = "The request body cannot be read"


class UnknownReference(MeridianError):
    code = "unknown_reference"
    status = 422
    title = "A referenced object does not exist"

    def __init__(self, field: str, kind: str, name: str) -> None:
        super().__init__(
            f"{field}: no {kind} named {name!r}",
            errors=[{"field": field, "message": f"no {kind} named {name!r}"}],
        )


class InvalidFallbackChain(MeridianError):
    code = "invalid_fallback_chain"
    status = 422
    title = "The fallback chain is not valid"

    def __init__(self, detail: str, field: str = "peers") -> None:
        super().__init__(detail, errors=[{"field": field, "message": detail}])


class NameTaken(MeridianError):
    """A tiered route and a model share one namespace: the name clients ask for."""

    code = "name_taken"
    status = 409
    title = "The name is taken by another kind"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, errors=[{"field": "name", "message": detail}])


class NotFound(MeridianError):
    code = "not_found"
    status = 404
    title = "Not found"


class AlreadyExists(MeridianError):
    code = "already_exists"
    status = 409
    title = "An object with that identity already exists"


class RolloutNotActive(MeridianError):
    code = "rollout_not_active"
    status = 409
    title = "No rollout is running"


class Revoked(MeridianError):
    code = "revoked"
    status = 409
    title = "It is revoked"


class HasDependents(MeridianError):
    code = "has_dependents"
    status = 409
    title = "Other objects depend on this one"

    def __init__(self, detail: str, dependents: list[str]) -> None:
        super().__init__(detail, dependents=dependents)


class VersionMismatch(MeridianError):
    code = "version_mismatch"
    status = 412
    title = "The object has changed since you read it"


class PreconditionRequired(MeridianError):
    code = "precondition_required"
    status = 428
    title = "If-Match is required"


class Unauthenticated(MeridianError):
    code = "unauthenticated"
    status = 401
    title = "Authentication required"


class Forbidden(MeridianError):
    code = "forbidden"
    status = 403
    title = "Not allowed"


class UnsupportedMediaType(MeridianError):
    code = "unsupported_media_type"
    status = 415
    title = "Unsupported media type"


class EmbeddedDatabaseError(MeridianError):
    code = "embedded_database"
    status = 503
    title = "The embedded PostgreSQL could not be started"


class InvalidBootstrapToken(Unauthenticated):
    code = "bootstrap_token_invalid"
    title = "The bootstrap token is not valid"


class RevokedBootstrapToken(Unauthenticated):
    code = "bootstrap_token_revoked"
    title = "The bootstrap token was revoked"


class ExpiredBootstrapToken(Unauthenticated):
    code = "bootstrap_token_expired"
    title = "The bootstrap token has expired"


class InvalidCredential(Unauthenticated):
    code = "agent_credential_invalid"
    title = "The agent credential is not valid"


class WrongRegion(Forbidden):
    code = "wrong_region"
    title = "That region is not this agent's"


class ProtocolViolation(MeridianError):
    code = "protocol_violation"
    status = 400
    title = "The agent broke the protocol"


class HeartbeatMissed(MeridianError):
    code = "heartbeat_missed"
    status = 408
    title = "The agent stopped sending heartbeats"


class CoordinationUnavailable(MeridianError):
    code = "coordination_unavailable"
    status = 503
    title = "etcd cannot be reached"


class DatabaseUnreachable(MeridianError):
    code = "database_unreachable"
    status = 503
    title = "The database cannot be reached"


class SchemaNotCurrent(MeridianError):
    code = "schema_not_current"
    status = 503
    title = "The database's schema is not the one this version needs"


class PortUnavailable(MeridianError):
    code = "port_unavailable"
    status = 503
    title = "A port cannot be bound"
