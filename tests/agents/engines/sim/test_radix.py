"""The simulator's prefix cache: what a second request with the same prefix finds cached."""

from __future__ import annotations

from agents.engines.sim.radix import RadixCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_a_shared_prefix_is_found_and_only_new_tokens_are_added() -> None:
    cache = RadixCache(1000, Clock())
    assert cache.insert([1, 2, 3, 4, 5]) == 5
    assert cache.match([1, 2, 3, 9, 9])[0] == 3
    assert cache.insert([1, 2, 3, 9, 9]) == 2
    assert cache.match([1, 2, 3, 4, 5, 6])[0] == 5
    assert cache.match([7])[0] == 0
    assert cache.size == 7


def test_over_capacity_the_least_recently_used_prefix_goes_first() -> None:
    cache = RadixCache(10, Clock())
    cache.insert([1] * 4)
    cache.insert([2] * 4)
    cache.match([1] * 4)  # [1...] is now the more recent
    cache.insert([3] * 4)  # needs 2 more tokens than there is room for
    assert cache.match([2] * 4)[0] == 0
    assert cache.match([1] * 4)[0] == 4
    assert cache.match([3] * 4)[0] == 4
    assert cache.size == 8


def test_a_prefix_a_running_request_holds_is_not_evicted() -> None:
    cache = RadixCache(8, Clock())
    cache.insert([1] * 4)
    _, held = cache.match([1] * 4)
    cache.lock(held)
    cache.insert([2] * 4)
    cache.insert([3] * 4)  # only [2...] may go
    assert cache.match([1] * 4)[0] == 4
    assert cache.match([2] * 4)[0] == 0
    cache.unlock(held)
    assert cache.evict(100) == 8
    assert cache.size == 0


def test_a_sequence_longer_than_the_cache_is_cached_as_far_as_it_fits() -> None:
    cache = RadixCache(5, Clock())
    assert cache.insert(list(range(8))) == 5
    assert cache.match(list(range(8)))[0] == 5
    assert RadixCache(0).insert([1, 2]) == 0


def test_a_prefix_is_cached_per_salt() -> None:
    """SGLang's `cache_salt`: the same tokens under another salt are not a hit, and an evicted
    namespace leaves nothing behind."""
    cache = RadixCache(12, Clock())
    assert cache.insert([1, 2, 3, 4], "a") == 4
    assert cache.match([1, 2, 3, 4], "a")[0] == 4
    assert cache.match([1, 2, 3, 4], "b")[0] == 0
    assert cache.match([1, 2, 3, 4])[0] == 0
    assert cache.insert([1, 2, 3, 4], "b") == 4
    assert cache.size == 8
    cache.insert([5] * 8)  # past the capacity: the least recent, a's, goes
    assert cache.match([1, 2, 3, 4], "a")[0] == 0
    assert "a" not in cache.roots
