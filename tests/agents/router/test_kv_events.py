"""The KV-event subscription keeps the exact index as the engine says (SGLang 0.5.23's events:
maps tagged by `type`, a run of pages an event): the pages it stored match a request's tokens
page for page, each cache namespace apart, and what it evicted, cleared or lost is taken
out."""

from __future__ import annotations

from array import array
from typing import Any

from agents.config import WorkerSpec
from agents.engines.sim.kv_events import page_hashes
from agents.workers.kv_events import Subscription
from agents.workers.prefix import PrefixIndex, salt_root

PAGE = 4
WORKER = WorkerSpec("w0", "m", "d", "unified", "http://127.0.0.1:30000", None, None, 32000)


def _stored(
    tokens: list[int], start_page: int = 0, run: int = 2, salt: str | None = None
) -> list[dict[str, Any]]:
    """BlockStored events for the tokens' whole pages, chained as an engine chains them, in
    runs of `run` pages an event (under `salt`: the engine's hashes are the same)."""
    hashes = page_hashes(tokens, PAGE, len(tokens))
    return [
        {"type": "BlockStored", "block_hashes": hashes[i : i + run],
         "parent_block_hash": hashes[i - 1] if i else None,
         "token_ids": tokens[i * PAGE : min(i + run, len(hashes)) * PAGE],
         "block_size": PAGE, "lora_id": None, "medium": "GPU"}
        | ({"cache_salt": salt} if salt else {})
        for i in range(start_page, len(hashes), run)
    ]  # fmt: skip


def _matched(index: PrefixIndex, tokens: list[int], salt: str | None = None) -> int:
    """Tokens of the prompt the index says the worker holds (in `salt`'s namespace)."""
    key = array("i", tokens).tobytes()
    return index.match(index.hashes(key, salt_root(salt))).get("w0", 0) * PAGE


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
    subscription.apply(1, [{"type": "BlockRemoved", "block_hashes": hashes[2:]}])
    assert _matched(index, prompt) == 8
    subscription.apply(2, [{"type": "AllBlocksCleared"}])
    assert _matched(index, prompt) == 0


def test_a_gap_in_the_sequence_clears_what_may_be_stale() -> None:
    index = PrefixIndex(4 * PAGE, 1000)
    subscription = Subscription(WORKER, index)
    prompt = list(range(100, 116))
    subscription.apply(0, _stored(prompt))
    subscription.apply(5, [])  # events 1-4 were lost: they may have evicted anything
    assert _matched(index, prompt) == 0
    assert subscription.missed  # the engine is to be flushed to hear it whole again


def test_a_block_whose_parent_was_never_seen_is_not_guessed_at() -> None:
    index = PrefixIndex(4 * PAGE, 1000)
    subscription = Subscription(WORKER, index)
    prompt = list(range(100, 116))
    subscription.apply(0, _stored(prompt, start_page=2))  # pages 0-1 were stored earlier
    assert _matched(index, prompt) == 0
    assert subscription.missed
    # the flush that follows: the engine clears, then what it stores is heard from the root
    subscription.apply(1, [{"type": "AllBlocksCleared"}, *_stored(prompt, run=3)])
    assert not subscription.missed
    assert _matched(index, prompt) == 16


def test_one_tenants_cached_prefix_is_not_anothers() -> None:
    """Issue 40 §4: the engine keeps a prefix per `cache_salt` (one per tenant), naming the
    same tokens' pages by the same hashes in each; the index holds each namespace apart, and
    an eviction (which says no salt) takes the page out of every one."""
    index = PrefixIndex(4 * PAGE, 1000)
    subscription = Subscription(WORKER, index)
    prompt = list(range(100, 116))
    subscription.apply(0, _stored(prompt, salt="acme"))
    assert _matched(index, prompt, "acme") == 16
    assert _matched(index, prompt, "beta") == 0
    assert _matched(index, prompt) == 0
    subscription.apply(1, _stored(prompt[:8], salt="beta"))
    assert (_matched(index, prompt, "acme"), _matched(index, prompt, "beta")) == (16, 8)
    hashes = page_hashes(prompt, PAGE, len(prompt))
    subscription.apply(2, [{"type": "BlockRemoved", "block_hashes": hashes[1:]}])
    assert (_matched(index, prompt, "acme"), _matched(index, prompt, "beta")) == (4, 4)
