"""Settings refuse what would make an operator's deployment unsafe or confusing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controlplane.settings import Settings


@pytest.mark.parametrize("token", ["changeme", "short", "password"])
def test_placeholder_admin_tokens_are_refused(token: str) -> None:
    with pytest.raises(ValidationError, match="real secret"):
        Settings(admin_token=token)


def test_only_postgres_urls() -> None:
    with pytest.raises(ValidationError, match="postgresql"):
        Settings(database_url="sqlite:///x.db")
    assert Settings(database_url="").database_url is None
