"""Settings refuse what would make an operator's deployment unsafe or confusing."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from controlplane.db.engine import async_url
from controlplane.settings import Settings


@pytest.mark.parametrize("token", ["changeme", "short", "password"])
def test_placeholder_admin_tokens_are_refused(token: str) -> None:
    with pytest.raises(ValidationError, match="real secret"):
        Settings(admin_token=token)


def test_only_postgres_urls() -> None:
    with pytest.raises(ValidationError, match="postgresql"):
        Settings(database_url="sqlite:///x.db")
    with pytest.raises(ValidationError, match="names no host"):
        Settings(database_url="postgresql:///meridian")
    assert Settings(database_url="").database_url is None


@pytest.mark.parametrize(
    "spelling", ["postgresql", "postgres", "postgresql+psycopg", "postgresql+asyncpg",
                 "postgresql+psycopg2", "POSTGRESQL"],
)  # fmt: skip
def test_every_usual_spelling_of_a_postgres_url_means_psycopg(spelling: str) -> None:
    url = f"{spelling}://meridian:s%40cret@db.internal:5433/fleet?sslmode=require"
    assert Settings(database_url=url).database_url == url
    assert async_url(url) == (
        "postgresql+psycopg://meridian:s%40cret@db.internal:5433/fleet?sslmode=require"
    )


def test_etcd_endpoints_are_host_port_pairs() -> None:
    with pytest.raises(ValidationError, match="not host:port"):
        Settings(etcd_endpoints="etcd-1:2379,etcd-2")
    settings = Settings(etcd_endpoints="etcd-1:2379, http://10.0.0.2:2380")
    assert settings.etcd_hosts == [("etcd-1", 2379), ("10.0.0.2", 2380)]
    assert Settings().etcd_hosts == []


def test_tls_needs_a_certificate_and_its_key(tmp_path: Path) -> None:
    cert = tmp_path / "server.crt"
    cert.write_text("not checked here")
    with pytest.raises(ValidationError, match="together"):
        Settings(tls_cert_file=cert)
    with pytest.raises(ValidationError, match="no such file"):
        Settings(tls_cert_file=cert, tls_key_file=tmp_path / "missing.key")
    with pytest.raises(ValidationError, match="needs a server certificate"):
        Settings(tls_client_ca_file=cert)
