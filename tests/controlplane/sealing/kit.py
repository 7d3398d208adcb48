"""The example fleet applied through the in-process API, and a sealer on the key file its
control plane uses (tests/kits/controlplane.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from controlplane.services.sealing.kms import Keks
from controlplane.services.sealing.sealer import Sealer
from tests.kits.controlplane import Api, kek_file
from tests.kits.fleet_docs import example


async def example_fleet(api: Api, database_url: str) -> tuple[int, Sealer]:
    """(the revision the example fleet was applied at, a sealer that opens its keys)."""
    headers = {"Content-Type": "application/yaml"}
    applied = await api.client.post("/v1/apply", content=yaml.safe_dump(example()), headers=headers)
    assert applied.status_code == 200, applied.text
    return applied.json()["revision"], Sealer(Keks("local", Path(kek_file(database_url))))
