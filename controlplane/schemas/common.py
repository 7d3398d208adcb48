"""Shared field types and base models of the admin API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StringConstraints,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

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
# A launch flag's or a policy parameter's value: bounded, as every input is.
Scalar = (
    Annotated[str, StringConstraints(max_length=1024)]
    | Annotated[int, Field(ge=-(2**53), le=2**53)]
    | Annotated[float, Field(ge=-1e15, le=1e15)]
    | bool
)
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


NUMBERS = (int, float, int | None, float | None)


class Spec(BaseModel):
    """What a caller writes. Unknown fields are refused, so a typo is an error, not a no-op;
    and nothing PostgreSQL cannot store (a NUL character, half a surrogate pair, NaN) gets as
    far as the database."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        where = unstorable(data)
        if where is not None:
            raise ValueError(f"{where or 'a string'}: contains a character that cannot be stored")
        if isinstance(data, dict):  # pydantic takes true for 1 where a number is asked for
            for name, field in cls.model_fields.items():
                if isinstance(data.get(field.alias or name), bool) and field.annotation in NUMBERS:
                    raise ValueError(f"{name}: a number is required, not true or false")
        return data


def unstorable(value: Any, path: str = "") -> str | None:
    """The path of the first string in `value` that PostgreSQL cannot store, if any."""
    if isinstance(value, str):
        if "\x00" in value:
            return path
        try:
            value.encode()
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        here = f"{path}.{key}" if path else str(key)
        if isinstance(key, str) and unstorable(key) is not None:
            return here
        found = unstorable(item, here)
        if found is not None:
            return found
    return None


class Meta(BaseModel):
    """What every stored object carries besides its spec."""

    name: Name
    version: int
    created_at: datetime
    updated_at: datetime


class Page(BaseModel):
    items: list[dict[str, Any]]
    next: str | None = Field(description="cursor for the next page, or null at the end")


class _Unique:
    """A list whose entries must not repeat, and whose JSON schema says so (`uniqueItems`)."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_unique, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["uniqueItems"] = True
        return json_schema


Unique = _Unique()
