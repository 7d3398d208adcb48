"""The simulator's log-probabilities, as SGLang's /generate returns them, and the quality
faults that leave a worker healthy by every check while it answers wrong: garbage, one token
repeated, and wrong weights (every log-probability shifted). A real child process."""

from __future__ import annotations

from typing import Any

import pytest

from agents.engines.sim import tokens
from tests.kits.sim import Sim, running_sim

PROMPT = "the old man walked to the river and saw"


async def _generate(sim: Sim, **body: Any) -> dict[str, Any]:
    async with sim.client() as client:
        answer = await client.post("/generate", json=body)
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()
        return result


async def _score(sim: Sim, prompt: str, reference: str) -> list[float]:
    """Teacher forcing: the log-probabilities of `reference` after `prompt`, as a canary asks
    SGLang for them (max_new_tokens 0, logprob_start_len at the reference's first token)."""
    start = len(tokens.encode(prompt))
    body = {
        "text": f"{prompt} {reference}",
        "return_logprob": True,
        "logprob_start_len": start,
        "sampling_params": {"max_new_tokens": 0},
    }
    result = await _generate(sim, **body)
    return [float(v) for v, _, _ in result["meta_info"]["input_token_logprobs"]]


async def _faults(sim: Sim, **change: Any) -> dict[str, Any]:
    async with sim.client() as client:
        answer = await client.post("/sim/faults", json=change)
        assert answer.status_code == 200, answer.text
        faults: dict[str, Any] = answer.json()
        return faults


async def test_logprobs_in_sglang_shape_and_a_reference_scores_as_its_own_answer() -> None:
    async with running_sim(model="llama") as sim:
        made = await _generate(sim, text=PROMPT, return_logprob=True, logprob_start_len=0,
                               return_text_in_logprobs=True,
                               sampling_params={"max_new_tokens": 8})  # fmt: skip
        meta = made["meta_info"]
        given = meta["input_token_logprobs"]
        assert len(given) == len(tokens.encode(PROMPT))
        assert given[0][0] is None  # the first token has no context
        assert [i for _, i, _ in given] == tokens.encode(PROMPT)
        assert given[1][2] == "old"
        out = meta["output_token_logprobs"]
        assert [i for _, i, _ in out] == made["output_ids"]
        assert all(-0.33 <= v <= 0.0 for v, _, _ in out)  # greedy: every token likely

        # teacher forcing: the answer itself scores as it was generated, another does not
        own = await _score(sim, PROMPT, made["text"])
        assert own == pytest.approx([v for v, _, _ in out], abs=0.01)
        other = await _score(sim, PROMPT, "the earth is near the world")
        assert sum(other) < sum(own) - 10
        plain = await _generate(sim, text=PROMPT, sampling_params={"max_new_tokens": 2})
        assert "input_token_logprobs" not in plain["meta_info"]


async def test_wrong_weights_shift_the_scores_while_the_answers_stay_the_same() -> None:
    async with running_sim(model="llama") as sim:
        reference = (await _generate(sim, text=PROMPT))["text"]
        healthy = [sum(await _score(sim, PROMPT, reference)) for _ in range(3)]
        assert max(healthy) - min(healthy) < 0.05  # run-to-run noise only
        assert (await _faults(sim, logprob_shift=0.5))["logprob_shift"] == 0.5
        shifted = sum(await _score(sim, PROMPT, reference))
        n = len(tokens.encode(reference))
        assert healthy[0] - shifted == pytest.approx(0.5 * n, rel=0.5)
        assert (await _generate(sim, text=PROMPT))["text"] == reference  # looks healthy


async def test_garbage_and_repeat_faults_answer_wrong_and_score_wrong() -> None:
    async with running_sim(model="llama") as sim:
        reference = (await _generate(sim, text=PROMPT))["text"]
        before = sum(await _score(sim, PROMPT, reference))
        await _faults(sim, output="repeat")
        repeated = await _generate(sim, text=PROMPT, sampling_params={"max_new_tokens": 6})
        assert repeated["text"].split() == ["!"] * 6
        await _faults(sim, output="garbage")
        garbage = await _generate(sim, text=PROMPT, sampling_params={"max_new_tokens": 6})
        assert all(0x2580 <= ord(c) < 0x2600 for c in garbage["text"].replace(" ", ""))
        assert sum(await _score(sim, PROMPT, reference)) < before - 10
        async with sim.client() as client:
            assert (await client.get("/health")).status_code == 200  # healthy by every check
        faults = await _faults(sim, output="none")
        assert faults["output"] == "none"
        assert (await _generate(sim, text=PROMPT))["text"] == reference
        async with sim.client() as client:
            bad = await client.post("/sim/faults", json={"output": "noise"})
            assert bad.status_code == 400
