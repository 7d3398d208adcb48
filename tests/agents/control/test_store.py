"""The agent's copy of its last good snapshot: kept whole, or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.content import digest

from agents.control.store import Store


def _snapshot() -> pb.Snapshot:
    snapshot = pb.Snapshot(revision=7, region=pb.RegionInfo(name="us-east"))
    snapshot.models.add(name="llama")
    snapshot.deployments.add(name="llama-us-east", model="llama")
    snapshot.digest = digest(snapshot)
    return snapshot


def test_a_whole_snapshot_comes_back_as_it_was(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.prepare()
    store.save_snapshot(_snapshot())
    assert store.load_snapshot() == _snapshot()


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.9])
def test_a_snapshot_cut_short_is_set_aside_even_where_it_still_parses(
    tmp_path: Path, keep: float
) -> None:
    store = Store(tmp_path)
    store.prepare()
    store.save_snapshot(_snapshot())
    data = store.snapshot_path.read_bytes()
    store.snapshot_path.write_bytes(data[: int(len(data) * keep)])
    assert store.load_snapshot() is None
    assert not store.snapshot_path.exists()
    assert store.snapshot_path.with_suffix(".corrupt").exists()  # kept, for whoever looks


def test_a_message_cut_at_a_field_boundary_parses_and_is_still_refused(tmp_path: Path) -> None:
    whole = _snapshot()
    cut = pb.Snapshot()
    cut.CopyFrom(whole)
    del cut.deployments[:]  # what a file cut before its last field holds: valid protobuf
    store = Store(tmp_path)
    store.prepare()
    store.snapshot_path.write_bytes(cut.SerializeToString())
    assert store.load_snapshot() is None
