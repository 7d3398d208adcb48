"""The KV-event subscription keeps the exact index as the engine says: the pages it stored
match a request's tokens page for page, and what it evicted, cleared or lost is taken out."""

from __future__ import annotations

from array import array

from agents.control.compile import WorkerSpec
from agents.engines.sim.kv_events import page_hashes
from agents.router.prefix import PrefixIndex
from agents.workers.kv_events import Subscription

PAGE = 4
WORKER = WorkerSpec("w0", "m", "d", "unified", "http://127.0.0.1:30000", None, None, 32000)


def _stored(tokens: list[int], start_page: int = 0) -> list[list[object]]:
    """BlockStored events for the tokens' whole pages, chained as an engine chains them."""
    hashes = page_hashes(tokens, PAGE, len(tokens))
    return [
        ["BlockStored", [hashes[i]], hashes[i - 1] if i else None,
         tokens[i * PAGE : (i + 1) * PAGE], PAGE, None]
        for i in range(start_page, len(hashes))
    ]  # fmt: skip


def _matched(index: PrefixIndex, tokens: list[int]) -> int:
    """Tokens of the prompt the index says the worker holds."""
    return index.match(index.hashes(array("i", tokens).tobytes())).get("w0", 0) * PAGE


def test_stored_pages_match_a_prompt_page_for_page() -> None:
    index = PrefixIndex(4 * PAGE, 1000)
    subscription = Subscription(WORKER, index)
    prompt = list(range(100, 114))  # 3 whole pages and 2 tokens
    subscription.apply(0, _stored(prompt))
    assert _matched(index, prompt) == 12
    assert _matched(index, [*prompt[:6], 999, 998, 997, 996]) == 4  # diverges in page 2
    assert _matched(index, list(range(200, 214))) == 0


def test_evicted_and_cleared_blocks_leave_the_index() -> None:
    index = PrefixIndex(4 * PAGE, 1000)
    subscription = Subscription(WORKER, index)
    prompt = list(range(100, 116))
    subscription.apply(0, _stored(prompt))
    hashes = page_hashes(prompt, PAGE, len(prompt))
    subscription.apply(1, [["BlockRemoved", hashes[2:]]])
    assert _matched(index, prompt) == 8
    subscription.apply(2, [["AllBlocksCleared"]])
    assert _matched(index, prompt) == 0


def test_a_gap_in_the_sequence_clears_what_may_be_stale() -> None:
    index = PrefixIndex(4 * PAGE, 1000)
    subscription = Subscription(WORKER, index)
    prompt = list(range(100, 116))
    subscription.apply(0, _stored(prompt))
    subscription.apply(5, [])  # events 1-4 were lost: they may have evicted anything
    assert _matched(index, prompt) == 0


def test_a_block_whose_parent_was_never_seen_is_not_guessed_at() -> None:
    index = PrefixIndex(4 * PAGE, 1000)
    subscription = Subscription(WORKER, index)
    prompt = list(range(100, 116))
    subscription.apply(0, _stored(prompt, start_page=2))  # pages 0-1 were stored earlier
    assert _matched(index, prompt) == 0
