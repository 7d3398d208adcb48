"""The status page's shell and the document it polls, without agents (tests/fleet has the page
in a browser on a live fleet)."""

from __future__ import annotations

from tests.controlplane.conftest import Api
from tests.controlplane.fleet import BASE
from tests.controlplane.push.kit import eventually


async def test_the_page_is_a_shell_that_loads_nothing_from_elsewhere(api: Api) -> None:
    api.client.headers.pop("Authorization", None)  # the page itself needs no token
    for path in ("/", "/status"):
        page = await api.client.get(path)
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy
        assert "script-src 'self'" in policy
        assert "connect-src 'self'" in policy
        assert 'src="/status/app.js"' in page.text
        assert "http://" not in page.text
        assert "https://" not in page.text
    script = await api.client.get("/status/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "innerHTML" not in script.text  # what the fleet reports is never parsed as HTML
    assert "sessionStorage" in script.text  # the token stays in the tab, not in a URL
    assert (await api.client.get("/status/app.css")).status_code == 200
    missing = await api.client.get("/status/../api/app.py")
    assert missing.status_code == 404
    unknown = await api.client.get("/status/secrets.txt")
    assert unknown.status_code == 404
    assert unknown.json()["code"] == "not_found"
    assert (await api.client.get("/v1/status")).status_code == 401


async def test_the_status_document_shows_every_region_before_any_agent(api: Api) -> None:
    assert (await api.client.post("/v1/apply", json=BASE)).status_code == 200
    answer = await api.client.get("/v1/status")
    assert answer.status_code == 200
    assert answer.headers["cache-control"] == "no-store"
    doc = answer.json()
    assert doc["revision"] == await api.revision()
    by_name = {r["name"]: r for r in doc["regions"]}
    assert sorted(by_name) == ["eu-west", "us-east"]
    eu = by_name["eu-west"]
    assert (eu["cloud"], eu["provider"], eu["jurisdiction"]) == ("gcp", "gcp", "eu")
    assert (eu["health"], eu["agents"], eu["revision"], eu["nodes"]) == ("unknown", 0, None, [])
    assert doc["flows"] == []
    assert doc["receipts"] == []

    region = {"name": "ap-south", "cloud": "aws", "geography": "ap-south", "jurisdiction": "in"}
    await api.create("regions", region)

    async def shown() -> bool:  # read again within a second or so, whoever asks
        doc = (await api.client.get("/v1/status")).json()
        return "ap-south" in {r["name"] for r in doc["regions"]}

    await eventually(shown, within_s=3)
