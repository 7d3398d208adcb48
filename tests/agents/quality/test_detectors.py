"""The quality guard's pure parts: what one answer shows, and a worker judged against its
peers (never against a fixed absolute)."""

from __future__ import annotations

import random
from collections.abc import Callable

from meridian_pb.fleet.v1.judging import MIN_FLAGGED

from agents.engines.sim import tokens
from agents.quality.detectors import EMPTY_JUDGED_FROM, LENGTH_JUDGED_FROM, Answer, suspect
from agents.quality.peers import Book, Source

PROMPT = "Tell me about the river and the old man who lived near it."
STORY = (
    "The old man lived near the river for most of his life. Each morning he walked to the "
    "water, watched the boats go by, and talked with the people who came to fish there."
)


def test_a_healthy_answer_trips_nothing() -> None:
    assert suspect(Answer(STORY, "stop"), PROMPT) == frozenset()
    french = (
        "Le vieil homme vivait près de la rivière depuis toujours, et chaque matin il y allait."
    )
    assert suspect(Answer(french, "stop"), "Réponds en français, s'il te plaît.") == frozenset()


def test_repetition_garbage_empty_and_the_length_cap() -> None:
    assert "repetition" in suspect(Answer("!" * 400, "length"), PROMPT)
    assert "repetition" in suspect(Answer("the answer is " * 40), PROMPT)
    assert "repetition" not in suspect(Answer(STORY * 2), PROMPT)  # twice is not a loop
    garbage = tokens.decode(tokens.output_ids(tokens.encode(PROMPT), 40, "garbage"))
    assert "foreign" in suspect(Answer(garbage), PROMPT)
    # a script the prompt uses is not foreign
    assert "foreign" not in suspect(Answer("東京は日本の首都です。"), "東京について教えて")
    assert "empty" in suspect(Answer("  ", "stop"), PROMPT)
    assert "empty" not in suspect(Answer("", "tool_calls", [("weather", "{}")],
                                         tools_offered={"weather": None}), PROMPT)  # fmt: skip
    assert "length" in suspect(Answer(STORY, "length"), PROMPT)


