"""What an agent keeps on disk: its identity, the last good snapshot, its models' canaries
(agents/quality/prober.py) and the operator token it made itself when given none, written
atomically.

A write goes to a temporary file in the same directory, is flushed to the disk, and then
renamed over the old file, so a crash leaves either the old snapshot or the new one, never
half of one. The credential file is readable by its owner only.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from google.protobuf.message import DecodeError
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.content import digest

from agents.quality.canary import Canary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Identity:
    agent_id: str
    region: str
    node: str
    credential: str


class Store:
    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir
        self.snapshot_path = data_dir / "snapshot.pb"
        self.identity_path = data_dir / "identity.json"
        self.canaries_path = data_dir / "canaries.json"
        self.operator_token_path = data_dir / "operator-token"

    def prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def operator_token(self) -> str:
        """The token that guards /agent/* when the settings give none: made once, kept
        readable by its owner only, the same after a restart."""
        try:
            token = self.operator_token_path.read_text().strip()
        except FileNotFoundError:
            token = ""
        if len(token) < 16:
            self.prepare()
            token = secrets.token_urlsafe(32)
            _write_atomically(self.operator_token_path, token.encode() + b"\n", mode=0o600)
            log.info("the operator token for /agent/* is in %s", self.operator_token_path)
        return token

    def load_snapshot(self) -> pb.Snapshot | None:
        try:
            data = self.snapshot_path.read_bytes()
        except FileNotFoundError:
            return None
        snapshot = pb.Snapshot()
        try:
            snapshot.ParseFromString(data)
            whole = bool(snapshot.digest) and digest(snapshot) == snapshot.digest
        except DecodeError:
            whole = False
        if not whole:  # cut short, or not a snapshot: the control plane's next one is awaited
            log.error("%s is not a whole snapshot; setting it aside", self.snapshot_path)
            self.snapshot_path.replace(self.snapshot_path.with_suffix(".corrupt"))
            return None
        return snapshot

    def save_snapshot(self, snapshot: pb.Snapshot) -> None:
        _write_atomically(self.snapshot_path, snapshot.SerializeToString(), mode=0o600)

    def load_identity(self) -> Identity | None:
        try:
            document = json.loads(self.identity_path.read_text())
            return Identity(**document)
        except FileNotFoundError:
            return None
        except (ValueError, TypeError):
            log.error("%s is unreadable; the agent will register again", self.identity_path)
            return None

    def save_identity(self, identity: Identity) -> None:
        data = json.dumps(asdict(identity), indent=2).encode()
        _write_atomically(self.identity_path, data, mode=0o600)

    def load_canaries(self) -> dict[str, list[Canary]]:
        """The canaries made for each model; none when the file is missing or unreadable
        (they are made again from the replicas)."""
        try:
            document = json.loads(self.canaries_path.read_text())
            return {model: [Canary(**c) for c in canaries] for model, canaries in document.items()}
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError, AttributeError):
            log.error("%s is unreadable; the canaries will be made again", self.canaries_path)
            return {}

    def save_canaries(self, canaries: dict[str, list[Canary]]) -> None:
        document = {model: [asdict(c) for c in made] for model, made in canaries.items()}
        _write_atomically(self.canaries_path, json.dumps(document, indent=2).encode(), mode=0o600)


def _write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    # a name of its own (mkstemp): two writers of one file never share a temporary
    descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    temporary = Path(name)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
