"""The simulator held to the real SGLang: one probe set sent to both (each started by its
backend's launcher, the real one on the CPU with the tiny model), and their answers compared
by status, JSON keys and value types, SSE frames, KV event records, metric families and
labels, and startup states. Every difference left is listed below with its reason; a new
one fails the test, and so does one listed that is gone (the list stays true)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import zmq.asyncio

from agents.engines import tiny_model
from agents.engines.backends import SglangBackend, SimBackend
from tests.sglang import probes
from tests.sglang.kit import engine_spec, launched, sglang_python

# Real engines on the CPU: run with nothing beside them (scripts/test runs the rest in
# parallel first), since what they measure takes the CPU they would share.
pytestmark = pytest.mark.alone

# Where the simulator's answers differ from SGLang 0.5.23's, and why that is left so. Keys
# are the probe and the path of the difference, as `probes.differences` writes them.
KNOWN: dict[str, str] = {}
# SGLang's metric families the simulator does not publish: GPU and model features it does not
# model (speculative decoding, sliding-window and Mamba pools, CUDA graphs, DP attention,
# routing keys, host memory, HTTP and process counters, startup memory). Nothing in Meridian
# reads them; the families an orchestrator reads (probes.ORCHESTRATOR_FAMILIES) are compared
# name by name and label by label.
SLOTS = (("max-running-requests", probes.SLOTS),)
STARTUP_S = 30 * 60  # the real engine's first start may compile and cache on a busy machine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.write(tmp_path_factory.mktemp("conformance") / "tiny-model")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def answers(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, dict[str, Any]]]:
    """Each engine's answers to the probe set, the real one's and the simulator's."""
    logs = tmp_path_factory.mktemp("conformance-logs")
    real = SglangBackend(sglang_python(), cpu=True)
    out: dict[str, dict[str, Any]] = {}
    context = zmq.asyncio.Context()
    try:
        for name, backend, spec in (
            ("real", real, engine_spec("sglang", model_dir, engine_args=SLOTS)),
            ("sim", SimBackend(), engine_spec("sim", model_dir,
                                              engine_args=(*SLOTS, ("startup-s", 2.0)))),
        ):  # fmt: skip
            async with launched(backend, spec, logs / f"{name}.log") as process:
                found: dict[str, Any] = {}
                found["startup"] = await probes.startup_states(spec.url, process, STARTUP_S)
                async with httpx.AsyncClient(base_url=spec.url, timeout=60) as http:
                    found["http"] = await probes.http_probes(http)
                    endpoint = f"tcp://127.0.0.1:{spec.kv_events_port}"
                    found["kv"] = await probes.kv_event_probe(http, endpoint, context)
                    found["salt"] = await probes.cache_salt_probe(http)
                    found["priority"] = await probes.priority_probe(http)
                    metrics = (await http.get("/metrics")).text
                found["metrics"] = probes.metric_families(metrics)
                out[name] = found
    finally:
        context.term()
    yield out


def _gaps(answers: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    real, sim = answers["real"]["http"], answers["sim"]["http"]
    return {probe: probes.differences(real[probe], sim[probe]) for probe in real}


async def test_both_start_closed_then_503_then_200(answers: dict[str, dict[str, Any]]) -> None:
    assert answers["real"]["startup"] == ["closed", "503", "200"]
    assert answers["sim"]["startup"] == answers["real"]["startup"]


async def test_every_endpoint_answers_with_the_real_servers_status_and_shape(
    answers: dict[str, dict[str, Any]],
) -> None:
    found = {f"{probe}: {line}": probe for probe, lines in _gaps(answers).items()
             for line in lines}  # fmt: skip
    new = sorted(set(found) - set(KNOWN))
    gone = sorted(set(KNOWN) - set(found))
    assert not new, "the simulator departs from SGLang here:\n" + "\n".join(new)
    assert not gone, "listed as different, but now the same (take it off KNOWN):\n" + "\n".join(
        gone
    )


async def test_kv_events_have_the_real_records(answers: dict[str, dict[str, Any]]) -> None:
    real, sim = answers["real"]["kv"], answers["sim"]["kv"]
    assert real["frame"] is not None, "the real engine published nothing"
    assert sim["frame"] == real["frame"]
    assert {"BlockStored", "AllBlocksCleared"} <= set(real["events"])
    assert set(sim["events"]) >= set(real["events"])
    for kind, record in real["events"].items():
        assert probes.differences(record, sim["events"][kind]) == [], kind


async def test_a_prefix_is_cached_per_cache_salt_as_the_real_engine_caches_it(
    answers: dict[str, dict[str, Any]],
) -> None:
    """What isolates tenants' caches (agents/gateway/requests.py: cache_salt)."""
    assert answers["real"]["salt"] == [False, True, False, False, True]
    assert answers["sim"]["salt"] == answers["real"]["salt"]


async def test_requests_are_taken_by_priority_as_the_real_engine_takes_them(
    answers: dict[str, dict[str, Any]],
) -> None:
    """What service classes ask of the engine (agents/engines/contract.py: engine_priority):
    Meridian starts engines with priority scheduling, and a class two above running work
    retracts it when every slot is taken."""
    assert answers["real"]["priority"] == {
        "last short": "low", "high before every long one": True,
        "default before every long one": True,
    }  # fmt: skip
    assert answers["sim"]["priority"] == answers["real"]["priority"]


async def test_metric_families_an_orchestrator_reads_have_the_real_names_and_labels(
    answers: dict[str, dict[str, Any]],
) -> None:
    real, sim = answers["real"]["metrics"], answers["sim"]["metrics"]
    for family in probes.ORCHESTRATOR_FAMILIES:
        assert family in real, f"SGLang no longer publishes {family}"
        assert sim.get(family) == real[family], family
    assert set(sim) <= set(real), set(sim) - set(real)  # the simulator invents none