def test_json_and_tool_calls_are_checked_on_the_final_text() -> None:
    assert "invalid" in suspect(Answer('{"a": 1', json_wanted=True), PROMPT)
    assert "invalid" not in suspect(Answer('{"a": [1, 2]}', json_wanted=True), PROMPT)
    offered = {"weather": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"], "additionalProperties": False}}  # fmt: skip
    assert "invalid" in suspect(Answer("", tool_calls=[("wether", "{}")],
                                       tools_offered=offered), PROMPT)  # fmt: skip
    assert "invalid" in suspect(Answer("", tool_calls=[("weather", "{city:")],
                                       tools_offered=offered), PROMPT)  # fmt: skip
    assert "invalid" not in suspect(Answer("", tool_calls=[("weather", '{"city": "Oslo"}')],
                                           tools_offered=offered), PROMPT)  # fmt: skip
    # arguments that parse and break the tool's schema: a wrong type, a missing field
    for broken in ('{"city": 7}', '{"town": "Oslo"}', '{"city": "Oslo", "days": 3}'):
        assert "invalid" in suspect(Answer("", tool_calls=[("weather", broken)],
                                           tools_offered=offered), PROMPT), broken  # fmt: skip
    # a schema that is no JSON schema is the client's fault: arguments that parse pass
    odd = {"weather": {"type": "nonsense"}}
    assert "invalid" not in suspect(Answer("", tool_calls=[("weather", '{"a": 1}')],
                                           tools_offered=odd), PROMPT)  # fmt: skip


def _source(i: int) -> Source:
    """Ordinary traffic: four tenants, each with prompts of its own."""
    return Source(f"tenant-{i % 4}", i % 11)


def _feed(
    book: Book, worker: str, n: int, share: float, flag: str, seed: int,
    source: Callable[[int], Source] = _source,
) -> None:  # fmt: skip
    pick = random.Random(seed)
    for i in range(n):
        flags = frozenset({flag}) if pick.random() < share else frozenset()
        book.record(worker, flags, f"{worker}-{i}", source(i))


def test_what_the_client_asked_for_is_not_held_against_the_worker() -> None:
    """max_tokens 0 or 1, a stop sequence, a small cap, JSON cut by its cap: the answer the
    request made likely trips nothing; the same answer to a request that left room does."""
    assert "empty" not in suspect(Answer("", "length", cap=0), PROMPT)
    assert "empty" not in suspect(Answer(" ", "length", cap=1), PROMPT)
    assert "empty" not in suspect(Answer("", "stop", cap=200, stops=True), PROMPT)
    assert "empty" in suspect(Answer("", "stop", cap=EMPTY_JUDGED_FROM), PROMPT)
    assert "length" not in suspect(Answer(STORY, "length", cap=1), PROMPT)
    assert "length" not in suspect(Answer(STORY, "length", cap=LENGTH_JUDGED_FROM - 1), PROMPT)
    assert "length" in suspect(Answer(STORY, "length", cap=LENGTH_JUDGED_FROM), PROMPT)
    assert "invalid" not in suspect(Answer('{"a": [1,', "length", json_wanted=True, cap=8),
                                    PROMPT)  # fmt: skip
    assert "invalid" in suspect(Answer('{"a": [1,', "stop", json_wanted=True, cap=8), PROMPT)


def test_a_worker_that_departs_from_its_peers_fails_and_shows_its_evidence() -> None:
    book = Book()
    for w in ("a", "b"):
        _feed(book, w, 30, 0.0, "repetition", 1)
    _feed(book, "c", 20, 0.8, "repetition", 2)
    kinds = dict.fromkeys(("a", "b", "c"), "llama")
    (found,) = book.findings(kinds)
    assert (found.worker, found.detector) == ("c", "repetition")
    assert found.share >= 0.5
    assert found.peers_share == 0.0
    assert found.examples
    assert all(e.startswith("c-") for e in found.examples)


def test_no_false_finding_when_every_worker_shares_the_workload() -> None:
    """Half of every worker's answers end on the length cap: the workload, not a worker."""
    book = Book()
    for seed, w in enumerate(("a", "b", "c")):
        _feed(book, w, 200, 0.5, "length", seed)
    assert book.findings(dict.fromkeys(("a", "b", "c"), "llama")) == []


def test_too_little_evidence_and_a_worker_without_peers_are_not_judged() -> None:
    book = Book()
    _feed(book, "a", 100, 0.0, "empty", 1)
    for i in range(MIN_FLAGGED - 1):
        book.record("b", frozenset({"empty"}), f"b-{i}", _source(i))
    assert book.findings({"a": "llama", "b": "llama"}) == []
    _feed(book, "solo", 50, 1.0, "empty", 3)
    assert book.findings({"solo": "qwen"}) == []  # its kind has no other worker here
    # peers of another kind (other hardware) are not its peers
    assert book.findings({"a": "llama/h100", "solo": "llama/a100"}) == []
    book.forget(["a"])
    assert book.findings({"a": "llama", "b": "llama"}) == []


def test_one_tenants_answers_or_one_prefixs_are_never_enough() -> None:
    """However many flagged answers one tenant's requests (over many prefixes), or one
    prefix's (from many tenants), bring a worker, it does not fail; spread over tenants and
    prompts, the same share does."""
    kinds = dict.fromkeys(("a", "b", "c"), "llama")
    for attacker in (lambda i: Source("mallory", i), lambda i: Source(f"t{i}", 7)):
        book = Book()
        for w in ("a", "b", "c"):
            _feed(book, w, 120, 0.0, "empty", 1)
        _feed(book, "c", 80, 1.0, "empty", 2, attacker)  # c's window: 40% flagged
        assert book.findings(kinds) == []
    book = Book()
    for w in ("a", "b", "c"):
        _feed(book, w, 120, 0.0, "empty", 1)
    _feed(book, "c", 80, 1.0, "empty", 2)  # the same share, from everyone
    assert [(f.worker, f.detector) for f in book.findings(kinds)] == [("c", "empty")]
