"""Settings of an agent process, from flags or `MERIDIAN_AGENT_*` variables, built once in main."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MERIDIAN_AGENT_", extra="ignore", frozen=True)

    control_plane: str = Field(min_length=3, description="HOST:PORT of a control plane's gRPC port")
    control_plane_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^/\s]+(/\S*)?$",
        description="the control plane's HTTP API, where the Files and Batches API this port "
        "serves is passed on to; unset: those paths answer 501",
    )
    region: str = Field(min_length=1, max_length=63)
    bootstrap_token: SecretStr | None = Field(
        default=None, description="exchanged for a credential on first start; kept out of disk"
    )
    bootstrap_token_command: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="a shell command that prints the bootstrap token (read from a secret "
        "store); run each time the agent has to register, so a rotated token is picked up",
    )
    node: str = Field(default="", description="the node to claim; default: the one recorded")
    hostname: str = Field(default_factory=socket.gethostname)
    data_dir: Path = Path(".meridian-agent")
    host: str = "127.0.0.1"
    port: int = Field(default=8500, ge=1, le=65535)
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_server_name: str | None = None
    heartbeat_s: float = Field(default=5.0, gt=0, le=300)
    reconnect_min_s: float = Field(default=0.5, gt=0, le=60)
    reconnect_max_s: float = Field(default=15.0, gt=0, le=3600)
    probe_interval_s: float = Field(default=2.0, gt=0, le=300)
    probe_timeout_s: float = Field(default=3.0, gt=0, le=300)
    sglang_python: str | None = Field(
        default=None,
        description="the Python of SGLang's own environment, which runs `sglang` engines; "
        "default: Meridian's managed one of the supported version where installed "
        "(`meridian engines sglang-env`), else python3",
    )
    engine_nice: int = Field(
        default=0, ge=0, le=19, description="the niceness engines this agent starts run at"
    )
    health_generate_s: float = Field(
        default=60.0,
        gt=0,
        le=86400,
        description="between an engine's /health checks, which run a generation on SGLang "
        "0.5.23 (a second or more each); readiness is /ready at every probe, and the load "
        "poller's /v1/loads answering",
    )
    engine_start_timeout_s: float = Field(default=900.0, gt=0, description="SGLang loads weights")
    restart_backoff_s: float = Field(default=1.0, gt=0, le=600)
    restart_backoff_max_s: float = Field(default=60.0, gt=0, le=3600)
    crash_loop_restarts: int = Field(default=5, ge=1, le=1000, description="failures in a row")
    drain_timeout_s: float = Field(default=30.0, ge=0, le=3600)
    preemption_notices: str = Field(
        default="off",
        pattern=r"^(off|aws|gcp|azure|https?://\S+)$",
        description="where this spot machine's cloud gives notice that it takes the machine "
        'back: aws, gcp, azure (their metadata services), a URL answering {"time": ...} '
        "while a notice stands, or off; on notice every engine here drains at once",
    )
    preemption_poll_s: float = Field(default=5.0, gt=0, le=60)
    simulated_gpus: str | None = Field(
        default=None,
        pattern=r"^[1-9][0-9]?x[A-Za-z0-9._-]{1,64}:[1-9][0-9]{0,3}$",
        description="COUNTxMODEL:MEMORY_GB, e.g. 2xH100-SXM-80GB:80: GPUs this machine "
        "reports at registration where NVML finds none, for simulated engines (the local "
        "fleet's machines grown by the planner)",
    )
    stop_grace_s: float = Field(default=10.0, ge=0, le=600)
    operator_token: SecretStr | None = Field(
        default=None,
        description="guards /agent/* and /metrics and lets its holder ask for "
        "x-meridian-route; required when the port listens beyond loopback; unset on loopback: "
        "the agent makes one in its data directory (operator-token)",
    )
    load_poll_s: float = Field(
        default=0.2,
        gt=0,
        le=60,
        description="every worker's /v1/loads, and this node's engines': the one observer of "
        "their load (drains, engine status and health checks read it)",
    )
    upstream_connect_timeout_s: float = Field(default=2.0, gt=0, le=60)
    quality_guard: bool = Field(
        default=True,
        description="the quality guard: every answer read by its detectors, canaries on idle "
        "workers, and workers that answer wrong taken out of rotation (agents/quality)",
    )
    usage_ledger: bool = Field(
        default=True,
        description="a usage record of every tenant's request, journaled in data_dir/ledger "
        "and shipped to the control plane (docs/usage.md)",
    )
    usage_meter_s: float = Field(
        default=60.0, ge=1, le=3600,
        description="each engine's own token counters go in the ledger this often (a `meter` "
        "record), for the control plane to reconcile the ledger with",
    )  # fmt: skip
    canary_every_s: float = Field(
        default=5.0, gt=0, le=3600, description="between canaries of each model's workers"
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        le=1024**3,
        description="a larger request body is answered 413 before it is read",
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="a body slower than this is answered 408"
    )
    client_stall_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="a stream whose client reads nothing this long (its socket's buffer full) "
        "is cut, its engine request aborted and its slot freed",
    )
    header_timeout_s: float = Field(
        default=15.0,
        gt=0,
        le=3600,
        description="a connection that has sent no whole request head this long after it "
        "opened or after its last answer is closed (slow senders, idle keep-alive)",
    )
    trace_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="OTLP/HTTP endpoint for traces; default OTEL_EXPORTER_OTLP_ENDPOINT; "
        "unset: no tracing",
    )
    trace_sample: float = Field(default=1.0, ge=0, le=1, description="share of traces kept")

    @model_validator(mode="after")
    def _guarded_when_public(self) -> AgentSettings:
        if self.operator_token is None and not _loopback(self.host):
            raise ValueError(
                f"the agent listens on {self.host}, beyond loopback: set "
                "MERIDIAN_AGENT_OPERATOR_TOKEN (16 characters or more) to guard /agent/*"
            )
        if self.operator_token is not None and len(self.operator_token.get_secret_value()) < 16:
            raise ValueError("the operator token needs 16 characters or more")
        return self


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
