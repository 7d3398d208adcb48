"""The status page's shell and the document it polls, without agents (tests/fleet has the page
in a browser on a live fleet)."""

from __future__ import annotations

from typing import Any

from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.books import Books
from agents.telemetry import add_tiers
from controlplane.db.fleet_rows import NodeRow
from controlplane.push.wire import telemetry_doc
from controlplane.services.liveness import UP, summarize
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE
from tests.kits.push import eventually


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


def _beat(answers: dict[str, dict[str, float]], ready: dict[str, int]) -> dict[str, Any]:
    """A node's heartbeat as the control plane keeps it: its answers and ready engines."""
    return {
        "answers": [{"model": m, "per_second": sum(c.values()), "per_second_by_code": c}
                    for m, c in answers.items()],
        "engines": [{"model": m, "state": "ready"} for m, n in ready.items() for _ in range(n)],
    }  # fmt: skip


def test_a_model_refusing_most_requests_with_engines_ready_is_alerted() -> None:
    nodes = [NodeRow(id=i, name=f"n{i}", health=UP) for i in (1, 2)]
    latest = {
        1: _beat({"llama": {"ok": 1.0, "quota_exceeded": 3.0}, "qwen": {"ok": 5.0}}, {"llama": 1}),
        2: _beat({"llama": {"overloaded": 2.0}, "idle": {"no_healthy_worker": 0.1}}, {"qwen": 1}),
    }
    models = {m["model"]: m for m in summarize("r", nodes, latest)["models"]}
    assert models["llama"]["answers_per_second"] == 6.0
    assert models["llama"]["by_code"] == {"quota_exceeded": 3.0, "overloaded": 2.0, "ok": 1.0}
    assert models["llama"]["failed_share"] == 5 / 6
    assert models["llama"]["alert"]  # most refused, an engine ready
    assert models["qwen"]["alert"] is None  # served
    assert models["idle"]["alert"] is None  # no engine ready: down, not refusing; and too
    # little traffic to judge besides


def test_the_tiered_routes_counts_of_a_regions_agents_are_summed() -> None:
    """From the agents' counters, through the heartbeat's message, to the status document."""
    beats = {}
    for node in (1, 2):
        books = Books()
        books.tier_answered["chat-auto", "small", "difficulty"] += 3 * node
        books.tier_answered["chat-auto", "large", "not opted in"] += 1
        books.tier_moves["chat-auto", "large", "small", "capacity"] += node
        books.cascades["chat-auto", "length"] += 1
        telemetry = pb.Telemetry()
        add_tiers(telemetry, books)
        beats[node] = telemetry_doc(telemetry)
    nodes = [NodeRow(id=i, name=f"n{i}", health=UP) for i in (1, 2)]
    (route,) = summarize("r", nodes, beats)["tiers"]
    assert route["route"] == "chat-auto"
    assert route["requests"] == 11
    assert route["answered"] == [
        {"model": "large", "why": "not opted in", "count": 2},
        {"model": "small", "why": "difficulty", "count": 9},
    ]
    assert route["moved"] == [{"from": "large", "to": "small", "why": "capacity", "count": 3}]
    assert route["cascades"] == {"length": 2}
