"""Service classes on a fleet of real processes: the classes a fallback rule names escalate
and the others stay home, and each region reports its classes' outcomes in Prometheus and
on the status page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.kits.fleet import LLAMA, OPERATOR, fleet_of
from tests.kits.push import ADMIN, eventually

HELLO = {"model": LLAMA, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


def _ceiling(doc: dict[str, Any]) -> None:
    """acme may ask for any class; us-east escalates interactive and flex only."""
    acme = next(t for t in doc["tenants"] if t["name"] == "acme")
    acme["class_ceiling"] = "interactive"
    rule = next(r for r in doc["fallback_rules"] if r["region"] == "us-east")
    rule["classes"] = ["interactive", "flex"]


async def test_only_the_classes_a_rule_names_escalate(database_url: str, tmp_path: Path) -> None:
    """us-east's engine fails every request. Its rule escalates interactive and flex (not the
    default, interactive and standard): those are answered by us-west. standard and batch
    requests stay in us-east, where they fail; none reaches us-west. The classes' counts show
    it in Prometheus and on the status page."""
    async with fleet_of(database_url, tmp_path, ("us-east", "us-west"), _ceiling) as fleet:
        await fleet.fail_engines("us-east")
        east_url = fleet.agents["us-east"].url
        auth = {"Authorization": f"Bearer {fleet.keys['acme']}"}
        served: dict[str, list[tuple[int, str, str]]] = {}
        async with httpx.AsyncClient(base_url=east_url, headers=auth, timeout=30) as client:
            for service_class in ("interactive", "standard", "flex", "batch"):
                for _ in range(2):
                    answer = await client.post(
                        "/v1/chat/completions",
                        json=HELLO,
                        headers={"x-meridian-class": service_class},
                    )
                    served.setdefault(service_class, []).append((
                        answer.status_code, answer.headers.get("x-meridian-region", ""),
                        answer.headers.get("x-meridian-class", ""),
                    ))  # fmt: skip
            metrics = await client.get("/metrics", headers={"Authorization": f"Bearer {OPERATOR}"})
        received = await fleet.escalations("us-west")

        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN, timeout=10) as cp:

            async def reported() -> list[dict[str, Any]] | None:
                rows: list[dict[str, Any]] = (await cp.get("/v1/status")).json()["classes"]
                east = {r["class"]: r for r in rows if r["region"] == "us-east"}
                west = {r["class"]: r for r in rows if r["region"] == "us-west"}
                if (
                    east.get("flex", {}).get("escalated") == 2
                    and east.get("batch", {}).get("refused") == 2
                    and west.get("flex", {}).get("admitted") == 2
                ):
                    return rows
                return None

            rows = await eventually(reported, within_s=20)
    for service_class in ("interactive", "flex"):
        assert served[service_class] == [(200, "us-west", service_class)] * 2
    for service_class in ("standard", "batch"):  # the worker failed it, or its breaker: 503
        assert served[service_class] == [(503, "us-east", service_class)] * 2
    assert received.get(("in", "us-east")) == 4  # the four of the two classes that may go
    samples = {
        (s.labels["class"], s.labels["outcome"]): s.value
        for f in text_string_to_metric_families(metrics.text)
        if f.name == "meridian_class_requests"
        for s in f.samples
    }
    assert samples[("interactive", "escalated")] == 2
    assert samples[("flex", "escalated")] == 2
    assert samples[("batch", "refused")] == 2
    assert ("batch", "escalated") not in samples
    assert ("standard", "escalated") not in samples
    east = {r["class"]: r for r in rows if r["region"] == "us-east"}
    # each was sent to the failing engine, or refused once the worker's breaker had opened
    standard = east["standard"]
    assert (standard["escalated"], standard["admitted"] + standard["refused"]) == (0, 2)
    west = {r["class"]: r for r in rows if r["region"] == "us-west"}
    assert west["flex"]["admitted"] == 2
    assert "batch" not in west
    assert "standard" not in west
    assert west["flex"]["wait_p99_s"] is not None
