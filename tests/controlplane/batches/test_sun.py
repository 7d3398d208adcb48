"""Follow the sun: batches' lines go first, and more of them, to regions where it is night."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from controlplane.schemas.fleet import RegionSpec
from controlplane.services.batches.runner import Target, Window, by_sun, sun_weight

NOON_UTC = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _target(name: str, offset: float | None) -> Target:
    return Target(name, f"http://{name}", "us", frozenset({"m"}), offset)


def test_a_region_at_night_comes_first_and_its_window_grows_further() -> None:
    sydney, london, newyork, unknown = (_target("ap-southeast", 10.0), _target("eu-west", 0.0),
                                        _target("us-east", -5.0), _target("x", None))  # fmt: skip
    assert sun_weight(9.0, NOON_UTC) == 1.0  # 21:00 in Tokyo: not yet night
    assert sun_weight(10.0, NOON_UTC) == 2.0  # 22:00 in Sydney: night
    assert sun_weight(0.0, NOON_UTC) == 0.5  # noon in London: its working day
    assert sun_weight(-5.0, NOON_UTC) == 1.0  # 07:00 in New York: neither
    assert sun_weight(None, NOON_UTC) == 1.0
    assert [t.name for t in by_sun([london, newyork, unknown, sydney], NOON_UTC)] == [
        "ap-southeast", "us-east", "x", "eu-west",
    ]  # fmt: skip
    night, day = Window(weight=2.0), Window(weight=0.5)
    for _ in range(2000):
        night.answered()
        day.answered()
    assert 1.9 < night.size / day.size < 2.1  # faster (windows grow as a root of answers)
    for _ in range(100_000):
        night.answered()
        day.answered()
    assert (night.size, day.size) == (512, 128)  # twice as far, and half as far


def test_an_offset_is_whole_quarter_hours_within_the_earths() -> None:
    spec = {"cloud": "c", "geography": "in", "jurisdiction": "in"}
    assert RegionSpec(**spec, utc_offset_h=5.5).utc_offset_h == 5.5
    for bad in (15, -13, 5.1):
        with pytest.raises(ValidationError):
            RegionSpec(**spec, utc_offset_h=bad)
