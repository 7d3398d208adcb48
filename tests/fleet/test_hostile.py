"""The gateway under hostile input, on a fleet of real processes: no request can hurt anyone
but its sender. Each test leaves nothing held in either region, and normal requests served.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import openai
import pytest

from tests import fuzz_kit, report
from tests.fleet import hostile_cases
from tests.fleet.hostile import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    chat_body,
    fleet,
    nothing_held,
    raw,
    request_bytes,
)
from tests.kits.fleet import LLAMA, OPERATOR, Fleet

__all__ = ["fleet"]  # the module's fixture
CHAT = "/v1/chat/completions"
FUZZ_CONFIG = Path(__file__).with_name("fuzz") / "schemathesis.toml"
# a fixed seed, so that CI is repeatable; MERIDIAN_FUZZ_SEED explores further
FUZZ_SEED = os.environ.get("MERIDIAN_FUZZ_SEED", "20261124")
FUZZ_EXAMPLES = os.environ.get("MERIDIAN_FUZZ_EXAMPLES", "120")
HOSTILE_SECONDS = float(os.environ.get("MERIDIAN_HOSTILE_SECONDS", "16"))


def _auth(fleet: Fleet, tenant: str = "acme") -> bytes:
    return f"Authorization: Bearer {fleet.keys[tenant]}".encode()


async def test_a_request_id_that_is_not_utf8_is_refused_and_holds_nothing(fleet: Fleet) -> None:
    """The critical finding: one such request per engine took the region away from every
    tenant. Now each is a 400 before anything is taken, here and on the escalation path."""
    url = fleet.agents["us-east"].url
    answers = []
    for _ in range(6):  # more than the region's engines
        sent = request_bytes(CHAT, chat_body(), _auth(fleet), b"X-Request-ID: \xff\xfe\x80")
        answers.append(await raw(url, sent))
    await nothing_held(fleet)
    await fleet.fail_engines("us-east", error_rate=1.0)  # now us-east escalates every request
    try:
        escalated = await raw(url, request_bytes(CHAT, chat_body(), _auth(fleet),
                                                 b"X-Request-ID: \xc3\x28"))  # fmt: skip
        client = fleet.client("us-east")
        served = await client.chat.completions.with_raw_response.create(
            model=LLAMA, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        await client.close()
    finally:
        await fleet.fail_engines("us-east", error_rate=0.0)
    await nothing_held(fleet)
    for answer in [*answers, escalated]:
        assert answer.status == 400
        assert answer.json()["error"]["param"] == "x-request-id"
        assert answer.headers["x-request-id"].isascii()
    assert served.headers["x-meridian-region"] == "us-west"


async def test_every_answer_is_openai_shaped_and_names_no_software(fleet: Fleet) -> None:
    url = fleet.agents["us-east"].url
    answers = {
        "unknown path": await raw(url, request_bytes("/v1/secret-<script>", b"{}", _auth(fleet))),
        "wrong method": await raw(url, request_bytes(CHAT, b"", method=b"GET")),
        "bad header line": await raw(
            url, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n"
        ),
        "bad method": await raw(url, b"G\x01T /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"),
        "bad json": await raw(url, request_bytes(CHAT, b'{"model": ', _auth(fleet))),
        "no key": await raw(url, request_bytes(CHAT, chat_body())),
    }
    statuses = {name: answer.status for name, answer in answers.items()}
    assert statuses == {"unknown path": 404, "wrong method": 405, "bad header line": 400,
                        "bad method": 400, "bad json": 400, "no key": 401}  # fmt: skip
    assert answers["wrong method"].headers["allow"] == "POST"
    assert b"script" not in answers["unknown path"].body  # the input is not echoed
    for answer in answers.values():
        error = answer.json()["error"]
        assert all(error[field] for field in ("code", "message", "type"))
        assert "aiohttp" not in answer.headers.get("server", "")


async def test_models_can_be_retrieved_one_by_one(fleet: Fleet) -> None:
    client = fleet.client("us-east")
    model = await client.models.retrieve(LLAMA)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.models.retrieve("no-such-model")
    await client.close()
    assert model.id == LLAMA
    assert missing.value.status_code == 404
    assert missing.value.code == "model_not_found"


async def test_the_load_header_goes_to_insiders_and_peers_not_to_tenants(fleet: Fleet) -> None:
    url = fleet.agents["us-east"].url
    tenant = await raw(url, request_bytes(CHAT, chat_body(), _auth(fleet)))
    operator = await raw(url, request_bytes(CHAT, chat_body(), f"Authorization: Bearer "
                                            f"{OPERATOR}".encode()))  # fmt: skip
    assert tenant.status == operator.status == 200
    assert "endpoint-load-metrics" not in tenant.headers
    assert "endpoint-load-metrics" in operator.headers
    assert "server" not in tenant.headers or "aiohttp" not in tenant.headers["server"]


async def test_slow_senders_and_idle_connections_are_closed(fleet: Fleet) -> None:
    url = fleet.agents["us-east"].url
    head = request_bytes(CHAT, chat_body(), _auth(fleet))
    trickled, idle, slow_body = await asyncio.gather(
        # the head a byte at a time, 0.3 s apart: never whole within the header timeout
        raw(url, *[head[i : i + 1] for i in range(60)], pause_s=0.3),
        raw(url),  # a connection that says nothing
        # the head whole, then a body that stops short of its Content-Length
        raw(url, head[: head.index(b"\r\n\r\n") + 4 + 5]),
    )
    # an event loop's timer may fire up to its clock's resolution early: 50 ms is room enough
    early = 0.05
    assert trickled.status is None  # closed without an answer
    assert HEADER_TIMEOUT_S - early <= trickled.seconds < HEADER_TIMEOUT_S + 5
    assert idle.status is None
    assert HEADER_TIMEOUT_S - early <= idle.seconds < HEADER_TIMEOUT_S + 5
    assert slow_body.status == 408
    assert slow_body.json()["error"]["code"] == "request_timeout"
    assert BODY_TIMEOUT_S - early <= slow_body.seconds < BODY_TIMEOUT_S + 5
    await nothing_held(fleet)


async def test_a_body_over_the_limit_is_refused_before_it_is_read(fleet: Fleet) -> None:
    url = fleet.agents["us-east"].url
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: 17000000\r\n" + _auth(fleet) + b"\r\n\r\n")  # fmt: skip
    answer = await raw(url, head, b"{")  # a 17 MB body announced, one byte sent
    assert answer.status == 413
    assert answer.json()["error"]["code"] == "body_too_large"
    assert answer.seconds < BODY_TIMEOUT_S  # not waiting for what was announced


async def test_the_gateway_survives_fuzzing_from_its_openapi_document(
    fleet: Fleet, tmp_path: Path
) -> None:
    """schemathesis, every check on, from the document the agent serves: no server error, no
    undocumented status or content type, bad input refused; then nothing held."""
    url = fleet.agents["us-east"].url
    await fleet.speed_engines("us-east", 0.001)  # an answer of any length comes in seconds
    try:
        status, output, result = await fuzz_kit.schemathesis(
            f"{url}/openapi.json", FUZZ_CONFIG, tmp_path,
            headers=[f"Authorization: Bearer {fleet.keys['acme']}"], examples=FUZZ_EXAMPLES,
            seed=FUZZ_SEED, extra=("--request-timeout", "20"), timeout_s=300,
        )  # fmt: skip
    finally:
        await fleet.speed_engines("us-east", 1.0)
    assert status == 0, output[-20000:]
    fuzz_kit.reported(
        "fuzzing the gateway from its OpenAPI document (schemathesis, every check)",
        result,
        "; nothing held afterwards",
    )
    cases = result["test_cases"]
    await nothing_held(fleet)
    assert result["operations"]["tested"] == result["operations"]["total"] >= 5
    assert cases["with_failures"] == 0
    assert result["errors"] == []


async def test_hostile_requests_from_a_seed_hurt_no_one(fleet: Fleet) -> None:
    """Hostile headers, bodies and transports (tests/fleet/hostile_cases.py) for a time
    budget: half to a region that serves, half to one whose engines fail so that it
    escalates all it takes. No answer is a 5xx or plain text; then nothing is held."""
    url = fleet.agents["us-east"].url
    cases = hostile_cases.Cases(int(FUZZ_SEED), _auth(fleet))
    await fleet.speed_engines("us-east", 0.01)
    try:
        served = await hostile_cases.run(url, cases, HOSTILE_SECONDS / 2)
        await nothing_held(fleet)
        await fleet.fail_engines("us-east", error_rate=1.0)
        escalated = await hostile_cases.run(url, cases, HOSTILE_SECONDS / 2)
    finally:
        await fleet.fail_engines("us-east", error_rate=0.0)
        await fleet.speed_engines("us-east", 1.0)
    await nothing_held(fleet, within_s=30)
    counts = await fleet.escalations("us-east")
    for name, outcome in (("served", served), ("escalating", escalated)):
        report.add(
            "hostile requests from a seed (tests/fleet/hostile_cases.py)",
            f"{name}: {sum(outcome.cases.values())} cases of {len(outcome.cases)} kinds in "
            f"{HOSTILE_SECONDS / 2:.0f} s (seed {FUZZ_SEED}), answers "
            f"{dict(sorted(outcome.statuses.items(), key=str))}; {len(outcome.wrong)} wrong; "
            "nothing held afterwards",
        )
    assert served.wrong == [], "\n".join(served.wrong)
    assert escalated.wrong == [], "\n".join(escalated.wrong)
    assert len(served.cases) + len(escalated.cases) >= 15
    assert counts.get(("out", "us-west"), 0) > 0  # the second half went through escalation
