"""Snapshot deltas: what the control plane sends an agent that holds the previous revision.

`diff` is the control plane's side, once per region and revision; `apply` is the agent's.
The keyed lists change element by element, kept in order of their key (the order the
compiler writes them in); every other field is replaced whole when it changed. `peer_load`
rides with every delta, as with every snapshot. The agent checks the result against the
delta's digest, so a delta can never leave it with a state the full snapshot would not give:
where they differ, it asks for the full snapshot (Resync).
"""

from __future__ import annotations

from typing import Any

from meridian_pb.fleet.v1 import fleet_pb2 as pb

KEYED = {
    "models": "name",
    "deployments": "name",
    "workers": "id",
    "routes": "model",
    "tenants": "name",
    "trusted": "region",
    "tiered": "name",
    "adapters": "name",
}
NOT_DIFFED = ("revision", "digest")
ALWAYS = ("peer_load",)  # advisory and fresh with every message


def diff(old: pb.Snapshot, new: pb.Snapshot) -> pb.SnapshotDelta:
    """The delta from `old` to `new` (its base and result digests are left to the caller)."""
    delta = pb.SnapshotDelta(base_revision=old.revision, revision=new.revision)
    for field in pb.Snapshot.DESCRIPTOR.fields:
        name = field.name
        if name in NOT_DIFFED:
            continue
        if name in KEYED:
            key = KEYED[name]
            before = {getattr(e, key): e for e in getattr(old, name)}
            after = [(getattr(e, key), e) for e in getattr(new, name)]
            keys = {k for k, _ in after}
            changed = [e for k, e in after if k not in before or before[k] != e]
            getattr(delta.changes, name).extend(changed)
            gone = [k for k in before if k not in keys]
            if gone:
                delta.removed.add(field=name, keys=gone)
        elif name in ALWAYS or not _same(old, new, field):
            delta.replaced.append(name)
            _copy(new, delta.changes, field)
    return delta


def apply(held: pb.Snapshot, delta: pb.SnapshotDelta) -> pb.Snapshot | None:
    """What `held` becomes under `delta`, its digest set to the delta's; None when the delta
    is not for what is held (the caller then asks for the full snapshot). The caller checks
    the result's digest."""
    if held.revision != delta.base_revision or held.digest != delta.base_digest:
        return None
    new = pb.Snapshot()
    new.CopyFrom(held)
    new.revision, new.digest = delta.revision, delta.digest
    fields = pb.Snapshot.DESCRIPTOR.fields_by_name
    for name in delta.replaced:
        if name not in fields or name in NOT_DIFFED:
            return None  # from a newer control plane: the full snapshot is safe
        _clear(new, name)
        _copy(delta.changes, new, fields[name])
    removed = {r.field: set(r.keys) for r in delta.removed}
    for name, key in KEYED.items():
        upserts = getattr(delta.changes, name)
        if not upserts and name not in removed:
            continue
        gone = removed.get(name, set())
        merged: dict[str, Any] = {
            getattr(e, key): e for e in getattr(new, name) if getattr(e, key) not in gone
        }
        merged.update((getattr(e, key), e) for e in upserts)
        ordered = pb.Snapshot()
        getattr(ordered, name).extend(merged[k] for k in sorted(merged))
        _clear(new, name)
        getattr(new, name).extend(getattr(ordered, name))
    return new


def _same(old: pb.Snapshot, new: pb.Snapshot, field: Any) -> bool:
    name = field.name
    if field.message_type is not None and not _repeated(field):
        return old.HasField(name) == new.HasField(name) and getattr(old, name) == getattr(new, name)
    if _repeated(field):
        return list(getattr(old, name)) == list(getattr(new, name))
    return bool(getattr(old, name) == getattr(new, name))


def _copy(source: pb.Snapshot, target: pb.Snapshot, field: Any) -> None:
    name = field.name
    if _repeated(field):
        getattr(target, name).extend(getattr(source, name))
    elif field.message_type is not None:
        if source.HasField(name):
            getattr(target, name).CopyFrom(getattr(source, name))
    else:
        setattr(target, name, getattr(source, name))


def _clear(message: Any, name: str) -> None:
    message.ClearField(name)


def _repeated(field: Any) -> bool:
    return bool(field.is_repeated)
