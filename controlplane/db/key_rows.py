"""Rows of keys: the Ed25519 keys that sign escalated requests and batch lines, sealed."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, ForeignKey, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db.base import Base, utcnow


class SigningKeyRow(Base):
    """One signing key of a region (or, `region_id` null, of the control plane). Its seed is
    sealed (services/sealing/sealer.py): only the wrapped data key, the nonce and the
    ciphertext are here. `state`: published (peers accept it; its owner does not sign with it
    yet), signing, retiring (peers still accept it until `retire_after`)."""

    __tablename__ = "signing_keys"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    region_id: Mapped[int | None] = mapped_column(
        ForeignKey("regions.id", ondelete="CASCADE"), index=True
    )
    kid: Mapped[str] = mapped_column(String(16), unique=True)
    public_key: Mapped[bytes] = mapped_column(LargeBinary(32))
    state: Mapped[str] = mapped_column(String(16))
    kek_id: Mapped[str] = mapped_column(Text)
    wrapped_key: Mapped[bytes] = mapped_column(LargeBinary)
    nonce: Mapped[bytes] = mapped_column(LargeBinary(12))
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    state_revision: Mapped[int | None] = mapped_column(BigInteger)  # of its last change
    signs_from: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    retire_after: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
