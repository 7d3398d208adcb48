"""Canaries: a golden prompt and its reference continuation, scored on a worker by the
teacher-forced log-probabilities of the whole text, and the worker judged against its peers'
scores of the same canary. No I/O: what to send to SGLang's `/generate` and how to read
its answer.

The score is the mean log-probability per token of the prompt and reference together
(`logprob_start_len` 0, `max_new_tokens` 0: nothing is generated), so that no tokenizer is
needed on this side: every worker of a model tokenizes the same text alike. Teacher forcing
tolerates what exact text matching does not: batching makes a worker's numbers vary a little
from run to run, never its tokens' order of likelihood.

A worker fails a canary when its score lies below its peers' median by more than `K` times
their spread (the median absolute deviation, scaled to a standard deviation), and by more
than `FLOOR` (nats per token), which stands for the spread when the peers agree to the last
digit (meridian_pb/fleet/v1/judging.py: the control plane judges regions by the same rule).
Only a lower score fails: wrong weights, garbage and a broken kernel all make the reference
less likely, never more. Workers held out of rotation are no one's peers; the
model's last worker in rotation is judged against the score its canary was made with alone,
with a wider bound (`LONE`): only an alert can follow (agents/quality/guard.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Canary:
    name: str
    prompt: str
    reference: str
    expected: float | None = None  # the score its replicas' majority had when it was made
    source: str = ""  # the model's weights it was made on

    def body(self, rid: str) -> bytes:
        """SGLang's /generate: the text scored, nothing generated."""
        return orjson.dumps({
            "rid": rid, "text": f"{self.prompt}{self.reference}",
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 0,
        })  # fmt: skip


class CanaryUnreadable(ValueError):
    """The answer carries no log-probabilities to score."""


def score(answer: bytes) -> float:
    """The mean log-probability per token of what was scored."""
    try:
        doc: Any = orjson.loads(answer)
        values = [v[0] for v in doc["meta_info"]["input_token_logprobs"] if v[0] is not None]
    except (orjson.JSONDecodeError, KeyError, TypeError, IndexError) as error:
        raise CanaryUnreadable(f"no input_token_logprobs in the answer: {error}") from None
    if not values:
        raise CanaryUnreadable("the answer scored no token")
    return float(sum(values)) / len(values)
