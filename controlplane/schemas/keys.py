"""Requests about keys: a rotation of a signing key."""

from __future__ import annotations

from typing import Self

from pydantic import Field, StrictBool, model_validator

from controlplane.schemas.common import Name, Spec


class SigningKeyRotation(Spec):
    region: Name | None = Field(
        default=None, description="the region whose key is rotated; unset: control_plane"
    )
    control_plane: StrictBool = Field(
        default=False, description="the control plane's key (it signs the batch lines it sends)"
    )
    immediate: StrictBool = Field(
        default=False,
        description="for a key thought compromised: the new key signs at once and the old ones "
        "are refused everywhere at once (requests in flight that they signed fail); otherwise "
        "the new key is published to every region before it signs, and the old one is "
        "accepted until what it signed has expired",
    )

    @model_validator(mode="after")
    def _one_owner(self) -> Self:
        if (self.region is None) == (not self.control_plane):
            raise ValueError("name a region, or set control_plane (one of them)")
        return self
