"""The rollout policy as a kind of the admin API and of fleet documents: one per fleet."""

from __future__ import annotations

from controlplane.db.fleet_rows import RegionRow
from controlplane.db.rollout_rows import RolloutPolicyRow
from controlplane.domain import Role
from controlplane.errors import UnknownReference, ValidationFailed
from controlplane.schemas.rollout import ROLLOUT_POLICY, RolloutPolicyOut, RolloutPolicySpec
from controlplane.services.kind import Kind
from controlplane.services.unit import UnitOfWork


class RolloutPolicyKind(Kind[RolloutPolicyRow]):
    kind, plural, row = "rollout-policy", "rollout-policies", RolloutPolicyRow
    spec, out = RolloutPolicySpec, RolloutPolicyOut
    # `immediate` turns the waves off for every later change: an administrator's decision.
    write_role = Role.ADMIN

    async def validate(self, uow: UnitOfWork, row: RolloutPolicyRow) -> None:
        if row.name != ROLLOUT_POLICY:
            raise ValidationFailed(
                f"a fleet has one rollout policy, named {ROLLOUT_POLICY!r}",
                [{"field": "name", "message": f"must be {ROLLOUT_POLICY!r}"}],
            )
        if row.canary_region is not None and await uow.find(RegionRow, row.canary_region) is None:
            raise UnknownReference("canary_region", "region", row.canary_region)
        for index, wave in enumerate(row.waves):
            for name in wave.get("regions") or []:
                if await uow.find(RegionRow, name) is None:
                    raise UnknownReference(f"waves.{index}.regions", "region", name)


ROLLOUT_POLICY_KIND = RolloutPolicyKind()
