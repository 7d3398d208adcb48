"""Settings of a control-plane process, read once in the entry point and passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Self

import httpx
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

from controlplane.domain import PlannerMode, RoleGrant

# The spellings of a PostgreSQL URL that operators and other tools use; all mean the same
# database, reached here through psycopg 3.
SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+asyncpg",
           "postgresql+psycopg2", "postgresql+psycopg_async")  # fmt: skip


def url_problem(url: str) -> str | None:
    """Why `url` is not a PostgreSQL URL that Meridian can use; None when it is."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        return f"must be a postgresql:// URL (or {', '.join(s + '://' for s in SCHEMES[1:])})"
    try:
        parsed = make_url(f"postgresql://{rest}")
    except ValueError as error:
        return f"cannot be parsed: {error}"
    if not parsed.host and not parsed.query.get("host"):
        return "names no host"
    return None


_PLACEHOLDERS = {"changeme", "change-me", "secret", "password", "admin", "token", "xxx"}


class Settings(BaseSettings):
    """Everything a control-plane process may be told, from `MERIDIAN_*` variables."""

    model_config = SettingsConfigDict(env_prefix="MERIDIAN_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="postgresql:// URL; unset means an embedded PostgreSQL in data_dir",
    )
    data_dir: Path = Field(default=Path(".meridian"), description="local state directory")
    admin_token: SecretStr | None = Field(
        default=None, description="accepted as an admin bearer token, for bootstrapping"
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8400, ge=1, le=65535)
    grpc_port: int = Field(default=8401, ge=1, le=65535)
    log_level: str = "info"
    advertise_host: str | None = Field(
        default=None, description="the address other replicas and agents reach; default: host"
    )
    tls_cert_file: Path | None = Field(default=None, description="PEM certificate of the gRPC port")
    tls_key_file: Path | None = Field(default=None, description="PEM private key of the gRPC port")
    tls_client_ca_file: Path | None = Field(
        default=None, description="PEM CA; set: agents must present a certificate it signed"
    )
    currency: str = Field(
        default="USD",
        pattern=r"^[A-Z]{3}$",
        description="the currency of models' prices and of usage reports (ISO 4217)",
    )
    heartbeat_timeout_s: float = Field(
        default=15.0, gt=0, le=3600, description="close an agent's stream after this silence"
    )
    etcd_endpoints: str | None = Field(
        default=None, description="host:port[,host:port...]; unset: one replica, in-process"
    )
    etcd_prefix: str = Field(default="/meridian", pattern=r"^/[A-Za-z0-9/_-]*$")
    lease_ttl_s: int = Field(default=4, ge=2, le=60, description="etcd lease of presence keys")
    node_down_after_s: float = Field(
        default=10.0, gt=0, le=3600, description="a node with no agent stream for this long is down"
    )
    replica_id: str | None = Field(default=None, description="default: host-pid-random")
    quota_leases: bool = Field(
        default=True,
        description="split tenants' quotas by demand; false: every agent keeps its static share",
    )
    adapter_residency_s: float = Field(
        default=5.0, ge=0.5, le=3600,
        description="the leader plans where tenants' LoRA adapters stay loaded this often, "
        "from the demand in the heartbeats (controlplane/services/residency.py)",
    )  # fmt: skip
    kms: str = Field(
        default="local",
        pattern=r"^(local|(aws-kms|gcp-kms|azure-kv):\S+)$",
        description="the key-encryption key that wraps every stored secret's data key: 'local' "
        "(the key file kms_key_file), 'aws-kms:<key id, ARN or alias>', "
        "'gcp-kms:projects/P/locations/L/keyRings/R/cryptoKeys/K' or "
        "'azure-kv:https://VAULT/keys/NAME/VERSION' (controlplane/services/sealing/kms.py)",
    )
    kms_key_file: Path | None = Field(
        default=None, description="the local KEKs; default: data_dir/kek.json (replicas share it)"
    )
    adapter_cold_rps: float = Field(
        default=0.02, ge=0, le=1000,
        description="an adapter with fewer requests a second in a region is kept loaded "
        "there only while its engines have room left (on one of them)",
    )  # fmt: skip
    usage_reconcile_s: float = Field(
        default=3600.0, ge=10, le=86400,
        description="the leader reconciles the usage ledger with the engines' own token "
        "counters this often, over the period before last (docs/usage.md)",
    )  # fmt: skip
    quota_lease_ttl_s: float = Field(
        default=10.0, ge=2, le=300,
        description="an agent's quota lease lasts this long past its last renewal; then its "
        "static share applies",
    )  # fmt: skip
    planner_mode: PlannerMode = Field(
        default=PlannerMode.ACT,
        description="the capacity planner, for deployments with `autoscale`: off; advise "
        "(plans and audits, changes nothing); act",
    )
    planner_period_s: float = Field(
        default=30.0, ge=1, le=3600, description="how often the leader's planner plans"
    )
    planner_cooldown_s: float = Field(
        default=300.0, ge=0, le=86_400,
        description="a deployment scales down no sooner than this after its last change",
    )  # fmt: skip
    planner_max_changes: int = Field(default=10, ge=1, le=10_000, description="a period's")
    planner_gpu_budget: int | None = Field(
        default=None, ge=0, description="GPUs the autoscaled engines may hold in all"
    )
    planner_money_budget: float | None = Field(
        default=None, ge=0, description="what they may cost an hour in all (node pools' prices)"
    )
    planner_start_s: float = Field(
        default=60.0, gt=0, le=3600,
        description="an engine's start time until its agents have measured one",
    )  # fmt: skip
    planner_engine_rps: float = Field(
        default=1.0, gt=0, le=100_000,
        description="requests a second one engine serves within the SLO, until measured",
    )  # fmt: skip
    planner_spot_short_s: float = Field(
        default=600.0, gt=0, le=86_400,
        description="a spot pool whose cloud has not started all it was asked for this long is "
        "short: held at what it has for three times as long, the rest asked of the region's "
        "other pools",
    )  # fmt: skip
    planner_day_s: float = Field(
        default=86_400.0, ge=60, le=86_400 * 7,
        description="the period of the daily shape it learns (shorter in the benchmark)",
    )  # fmt: skip
    local_cloud_url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="the local fleet's simulated clouds (`meridian up` sets it): every node "
        "pool's group is resized through it, whatever its cloud",
    )
    local_cloud_token: SecretStr | None = Field(default=None, description="its bearer token")
    object_store: str | None = Field(
        default=None,
        description="where tenants' files (the Batch API) are kept: file:///path or "
        "s3://bucket/prefix; unset: <data_dir>/objects (one replica, or replicas sharing it)",
        pattern=r"^(file:///.+|s3://[^/]+(/.*)?)$",
    )
    trace_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="OTLP/HTTP endpoint for traces; default OTEL_EXPORTER_OTLP_ENDPOINT; "
        "unset: no tracing",
    )
    trace_sample: float = Field(default=1.0, ge=0, le=1, description="share of traces kept")
    oidc_issuer: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="people sign in through this OpenID Connect provider (its issuer URL; "
        "https, or http on loopback); unset: tokens only (docs/operating.md)",
    )
    oidc_client_id: str | None = Field(
        default=None, description="the public client the CLI and the status page sign in as"
    )
    oidc_audience: str | None = Field(
        default=None, description="the `aud` a token must carry; default: oidc_client_id"
    )
    oidc_scopes: str = Field(default="openid profile email groups offline_access")
    oidc_groups_claim: str = Field(
        default="groups", description="the claim with the groups (a dotted path: realm.roles)"
    )
    oidc_name_claim: str = Field(
        default="email", description="the claim that names a person in the audit log (else sub)"
    )
    oidc_roles: dict[str, str] = Field(
        default_factory=dict,
        description="JSON: group -> viewer, operator, admin or tenant-admin:<tenant>; a person "
        "gets the highest role of their groups, and no access when none maps",
    )

    @field_validator("admin_token")
    @classmethod
    def _refuse_placeholder(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        secret = value.get_secret_value()
        if secret.lower() in _PLACEHOLDERS or len(secret) < 16:
            raise ValueError("MERIDIAN_ADMIN_TOKEN must be a real secret of 16 characters or more")
        return value

    @field_validator("oidc_roles")
    @classmethod
    def _roles(cls, value: dict[str, str]) -> dict[str, str]:
        for text in value.values():
            RoleGrant.parse(text)
        return value

    @field_validator("oidc_issuer")
    @classmethod
    def _issuer(cls, value: str | None) -> str | None:
        if not value:
            return None
        url = httpx.URL(value)
        if url.scheme != "https" and url.host not in {"127.0.0.1", "localhost", "::1"}:
            raise ValueError("MERIDIAN_OIDC_ISSUER must be https (http only on loopback)")
        return value  # as the provider spells it: tokens' `iss` must match it exactly

    @field_validator("etcd_endpoints")
    @classmethod
    def _endpoints(cls, value: str | None) -> str | None:
        if not value:
            return None
        for part in value.split(","):
            _endpoint(part)
        return value

    @field_validator("database_url")
    @classmethod
    def _postgres_only(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        problem = url_problem(value)
        if problem is not None:
            raise ValueError(f"MERIDIAN_DATABASE_URL {problem}")
        return value

    @model_validator(mode="after")
    def _tls_pairs(self) -> Self:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("set MERIDIAN_TLS_CERT_FILE and MERIDIAN_TLS_KEY_FILE together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("mutual TLS (MERIDIAN_TLS_CLIENT_CA_FILE) needs a server certificate")
        for path in (self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file):
            if path is not None and not path.is_file():
                raise ValueError(f"{path}: no such file")
        if (self.oidc_issuer is None) != (self.oidc_client_id is None):
            raise ValueError("set MERIDIAN_OIDC_ISSUER and MERIDIAN_OIDC_CLIENT_ID together")
        return self

    @property
    def etcd_hosts(self) -> list[tuple[str, int]]:
        return [_endpoint(part) for part in (self.etcd_endpoints or "").split(",") if part.strip()]

    def with_overrides(self, **values: object) -> Settings:
        """A copy with command-line values (those not None) over the environment's, validated."""
        given = {key: value for key, value in values.items() if value is not None}
        return type(self).model_validate({**self.model_dump(), **given})


def _endpoint(part: str) -> tuple[str, int]:
    """`host:port` (an `http://` in front is allowed) as (host, port); ValueError otherwise."""
    host, _, port = part.strip().removeprefix("http://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{part.strip()!r} is not host:port")
    return host, int(port)
