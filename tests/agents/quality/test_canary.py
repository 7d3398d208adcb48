"""Canaries on real simulated workers: teacher-forced scores agree among healthy peers to
within their noise, and a worker with wrong weights (its answers unchanged) falls below its
peers' bound, with no user traffic at all."""

from __future__ import annotations

from contextlib import AsyncExitStack

import httpx
import pytest
from meridian_pb.fleet.v1.judging import judge

from agents.quality.canary import Canary, CanaryUnreadable, score
from tests.kits.sim import running_sim

CANARY = Canary("river", "The old man walked to the river and", " saw the boats go by.")


async def _scores(urls: dict[str, str]) -> dict[str, float]:
    out = {}
    async with httpx.AsyncClient(timeout=10) as http:
        for name, url in urls.items():
            answer = await http.post(f"{url}/generate", content=CANARY.body(f"canary-{name}"),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
            assert answer.status_code == 200, answer.text
            out[name] = score(answer.content)
    return out


async def test_wrong_weights_fail_the_canary_and_healthy_peers_pass() -> None:
    async with AsyncExitStack() as stack:
        sims = {n: await stack.enter_async_context(running_sim(model="llama")) for n in "abc"}
        urls = {n: s.url for n, s in sims.items()}
        healthy = judge(await _scores(urls))
        assert all(v.passed for v in healthy.values()), healthy
        async with httpx.AsyncClient() as http:
            made = await http.post(f"{urls['c']}/sim/faults", json={"logprob_shift": 0.3})
            assert made.status_code == 200
        verdicts = judge(await _scores(urls))
        assert not verdicts["c"].passed
        assert verdicts["c"].score < verdicts["c"].bound
        assert verdicts["a"].passed
        assert verdicts["b"].passed
        # two workers and the score the canary was made with: still judged
        pair = judge({k: v for k, v in (await _scores(urls)).items() if k != "a"},
                     expected=healthy["a"].score)  # fmt: skip
        assert not pair["c"].passed
        assert pair["b"].passed


def test_an_answer_without_logprobs_is_unreadable_and_one_peer_is_not_enough() -> None:
    with pytest.raises(CanaryUnreadable):
        score(b'{"text": "hi", "meta_info": {}}')
    with pytest.raises(CanaryUnreadable):
        score(b"not json")
    assert judge({"a": -0.2, "b": -3.0}) == {}


def test_held_workers_are_no_reference_and_a_lone_worker_is_judged_against_its_making() -> None:
    # c is held: b, judged against a and the score made with, fails; c's own low score
    # would otherwise drag the median down and let b pass
    scores = {"a": -1.20, "b": -1.90, "c": -3.0}
    assert judge(scores, expected=-1.21, held={"c"})["b"].passed is False
    # the last in rotation: only the score it was made with, and a wider bound
    assert judge({"a": -1.30, "c": -3.0}, expected=-1.21, held={"c"})["a"].passed is True
    lone = judge({"a": -1.60, "c": -3.0}, expected=-1.21, held={"c"})["a"]
    assert lone.passed is False
    assert lone.bound == -1.41
