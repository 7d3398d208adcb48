"""Tenants' files and batches (the OpenAI Files and Batches API): a file's bytes are in the
object store, its record here; a batch, and each of its lines with its state and answer,
here. Neither is fleet configuration: they bump no revision and go through no rollout."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db.base import Base


class FileRow(Base):
    """A tenant's uploaded file; its bytes are the object store's, under `object_key`."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # file-<hex>
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32))  # batch | batch_output
    bytes: Mapped[int] = mapped_column(BigInteger)
    object_key: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class BatchRow(Base):
    """A batch: its input file's lines run as `batch`-class requests wherever the tenant's
    residency allows, and what came of them."""

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # batch_<hex>
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[str] = mapped_column(String(40))
    completion_window: Mapped[str] = mapped_column(String(8))
    # validating | in_progress | finalizing | completed | failed | expired | cancelling | cancelled
    status: Mapped[str] = mapped_column(String(16), index=True)
    total: Mapped[int] = mapped_column(Integer, default=0)
    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    output_file_id: Mapped[str | None] = mapped_column(String(40))
    error_file_id: Mapped[str | None] = mapped_column(String(40))
    errors: Mapped[list[Any] | None] = mapped_column(JSONB)  # why it failed validation
    meta: Mapped[dict[str, str] | None] = mapped_column(JSONB)  # the caller's `metadata`
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    in_progress_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finalizing_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    failed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancelling_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancelled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class BatchLineRow(Base):
    """One line of a batch: its request, where it runs, and its answer, recorded once."""

    __tablename__ = "batch_lines"
    __table_args__ = (
        Index(
            "ix_batch_lines_open",
            "batch_id",
            "line",
            postgresql_where=text("state IN ('pending', 'running')"),
        ),
    )

    batch_id: Mapped[str] = mapped_column(
        ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True
    )
    line: Mapped[int] = mapped_column(Integer, primary_key=True)  # from 0, as in the file
    custom_id: Mapped[str] = mapped_column(String(512))
    model: Mapped[str] = mapped_column(String(255))  # what its body asks for
    body: Mapped[bytes] = mapped_column(LargeBinary)  # the request's body, as the file gave it
    # pending | running (sent to `region`, until `lease_until`) | done | dropped (never run)
    state: Mapped[str] = mapped_column(String(8), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # sent; fences its answer
    failures: Mapped[int] = mapped_column(Integer, default=0)  # regions that failed it (5xx)
    region: Mapped[str | None] = mapped_column(String(63))
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    status_code: Mapped[int | None] = mapped_column(Integer)
    request_id: Mapped[str | None] = mapped_column(String(128))
    answer: Mapped[bytes | None] = mapped_column(LargeBinary)  # the body, as the engine gave it
    error: Mapped[str | None] = mapped_column(Text)  # why it failed, where it did
    answered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class BatchSignerRow(Base):
    """A seed stored in clear before keys were sealed: the control plane seals it into
    signing_keys at start (its key for batch lines) and deletes this row."""

    __tablename__ = "batch_signer"
    __table_args__ = (CheckConstraint("id = 1", name="singleton"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, default=1)
    seed: Mapped[bytes] = mapped_column(LargeBinary)
