"""Shared field types and base models of the admin API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
SLUG_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$"

Name = Annotated[
    str,
    StringConstraints(pattern=NAME_PATTERN),
    Field(description="1-63 letters, digits, '.', '_' or '-'; starts and ends alphanumeric"),
]
Slug = Annotated[
    str,
    StringConstraints(pattern=SLUG_PATTERN),
    Field(description="1-32 lowercase letters, digits or '-'"),
]
Scalar = str | int | float | bool
ArgKey = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,63}$")]


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise ValueError("must be an http:// or https:// URL")
    if any(ch.isspace() for ch in value):
        raise ValueError("must not contain white space")
    return value.rstrip("/")


HttpUrl = Annotated[str, StringConstraints(max_length=2048), AfterValidator(_http_url)]


def _unique(values: list[Any]) -> list[Any]:
    if len(set(values)) != len(values):
        raise ValueError("must not repeat an entry")
    return values


class Spec(BaseModel):
    """What a caller writes. Unknown fields are refused, so a typo is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid")


class Meta(BaseModel):
    """What every stored object carries besides its spec."""

    name: Name
    version: int
    created_at: datetime
    updated_at: datetime


class Page(BaseModel):
    items: list[dict[str, Any]]
    next: str | None = Field(description="cursor for the next page, or null at the end")


Unique = AfterValidator(_unique)
