"""Nodes per node pool as a pure function: the cheapest pools first within their bounds, what
must not be spot from pools that are not."""

from __future__ import annotations

from dataclasses import replace

from controlplane.services.planner.sizing import Pool, size_pools


def _pool(name: str, price: float, nodes: int = 1, lo: int = 0, hi: int = 4,
          gpus: int = 8) -> Pool:  # fmt: skip
    return Pool(name, "us-east", gpus, price, lo, hi, nodes)


def test_pools_fill_cheapest_first_within_their_bounds_and_keep_their_minimum() -> None:
    spot, steady = _pool("spot", 2.0, lo=0, hi=2), _pool("steady", 4.0, lo=1, hi=4)
    sized = {d.pool: d.target for d in size_pools([steady, spot], {"us-east": 40})}
    assert sized == {"spot": 2, "steady": 3}  # 8 from steady's minimum, 16 spot, 16 more
    sized = {d.pool: d.target for d in size_pools([steady, spot], {"us-east": 0})}
    assert sized == {"spot": 0, "steady": 1}  # down to the minimum, never below
    (short, _) = size_pools([spot, steady], {"us-east": 100})
    assert "short by 52: every pool at its maximum" in short.reason
    (kept,) = size_pools([_pool("other", 1.0, nodes=3)], {"eu-west": 8})
    assert (kept.target, kept.reason) == (3, "no plan for its region")


def test_what_must_not_be_spot_comes_from_the_pools_that_are_not_then_the_cheapest() -> None:
    spot = replace(_pool("spot", 2.0, lo=0, hi=4), spot=True)
    steady = _pool("steady", 4.0, lo=0, hi=4)
    # 24 GPUs, of which 8 (one engine of each deployment) not spot: 1 steady node, 2 spot
    sized = size_pools([steady, spot], {"us-east": 24}, {"us-east": 8})
    assert {d.pool: d.target for d in sized} == {"spot": 2, "steady": 1}
    assert "(8 of them not spot)" in sized[0].reason
    # no spot pool here: the floor changes nothing
    cheap = _pool("cheap", 1.0, lo=0, hi=4)
    sized = size_pools([steady, cheap], {"us-east": 24}, {"us-east": 8})
    assert {d.pool: d.target for d in sized} == {"cheap": 3, "steady": 0}
    # spot only: it is what there is
    sized = size_pools([spot], {"us-east": 16}, {"us-east": 8})
    assert [d.target for d in sized] == [2]
