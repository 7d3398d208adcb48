"""An engine's own counters into the ledger: each reading's tokens less the agent's own
canaries', and a reading put off while a canary may straddle it, so that a canary's tokens
leave the interval the engine counted them in (a canary answered between the counters'
scrape and the reading once left them in the next interval, and reconciliation saw drift)."""

from __future__ import annotations

from pathlib import Path

from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.engines.metrics import Counters
from agents.ledger.journal import Journal
from agents.ledger.meter import Meter
from agents.ledger.record import Ledger


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _read(meter: Meter, clock: Clock, prompt: float, generation: float) -> None:
    clock.now += 1.0
    meter.read({"w1": Counters(prompt_tokens=prompt, generation_tokens=generation)},
               meter.mark())  # fmt: skip


def _meters(journal: Journal) -> list[tuple[int, int]]:
    journal.flush()
    records: list[pb.UsageRecord] = journal.records_after(0, 100)
    return [(r.prompt_tokens, r.completion_tokens) for r in records if r.kind == "meter"]


def test_a_reading_is_the_engines_count_less_the_agents_own(tmp_path: Path) -> None:
    journal, clock = Journal(tmp_path), Clock()
    meter = Meter(Ledger(journal, lambda: "n1", wall=clock), lambda: "eu-west", 1.0, clock)
    _read(meter, clock, 100, 10)  # the first sight: where the count starts
    with meter.owning("w1") as spent:
        spent(30, 2)
    _read(meter, clock, 250, 40)
    assert _meters(journal) == [(120, 28)]
    journal.close()


def test_a_canary_that_straddles_the_counters_puts_the_reading_off(tmp_path: Path) -> None:
    journal, clock = Journal(tmp_path), Clock()
    meter = Meter(Ledger(journal, lambda: "n1", wall=clock), lambda: "eu-west", 1.0, clock)
    _read(meter, clock, 0, 0)
    mark = meter.mark()  # the counters are asked for ...
    with meter.owning("w1") as spent:  # ... a canary runs meanwhile, counted or not
        spent(30, 2)
    clock.now += 1.0
    meter.read({"w1": Counters(prompt_tokens=100, generation_tokens=10)}, mark)
    assert _meters(journal) == []  # put off: the counters may not hold the canary
    with meter.owning("w1") as spent:  # under way at the next reading: put off again
        _read(meter, clock, 180, 20)
        spent(30, 2)
    assert _meters(journal) == []
    _read(meter, clock, 200, 24)  # nothing of the agent's own in doubt: one reading for all
    assert _meters(journal) == [(140, 20)]
    journal.close()
