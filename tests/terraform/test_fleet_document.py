"""From Terraform's outputs to the fleet: terraform/modules/fleet-document renders the clouds and
regions that the pools made, and the control plane takes the document as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kits.controlplane import Api
from tests.terraform.kit import CLOUDS, REGIONS, render


async def test_the_rendered_document_is_applied_as_it_is(tmp_path: Path, api: Api) -> None:
    out = await render(tmp_path, "fleet-document", {"clouds": CLOUDS, "regions": REGIONS})
    applied = await api.client.post(
        "/v1/apply", content=out["document"], headers={"Content-Type": "application/yaml"}
    )
    assert applied.status_code == 200, applied.text
    regions = {r["name"]: r for r in (await api.client.get("/v1/regions")).json()["items"]}
    assert {
        name: (r["cloud"], r["jurisdiction"], r["gateway_url"]) for name, r in regions.items()
    } == {r["name"]: (r["cloud"], r["jurisdiction"], r["gateway_url"]) for r in REGIONS}
    again = await api.client.post(
        "/v1/apply", content=out["document"], headers={"Content-Type": "application/yaml"}
    )
    assert "X-Meridian-Revision" not in again.headers  # applying it twice changes nothing


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cloud": "oci"}, "must be one of var.clouds"),
        ({"jurisdiction": "European Union"}, "lowercase letters"),
        ({"gateway_url": "gpu-east:8500"}, "http:// or https://"),
    ],
)
async def test_a_region_the_fleet_would_refuse_is_refused_by_terraform(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    bad = [{**REGIONS[0], **change}, *REGIONS[1:]]
    with pytest.raises(AssertionError, match=message):
        await render(tmp_path, "fleet-document", {"clouds": CLOUDS, "regions": bad})
