"""The usage ledger's journal on the agent's disk: every record, kept until the control plane
has acknowledged it, through control-plane outages and agent restarts.

Records go into segment files mapped in memory. An append is a copy into the mapping, no
system call: the request's path does no I/O for it, and what was copied survives the agent's
death (kill -9) in the kernel's page cache. A thread flushes the segments to disk every
`flush_s` (a group commit: fsync of the file, which on Linux writes what its mappings
wrote, and which, unlike Python's msync, lets the event loop run meanwhile) and
pre-allocates the next segment, so that a full disk fails that thread, never a write into
a mapping. Only records flushed are shipped: after a
machine's crash the journal never numbers anew a record the control plane already holds.

A segment is `<n>.seg`, `segment_bytes` long, zero past its last record. A record is framed
as its length and CRC-32 (little-endian u32 each), then its bytes, the length written last:
a frame cut short by a crash reads as the journal's end. After a restart, appends go to a new
segment; what the old ones hold is shipped from there. The journal's id (`id`, made once)
and each record's sequence number make its id (`<journal id>-<seq>`), the key by which the
control plane stores it once however often it is sent. `acked` holds the sequence number
acknowledged through; a segment is deleted once every record in it is.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import secrets
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from meridian_pb.fleet.v1 import fleet_pb2 as pb

log = logging.getLogger(__name__)

FRAME = struct.Struct("<II")  # payload length, CRC-32 of the payload
SEGMENT_BYTES = 8 << 20
FLUSH_S = 0.2
ACKED_EVERY_S = 1.0
MAX_RECORD_BYTES = 64 << 10


class JournalFull(Exception):
    """A record larger than a segment can hold."""


@dataclass(slots=True)
class _Segment:
    number: int
    path: Path
    map: mmap.mmap
    fd: int  # open while mapped: fsync flushes what the mapping wrote
    offset: int = 0
    last_seq: int = 0  # the last record's, 0 while it holds none


def _segment_name(number: int) -> str:
    return f"{number:010d}.seg"


def read_frames(path: Path, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """(offset after it, payload) of each whole frame of a segment from `offset`, in order,
    until its end (a zero length, a frame cut short or a wrong CRC)."""
    with path.open("rb") as f:
        f.seek(offset)
        while len(head := f.read(FRAME.size)) == FRAME.size:
            length, crc = FRAME.unpack(head)
            if length == 0 or length > MAX_RECORD_BYTES:
                return
            payload = f.read(length)
            if len(payload) < length or zlib.crc32(payload) != crc:
                return
            offset += FRAME.size + length
            yield offset, payload


class Journal:
    """Append (the event loop's thread), ship what is flushed, prune what is acknowledged. See
    the module's docstring."""

    def __init__(
        self, directory: Path, segment_bytes: int = SEGMENT_BYTES, flush_s: float = FLUSH_S
    ) -> None:
        self.dir = directory
        self.segment_bytes, self.flush_s = segment_bytes, flush_s
        directory.mkdir(parents=True, exist_ok=True)
        id_path = directory / "id"
        if not id_path.exists():
            _write_atomic(id_path, secrets.token_hex(6))
        self.id = id_path.read_text().strip()
        self.acked = int(_read(directory / "acked") or 0)
        # the segments on disk (number -> the last sequence number in it), recovered
        self._closed: dict[int, int] = {}
        last = self.acked
        for path in sorted(directory.glob("*.seg")):
            number, seq = int(path.stem), 0
            for _, payload in read_frames(path):
                seq = pb.UsageRecord.FromString(payload).seq
            if seq == 0:
                path.unlink()  # a spare never written to
                continue
            self._closed[number] = seq
            last = max(last, seq)
        self.seq = last  # the last sequence number given
        self.flushed = last  # every record through it is on disk
        for spare in directory.glob("*.spare"):
            spare.unlink()
        self._next_number = max(self._closed, default=0) + 1
        self._current = self._segment(None)
        self._spare: tuple[Path, mmap.mmap, int] | None = None
        self._closing: deque[_Segment] = deque()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._acked_file, self._acked_at = self.acked, float("-inf")
        self._cursor = (0, 0, -1)  # where the last record read ended: (segment, offset, seq)
        self.errors = 0  # flushes that failed (a full disk, say)
        self._prune()

    # -- the event loop's side ------------------------------------------------------------

    def append(self, record: pb.UsageRecord) -> int:
        """Numbers the record, frames it into the current segment and returns its sequence
        number. No system call unless a segment is full and no spare is ready."""
        seq = self.seq + 1
        record.seq = seq
        if not record.id:
            record.id = f"{self.id}-{seq}"
        payload = record.SerializeToString()
        size = FRAME.size + len(payload)
        if size > self.segment_bytes or len(payload) > MAX_RECORD_BYTES:
            raise JournalFull(f"a usage record of {len(payload)} bytes is too large")
        segment = self._current
        if segment.offset + size > self.segment_bytes:
            segment = self._roll()
        start = segment.offset
        segment.map[start + FRAME.size : start + size] = payload
        # the length last: a reader never sees a frame whose bytes are not all there
        segment.map[start : start + FRAME.size] = FRAME.pack(len(payload), zlib.crc32(payload))
        segment.offset, segment.last_seq, self.seq = start + size, seq, seq
        return seq

    def _roll(self) -> _Segment:
        old = self._current
        spare, self._spare = self._spare, None
        self._current = self._segment(spare)
        self._closing.append(old)
        self._wake.set()
        return self._current

    def _segment(self, spare: tuple[Path, mmap.mmap, int] | None) -> _Segment:
        """The next segment: the spare the flusher made ready, named, or a new one."""
        number = self._next_number
        self._next_number += 1
        path = self.dir / _segment_name(number)
        if spare is None:
            return _Segment(number, path, *self._mapped(path))
        os.rename(spare[0], path)
        return _Segment(number, path, spare[1], spare[2])

    def ack(self, through: int) -> None:
        """The control plane holds every record through `through`: the flusher prunes."""
        if through > self.acked:
            self.acked = min(through, self.flushed)
            self._wake.set()

    # -- reading what to ship (any thread) -------------------------------------------------

    def records_after(self, after: int, limit: int) -> list[pb.UsageRecord]:
        """Up to `limit` flushed records numbered after `after`, oldest first. Reads the
        segments' files (the page cache holds what the mappings wrote)."""
        found: list[pb.UsageRecord] = []
        upto = self.flushed
        closed = dict(self._closed)
        numbers = sorted({*closed, *(s.number for s in list(self._closing)),
                          self._current.number})  # fmt: skip
        at_number, at_offset, at_seq = self._cursor
        for number in numbers:
            last = closed.get(number)
            if (last is not None and last <= after) or (at_seq == after and number < at_number):
                continue
            offset = at_offset if at_seq == after and number == at_number else 0
            path = self.dir / _segment_name(number)
            with contextlib.suppress(FileNotFoundError):  # pruned meanwhile
                for end, payload in read_frames(path, offset):
                    record = pb.UsageRecord.FromString(payload)
                    if record.seq <= after:
                        continue
                    if record.seq > upto:
                        return found
                    found.append(record)
                    self._cursor = number, end, record.seq
                    if len(found) >= limit:
                        return found
        return found

    # -- the flusher thread ----------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ledger-journal", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Flushes everything and unmaps; the journal takes no more records."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.flush()
        self._acked_at = float("-inf")  # what was acknowledged, on disk now
        self._prune()
        _unmap(self._current.map, self._current.fd)
        if self._current.last_seq == 0:
            self._current.path.unlink(missing_ok=True)
        if self._spare is not None:
            _unmap(self._spare[1], self._spare[2])
            self._spare[0].unlink(missing_ok=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_s)
            self._wake.clear()
            try:
                self.flush()
                if self._spare is None:
                    path = self.dir / f"{secrets.token_hex(4)}.spare"
                    self._spare = path, *self._mapped(path)
                self._prune()
            except OSError as error:  # a full disk, say: tried again, appends go on
                self.errors += 1
                log.error("the usage journal could not flush: %s", error)

    def flush(self) -> None:
        """Every record appended so far, on disk."""
        current = self._current
        seq = self.seq
        while self._closing:
            segment = self._closing[0]
            os.fsync(segment.fd)
            self._closed[segment.number] = segment.last_seq
            if segment is current:  # rolled just now: flushed below, closed next time
                break
            self._closing.popleft()
            _unmap(segment.map, segment.fd)
        os.fsync(current.fd)
        self.flushed = max(self.flushed, seq)

    def _prune(self) -> None:
        acked, now = self.acked, time.monotonic()
        # kept on disk once a second at most: one older after a restart only sends again
        # what the control plane holds already (it stores each once)
        if self._acked_file != acked and now - self._acked_at >= ACKED_EVERY_S:
            _write_atomic(self.dir / "acked", str(acked))
            self._acked_file, self._acked_at = acked, now
        # a segment goes only once `acked` on disk covers it: after a restart the numbering
        # goes on from there at least, and never gives a stored record's number again
        for number, last in list(self._closed.items()):
            if last <= self._acked_file:
                (self.dir / _segment_name(number)).unlink(missing_ok=True)
                del self._closed[number]

    def _mapped(self, path: Path) -> tuple[mmap.mmap, int]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, self.segment_bytes)  # no SIGBUS on a full disk later
            return mmap.mmap(fd, self.segment_bytes), fd
        except OSError:
            os.close(fd)
            raise


def _unmap(mapped: mmap.mmap, fd: int) -> None:
    mapped.close()
    os.close(fd)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
