"""Settings of a control-plane process, read once in the entry point and passed down."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

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

    @field_validator("admin_token")
    @classmethod
    def _refuse_placeholder(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        secret = value.get_secret_value()
        if secret.lower() in _PLACEHOLDERS or len(secret) < 16:
            raise ValueError("MERIDIAN_ADMIN_TOKEN must be a real secret of 16 characters or more")
        return value

    @field_validator("database_url")
    @classmethod
    def _postgres_only(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("postgresql://", "postgresql+asyncpg://", "postgres://")):
            raise ValueError("MERIDIAN_DATABASE_URL must be a postgresql:// URL")
        return value

    def with_overrides(self, **values: object) -> Settings:
        """A copy with command-line values (those not None) over the environment's, validated."""
        given = {key: value for key, value in values.items() if value is not None}
        return type(self).model_validate({**self.model_dump(), **given})
