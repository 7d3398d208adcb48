"""The capacity planner's core as a pure function, over a table of situations: what it
plans for each deployment, and why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.services.planner.core import (
    DailyShape,
    Decision,
    Deployment,
    Guards,
    Limits,
    Observed,
    forecast,
    plan,
    start_times,
)

NOW = 10_000.0
LIMITS = Limits(min_engines=1, max_engines=10, target=0.95, headroom=0.2)
LLAMA = Deployment("llama", "us-east", engines=2, limits=LIMITS, gpus_per_engine=1,
                   price_per_gpu_hour=2.0, start_s=60.0, max_running=16)  # fmt: skip
GUARDS = Guards(now=NOW, stale_after_s=30, cooldown_s=300, max_changes=10,
                engine_rps_prior=5.0)  # fmt: skip


def steady(rps: float, **more: object) -> Observed:
    """A minute of a steady rate, heard a second ago."""
    rates = [(NOW - 60 + 10 * i, rps) for i in range(7)]
    return Observed(at=NOW - 1, rates=rates, **more)  # type: ignore[arg-type]


def one(
    deployment: Deployment = LLAMA,
    seen: Observed | None = None,
    guards: Guards = GUARDS,
    shape: DailyShape | None = None,
) -> Decision:
    observed = {} if seen is None else {(deployment.model, deployment.region): seen}
    shapes = {} if shape is None else {(deployment.model, deployment.region): shape}
    (decided,) = plan([deployment], observed, shapes, guards)
    return decided


RISING = Observed(at=NOW - 1, rates=[(NOW - 60 + 10 * i, 10.0 + 10 * i / 6) for i in range(7)])

# (what, deployment, observed, guards, target, taken, the reason says)
TABLE: list[tuple[str, Deployment, Observed | None, Guards, int, bool, str]] = [
    (
        "steady demand the engines carry holds",
        LLAMA,
        steady(8.0),
        GUARDS,
        2,
        True,
        "forecast 8.0 rps",
    ),
    (
        "rising demand: the trend one start time ahead, with headroom",
        LLAMA,
        RISING,
        GUARDS,
        8,
        True,
        "forecast 30.0 rps in 60 s",
    ),
    ("no rate yet: holds", LLAMA, None, GUARDS, 2, True, "no fresh demand (no rate yet)"),
    (
        "stale heartbeats: holds, never scales down on missing data",
        LLAMA,
        replace(steady(0.0), at=NOW - 45),
        GUARDS,
        2,
        True,
        "the last heartbeat is 45 s old",
    ),
    ("held to its maximum", LLAMA, steady(100.0), GUARDS, 10, True, "held to its maximum, 10"),
    (
        "in-flight work sets a floor",
        LLAMA,
        steady(1.0, inflight=50),
        GUARDS,
        4,
        True,
        "50 requests in flight need 4",
    ),
    (
        "SLO missed with requests waiting: one more",
        LLAMA,
        steady(8.0, attainment=0.8, queued=5),
        GUARDS,
        3,
        True,
        "SLO attainment 80%",
    ),
    (
        "SLO missed, nothing waiting: the forecast stands",
        LLAMA,
        steady(8.0, attainment=0.8),
        GUARDS,
        2,
        True,
        "forecast 8.0 rps",
    ),
    (
        "learned rate an engine serves beats the prior",
        LLAMA,
        steady(8.0, served_per_engine=2.0),
        GUARDS,
        5,
        True,
        "2.00 rps an engine",
    ),
    (
        "a scale-down within the cool-down is not taken",
        replace(LLAMA, engines=6, last_change_at=NOW - 100),
        steady(1.0),
        GUARDS,
        1,
        False,
        "cool-down: 200 s left",
    ),
    (
        "a scale-down after it: by half at most",
        replace(LLAMA, engines=8, last_change_at=NOW - 400),
        steady(1.0),
        GUARDS,
        4,
        True,
        "down by half at most, to 4",
    ),
    (
        "idle, zero not allowed: its minimum of one",
        replace(LLAMA, engines=1),
        steady(0.0),
        GUARDS,
        1,
        True,
        "forecast 0.0 rps",
    ),
    (
        "idle a whole window, zero allowed: to zero",
        replace(LLAMA, engines=1, limits=replace(LIMITS, min_engines=0, scale_to_zero=True)),
        Observed(at=NOW - 1, rates=[(NOW - 10 * (19 - i), 0.0) for i in range(20)]),
        GUARDS,
        0,
        True,
        "forecast 0.0 rps",
    ),
    (
        "a lull of a minute, zero allowed: one engine kept",
        replace(LLAMA, engines=1, limits=replace(LIMITS, min_engines=0, scale_to_zero=True)),
        Observed(
            at=NOW - 1, rates=[(NOW - 10 * (19 - i), 3.0 if i < 14 else 0.0) for i in range(20)]
        ),
        GUARDS,
        1,
        True,
        "asked for within its last 20 periods: one engine kept",
    ),
    (
        "at zero, never asked for (less than a window heard): it stays at zero",
        replace(LLAMA, engines=0, limits=replace(LIMITS, min_engines=0, scale_to_zero=True)),
        steady(0.0),
        GUARDS,
        0,
        True,
        "forecast 0.0 rps",
    ),
    (
        "at zero, asked for in its window: one engine",
        replace(LLAMA, engines=0, limits=replace(LIMITS, min_engines=0, scale_to_zero=True)),
        Observed(at=NOW - 1, rates=[(NOW - 60 + 10 * i, 0.01 * (i == 0)) for i in range(7)]),
        GUARDS,
        1,
        True,
        "asked for within its last 20 periods",
    ),
    (
        "at zero while requests are refused: back to one",
        replace(LLAMA, engines=0, limits=replace(LIMITS, min_engines=0, scale_to_zero=True)),
        steady(0.0, refused_per_s=0.5),
        GUARDS,
        1,
        True,
        "never zero while refusing",
    ),
]


@pytest.mark.parametrize(
    ("deployment", "seen", "guards", "target", "taken", "says"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_the_plan_for_one_deployment(
    deployment: Deployment,
    seen: Observed | None,
    guards: Guards,
    target: int,
    taken: bool,
    says: str,
) -> None:
    decided = one(deployment, seen, guards)
    assert (decided.target, decided.taken) == (target, taken), decided.describe()
    assert says in decided.reason, decided.reason


def test_the_daily_shape_plans_ahead_of_a_peak_the_trend_cannot_see() -> None:
    shape = DailyShape.empty(day_s=600, buckets=10)
    for day in range(3):  # a peak of 40 rps every day at its 8th tenth
        for bucket in range(10):
            shape = shape.learn(day * 600 + bucket * 60 + 1, 40.0 if bucket == 7 else 5.0)
    quiet = Observed(at=NOW - 1, rates=[(NOW - 60 + 10 * i, 5.0) for i in range(7)])
    # NOW is 40 s into the day's 7th tenth: one start time (60 s) ahead is the peak
    assert shape.at(NOW + 60) == pytest.approx(40.0)
    assert forecast(quiet.rates, NOW + 60, shape) == pytest.approx(40.0)
    decided = one(LLAMA, quiet, GUARDS, shape)
    assert decided.target == 10  # 40 * 1.2 / 5, held to its maximum
    assert one(LLAMA, quiet, GUARDS).target == 2  # without the shape: 5 * 1.2 / 5


def test_learning_weighs_the_newest_days_most() -> None:
    shape = DailyShape.empty(day_s=100, buckets=4)
    assert shape.at(10) is None
    shape = shape.learn(10, 10.0).learn(110, 20.0, weight=0.5)
    assert shape.at(210) == pytest.approx(15.0)
    assert shape.at(60) is None  # another part of the day


def test_the_trend_runs_on_no_further_than_the_window_ranged() -> None:
    spike = [(0.0, 1.0), (10.0, 1.0), (20.0, 50.0)]
    assert forecast(spike, 1_000.0) == pytest.approx(99.0)  # 50 + (50 - 1), not thousands
    assert forecast([(0.0, 10.0), (10.0, 0.0)], 1_000.0) == 0.0  # never below zero
    assert forecast([], 5.0) == 0.0


def test_scale_ups_share_the_gpu_budget_largest_shortfall_first() -> None:
    east = replace(LLAMA, engines=2)
    west = replace(LLAMA, region="us-west", engines=2)
    seen = {("llama", "us-east"): steady(40.0), ("llama", "us-west"): steady(15.0)}
    guards = replace(GUARDS, gpu_budget=10)  # 4 used, 6 more at most
    decided = {d.region: d for d in plan([east, west], seen, {}, guards)}
    assert (decided["us-east"].target, decided["us-east"].taken) == (8, True)  # wants 10: +6
    assert "the budget of 10 GPUs: 6 of 8 more" in decided["us-east"].reason
    assert (decided["us-west"].target, decided["us-west"].taken) == (4, False)
    assert "the budget of 10 GPUs reached" in decided["us-west"].reason
    used = sum(d.target * 1 for d in decided.values() if d.taken)
    used += sum(d.current for d in decided.values() if not d.taken)
    assert used <= 10


def test_the_money_budget_holds_as_the_gpu_budget_does() -> None:
    dear = replace(LLAMA, price_per_gpu_hour=4.0, gpus_per_engine=2)  # 8 an hour an engine
    guards = replace(GUARDS, money_budget=40.0)  # 16 now: 3 more engines at most
    decided = one(dear, steady(40.0), guards)
    assert (decided.target, decided.taken) == (5, True)
    assert "the budget of 40 an hour: 3 of 8 more" in decided.reason


def test_at_most_so_many_changes_a_period() -> None:
    regions = [f"r{i}" for i in range(4)]
    deployments = [replace(LLAMA, region=r) for r in regions]
    seen = {("llama", r): steady(10.0 * (i + 2)) for i, r in enumerate(regions)}
    decided = plan(deployments, seen, {}, replace(GUARDS, max_changes=2))
    taken = {d.region for d in decided if d.taken and d.target != d.current}
    assert taken == {"r3", "r2"}  # the largest shortfalls
    refused = [d for d in decided if not d.taken]
    assert {d.region for d in refused} == {"r0", "r1"}
    assert all("at most 2 changes a period" in d.reason for d in refused)


def test_every_decision_reads_as_an_audit_line() -> None:
    decided = one(LLAMA, RISING)
    assert decided.describe().startswith("us-east llama 2→8: forecast 30.0 rps in 60 s")
    assert one(LLAMA, None).describe() == "us-east llama holds: no fresh demand (no rate yet)"


def test_start_times_are_the_median_of_the_engines_last_starts_per_model() -> None:
    engines: list[dict[str, object]] = [
        {"model": "llama", "ready_after_s": 70.0},
        {"model": "llama", "ready_after_s": 90.0},
        {"model": "llama", "ready_after_s": 400.0},  # one slow start does not set the figure
        {"model": "qwen", "ready_after_s": 0.0},  # adopted: not known
        {"model": "qwen"},
    ]
    assert start_times(engines) == {"llama": 90.0}


EAST = replace(LLAMA, engines=8, price_per_gpu_hour=3.9, peers=("us-west",),
               limits=replace(LIMITS, headroom=0.0, local_share=0.5))  # fmt: skip
# us-west runs 6: its own 2, and 4 started for us-east's demand a while ago
WEST = replace(LLAMA, region="us-west", engines=6, price_per_gpu_hour=2.2,
               limits=replace(LIMITS, headroom=0.0))  # fmt: skip


def _spilled(
    east: Deployment = EAST, west: Deployment = WEST, east_seen: Observed | None = None,
    west_seen: Observed | None = None,
) -> dict[str, Decision]:  # fmt: skip
    """us-east asked 40 rps (8 engines at 5 rps), us-west 10 (2 engines)."""
    observed = {("llama", "us-east"): east_seen or steady(40.0),
                ("llama", "us-west"): west_seen or steady(10.0)}  # fmt: skip
    return {d.region: d for d in plan([east, west], observed, {}, GUARDS)}


def test_bulk_capacity_beyond_a_regions_local_share_is_planned_where_gpus_are_cheaper() -> None:
    # the peer starts its engines first; the region gives up none of its own meanwhile
    starting = _spilled(west=replace(WEST, engines=2, last_change_at=NOW - 10))
    assert (starting["us-east"].target, starting["us-west"].target) == (8, 6)
    assert "us-west starts 4 to take some of it" in starting["us-east"].reason
    assert "+4 for us-east's demand, 44% cheaper here" in starting["us-west"].reason
    # they run there now (a start time has passed): the region lets its own go, cool-down
    # or not (its demand did not fall: there is no flapping to damp)
    decided = _spilled(east=replace(EAST, last_change_at=NOW - 10),
                       west=replace(WEST, last_change_at=NOW - 61))  # fmt: skip
    assert (decided["us-east"].target, decided["us-west"].target) == (4, 6)
    assert "4 planned in us-west instead, 44% cheaper" in decided["us-east"].reason
    assert decided["us-east"].taken


@pytest.mark.parametrize(
    ("what", "east", "west", "east_seen", "west_seen", "targets"),
    [
        ("its local share is all of it (the default)",
         replace(EAST, limits=replace(EAST.limits, local_share=1.0)),
         replace(WEST, engines=2), None, None, (8, 2)),
        ("no fallback rule lets its demand reach the peer",
         replace(EAST, peers=()), replace(WEST, engines=2), None, None, (8, 2)),
        ("the peer is not cheaper by a tenth", EAST,
         replace(WEST, engines=2, price_per_gpu_hour=3.6), None, None, (8, 2)),
        ("the peer has room for two more only", EAST,
         replace(WEST, engines=4, limits=replace(WEST.limits, max_engines=4)), None, None,
         (6, 4)),
        ("the peer's demand cannot be trusted (it holds)", EAST, WEST, None,
         replace(steady(10.0), at=NOW - 600), (8, 6)),
        ("the peer lost 3 of its engines (a preemption): it covers 1", EAST,
         replace(WEST, last_change_at=NOW - 61), None, steady(10.0, ready=3), (7, 6)),
        ("its in-flight work needs 7 of its own", EAST, replace(WEST, engines=3),
         steady(40.0, inflight=7 * 16), None, (7, 3)),
    ],
)  # fmt: skip
def test_nothing_spills_that_may_not(
    what: str, east: Deployment, west: Deployment, east_seen: Observed | None,
    west_seen: Observed | None, targets: tuple[int, int],
) -> None:  # fmt: skip
    decided = _spilled(east, west, east_seen, west_seen)
    assert (decided["us-east"].target, decided["us-west"].target) == targets, what
