"""The usage journal keeps every record it took through the agent's death (kill -9) and its
restart, reads a frame cut short as its end, ships only what is flushed, and deletes a
segment only once every record in it is acknowledged."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.ledger.journal import Journal, read_frames

WRITER = """
import sys, time
from pathlib import Path
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from agents.ledger.journal import Journal

journal = Journal(Path(sys.argv[1]), segment_bytes=1 << 16)
journal.start()
n = 0
while True:  # records as fast as it can, and says, each hundred, the last one taken
    n += 1
    journal.append(pb.UsageRecord(request_id=f"r{n}", tenant="acme", prompt_tokens=n))
    if n % 100 == 0:
        print(n, flush=True)
"""


def _record(n: int) -> pb.UsageRecord:
    return pb.UsageRecord(request_id=f"r{n}", tenant="acme", prompt_tokens=n, completion_tokens=1)


async def test_every_record_taken_survives_kill_9_and_numbering_goes_on(tmp_path: Path) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WRITER, str(tmp_path), stdout=asyncio.subprocess.PIPE
    )
    assert child.stdout is not None
    said = 0
    try:
        while said < 20_000:  # several segments of 64 KiB
            said = int(await asyncio.wait_for(child.stdout.readline(), 30))
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    journal = Journal(tmp_path, segment_bytes=1 << 16)
    try:
        assert journal.seq >= said
        records = journal.records_after(0, 10**6)
        # each taken, once, in order, whole
        assert [r.seq for r in records] == list(range(1, journal.seq + 1))
        assert all(r.request_id == f"r{r.seq}" and r.prompt_tokens == r.seq for r in records)
        assert len({r.id for r in records}) == len(records)
        assert journal.append(_record(0)) == journal.seq == records[-1].seq + 1
    finally:
        journal.close()


def test_a_frame_cut_short_is_the_end_and_appends_go_on_past_it(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    for n in range(1, 11):
        journal.append(_record(n))
    journal.close()
    (segment,) = sorted(tmp_path.glob("*.seg"))
    ends = [end for end, _ in read_frames(segment)]
    data = bytearray(segment.read_bytes())
    data[ends[8] + 9] ^= 0xFF  # the tenth record's bytes, as a crash may leave them
    segment.write_bytes(bytes(data))
    journal = Journal(tmp_path)
    try:
        assert journal.seq == 9
        assert journal.append(_record(10)) == 10
        journal.flush()
        assert [r.prompt_tokens for r in journal.records_after(0, 100)] == list(range(1, 11))
    finally:
        journal.close()


def test_only_flushed_records_ship_and_acknowledged_segments_go(tmp_path: Path) -> None:
    journal = Journal(tmp_path, segment_bytes=1 << 12)
    try:
        for n in range(1, 201):
            journal.append(_record(n))
        assert journal.records_after(0, 1000) == []  # nothing flushed yet
        journal.flush()
        assert len(journal.records_after(0, 1000)) == 200
        assert [r.seq for r in journal.records_after(150, 10)] == list(range(151, 161))
        segments = len(list(tmp_path.glob("*.seg")))
        journal.ack(120)
        journal._prune()
        assert len(list(tmp_path.glob("*.seg"))) < segments
        assert journal.records_after(120, 1000)[0].seq == 121  # nothing after 120 went
    finally:
        journal.close()
    again = Journal(tmp_path, segment_bytes=1 << 12)
    try:  # after a restart, what was not acknowledged is still there to send
        assert again.acked == 120
        assert [r.seq for r in again.records_after(again.acked, 1000)] == list(range(121, 201))
    finally:
        again.close()


def test_numbering_never_goes_back_past_what_was_acknowledged_after_a_crash(
    tmp_path: Path,
) -> None:
    """`acked` reaches the disk once a second at most: a segment goes only once it is there,
    so that a journal reopened after a crash numbers on past every record sent."""
    journal = Journal(tmp_path, segment_bytes=1 << 12)
    for n in range(1, 201):
        journal.append(_record(n))
    journal.flush()
    journal.ack(100)
    journal._prune()  # written: the first in a second
    journal.ack(200)
    journal._prune()  # within the second: not written, and nothing past 100 deleted
    again = Journal(tmp_path, segment_bytes=1 << 12)  # the first never closed: a crash
    try:
        assert again.acked == 100
        assert again.seq == 200
        assert [r.seq for r in again.records_after(100, 1000)] == list(range(101, 201))
        assert again.append(_record(0)) == 201
    finally:
        again.close()
        journal.close()
