"""The fleet's kinds: clouds, regions, node pools, nodes, models, deployments, routing,
fallback and tiered routes."""

from __future__ import annotations

from typing import Any, cast

from meridian_pb.fleet.v1.prices import Pricing, past_kept
from sqlalchemy import inspect, select

from controlplane.db.agent_rows import ModelQualityRow, RegionLoadRow
from controlplane.db.base import utcnow
from controlplane.db.fleet_rows import (
    CloudRow,
    DeploymentRow,
    FallbackPeerRow,
    FallbackRuleRow,
    ModelRow,
    NodePoolRow,
    NodeRow,
    RegionRow,
    RoutingPolicyRow,
    TieredRouteRow,
)
from controlplane.errors import InvalidFallbackChain, PriceInEffect, ValidationFailed
from controlplane.schemas.common import Spec
from controlplane.schemas.fleet import (
    CloudOut,
    CloudSpec,
    DeploymentOut,
    DeploymentSpec,
    FallbackRuleOut,
    FallbackRuleSpec,
    ModelOut,
    ModelSpec,
    NodeOut,
    NodePoolOut,
    NodePoolSpec,
    NodeSpec,
    RegionOut,
    RegionSpec,
    RoutingPolicyOut,
    RoutingPolicySpec,
    TieredRouteOut,
    TieredRouteSpec,
)
from controlplane.services.adapter_kind import name_taken
from controlplane.services.kind import Dependent, Kind
from controlplane.services.sealing.signing import make_key
from controlplane.services.unit import Doc, UnitOfWork
from controlplane.snapshot.keys import SIGNING


class CloudKind(Kind[CloudRow]):
    kind, plural, row, spec, out = "cloud", "clouds", CloudRow, CloudSpec, CloudOut


class RegionKind(Kind[RegionRow]):
    kind, plural, row, spec, out = "region", "regions", RegionRow, RegionSpec, RegionOut
    refs = {"cloud": (CloudRow, "cloud")}

    async def created(self, uow: UnitOfWork, row: RegionRow) -> None:
        """Its signing key, sealed: its agents sign what they escalate with it from the
        first snapshot they get."""
        if uow.sealer is None:
            raise RuntimeError("a region is made only where stored secrets can be sealed")
        await make_key(uow, uow.sealer, row, SIGNING)

    def status(self, row: RegionRow) -> Doc:
        # Only what is loaded already: a region just created has no rollup, and reading an
        # unloaded relationship here would be I/O outside the session's async context.
        load = inspect(row).attrs.load.loaded_value
        if not isinstance(load, RegionLoadRow):
            load = None
        return {
            "health": load.health if load is not None else "unknown",
            "load": load.data if load is not None else None,
        }

    async def dependents(self, uow: UnitOfWork, row: RegionRow) -> list[Dependent]:
        found = await super().dependents(uow, row)
        rules = (
            (
                await uow.session.execute(
                    select(FallbackRuleRow)
                    .join(FallbackPeerRow, FallbackPeerRow.rule_id == FallbackRuleRow.id)
                    .where(FallbackPeerRow.region_id == row.id, FallbackRuleRow.region_id != row.id)
                    .order_by(FallbackRuleRow.name)
                )
            )
            .unique()
            .scalars()
        )
        found.extend(_drop_peer(rule, row) for rule in rules)
        return found


def _drop_peer(rule: FallbackRuleRow, region: RegionRow) -> Dependent:
    """A cascade takes a deleted region out of other regions' chains (or ends an empty one)."""

    async def remove(uow: UnitOfWork) -> None:
        current = FALLBACK.doc(rule)
        peers = [p for p in current["peers"] if p != region.name]
        if peers:
            await FALLBACK.update(
                uow, rule, FallbackRuleSpec.model_validate({**current, "peers": peers})
            )
        else:
            await FALLBACK.delete(uow, rule, cascade=True)

    return Dependent(f"fallback-rule {rule.name} (peer)", remove)


GROUP_PARTS = {"gcp": "project/zone/manager", "azure": "subscription/resource-group/scale-set"}


def group_problem(provider: str, group: str) -> str | None:
    """Why a pool's `group` cannot be its cloud's (None: it can)."""
    if provider == "aws":
        region, _, name = group.partition("/")
        return None if region and name else f"an aws group is aws-region/group-name, not {group!r}"
    if provider in GROUP_PARTS:
        parts = group.split("/")
        if len(parts) != 3 or not all(parts):
            return f"a {provider} group is {GROUP_PARTS[provider]}, not {group!r}"
        return None
    return (f"no capacity provider for clouds of provider {provider!r} (aws, gcp and azure "
            "have one): leave group unset")  # fmt: skip


class NodePoolKind(Kind[NodePoolRow]):
    kind, plural, row, spec, out = (
        "node-pool",
        "node-pools",
        NodePoolRow,
        NodePoolSpec,
        NodePoolOut,
    )
    refs = {"cloud": (CloudRow, "cloud"), "region": (RegionRow, "region")}

    async def validate(self, uow: UnitOfWork, row: NodePoolRow) -> None:
        if row.region.cloud.name != row.cloud.name:
            message = (f"region {row.region.name!r} is on cloud {row.region.cloud.name!r}, "
                       f"not {row.cloud.name!r}")  # fmt: skip
            raise ValidationFailed(message, [{"field": "region", "message": message}])
        if row.group is not None:
            problem = group_problem(row.cloud.provider, row.group)
            if problem is not None:
                raise ValidationFailed(problem, [{"field": "group", "message": problem}])


class NodeKind(Kind[NodeRow]):
    kind, plural, row, spec, out = "node", "nodes", NodeRow, NodeSpec, NodeOut
    refs = {"region": (RegionRow, "region"), "pool": (NodePoolRow, "node pool")}

    async def validate(self, uow: UnitOfWork, row: NodeRow) -> None:
        if row.pool is not None and row.pool.region.name != row.region.name:
            message = (f"node pool {row.pool.name!r} is in region {row.pool.region.name!r}, "
                       f"not {row.region.name!r}")  # fmt: skip
            raise ValidationFailed(message, [{"field": "pool", "message": message}])

    def status(self, row: NodeRow) -> Doc:
        return {
            "health": row.health or "unknown",
            "health_changed_at": row.health_changed_at,
            "last_heartbeat_at": row.last_heartbeat_at,
            "desired_revision": row.desired_revision,
            "applied_revision": row.applied_revision,
            "last_nack_reason": row.last_nack_reason,
        }


class ModelKind(Kind[ModelRow]):
    kind, plural, row, spec, out = "model", "models", ModelRow, ModelSpec, ModelOut

    async def assign(self, uow: UnitOfWork, row: ModelRow, spec: Spec) -> None:
        await super().assign(uow, row, spec)
        assert isinstance(spec, ModelSpec)
        row.pricing = None if spec.pricing is None else spec.pricing.model_dump(mode="json")

    async def update(self, uow: UnitOfWork, row: ModelRow, spec: Spec) -> bool:
        """Prices in effect stay as they were: usage was recorded at them."""
        assert isinstance(spec, ModelSpec)
        before = None if row.pricing is None else Pricing.model_validate(row.pricing)
        why = past_kept(before, spec.pricing, utcnow())
        if why is not None:
            raise PriceInEffect(why)
        return await super().update(uow, row, spec)

    async def validate(self, uow: UnitOfWork, row: ModelRow) -> None:
        await name_taken(uow, row.name, ModelRow)

    def status(self, row: ModelRow) -> Doc:
        # Only what is loaded already (as for a region's load): none for a model just made.
        quality = inspect(row).attrs.quality.loaded_value
        if not isinstance(quality, ModelQualityRow):
            return {}
        return {"quality": quality.data | {"updated_at": quality.updated_at.isoformat()}}


class DeploymentKind(Kind[DeploymentRow]):
    kind, plural, row, spec, out = (
        "deployment",
        "deployments",
        DeploymentRow,
        DeploymentSpec,
        DeploymentOut,
    )
    refs = {"model": (ModelRow, "model"), "region": (RegionRow, "region")}


class RoutingPolicyKind(Kind[RoutingPolicyRow]):
    kind, plural, row, spec, out = (
        "routing-policy",
        "routing-policies",
        RoutingPolicyRow,
        RoutingPolicySpec,
        RoutingPolicyOut,
    )
    refs = {"model": (ModelRow, "model"), "region": (RegionRow, "region")}


class FallbackRuleKind(Kind[FallbackRuleRow]):
    kind, plural, row, spec, out = (
        "fallback-rule",
        "fallback-rules",
        FallbackRuleRow,
        FallbackRuleSpec,
        FallbackRuleOut,
    )
    refs = {"region": (RegionRow, "region"), "model": (ModelRow, "model")}

    def doc(self, row: FallbackRuleRow) -> Doc:
        raw: dict[str, Any] = {
            "region": row.region.name,
            "model": row.model.name if row.model else None,
            "tenant_tier": row.tenant_tier,
            "peers": [peer.region.name for peer in row.peers],
            "triggers": row.triggers,
            "thresholds": row.thresholds,
            "classes": row.classes,
        }
        return self.spec.model_validate(raw).model_dump(mode="json")

    async def validate(self, uow: UnitOfWork, row: FallbackRuleRow) -> None:
        """Rules of one scope (region, model, tenant tier) name each class at most once, so a
        request's class picks one rule."""
        model, tier = FallbackRuleRow.model_id, FallbackRuleRow.tenant_tier
        query = select(FallbackRuleRow).where(
            FallbackRuleRow.region_id == row.region.id,
            model.is_(None) if row.model is None else model == row.model.id,
            tier.is_(None) if row.tenant_tier is None else tier == row.tenant_tier,
            FallbackRuleRow.name != row.name,
        )
        for other in (await uow.session.execute(query)).unique().scalars():
            shared = sorted(set(other.classes) & set(row.classes))
            if shared:
                raise InvalidFallbackChain(
                    f"fallback rule {other.name!r} of the same region, model and tenant tier "
                    f"escalates {', '.join(shared)} already",
                    "classes",
                )

    async def assign(self, uow: UnitOfWork, row: FallbackRuleRow, given: Spec) -> None:
        spec = cast(FallbackRuleSpec, given)
        row.region = await uow.ref(RegionRow, "region", spec.region, "region")
        row.model = (
            None if spec.model is None else await uow.ref(ModelRow, "model", spec.model, "model")
        )
        row.tenant_tier = spec.tenant_tier
        row.triggers = [str(t) for t in spec.triggers]
        row.thresholds = spec.thresholds.model_dump()
        row.classes = [str(c) for c in spec.classes]
        regions = []
        for index, peer in enumerate(spec.peers):
            if peer == spec.region:
                raise InvalidFallbackChain(
                    f"peers[{index}]: a region cannot fall back to itself ({peer!r})",
                    f"peers.{index}",
                )
            target = await uow.find(RegionRow, peer)
            if target is None:
                raise InvalidFallbackChain(
                    f"peers[{index}]: no region named {peer!r}", f"peers.{index}"
                )
            regions.append(target)
        if [p.region_id for p in row.peers] == [r.id for r in regions]:
            return
        for index, region in enumerate(regions):  # in place, so positions never collide
            if index < len(row.peers):
                row.peers[index].region = region
            else:
                row.peers.append(FallbackPeerRow(position=index, region=region))
        del row.peers[len(regions) :]


class TieredRouteKind(Kind[TieredRouteRow]):
    kind, plural, row, spec, out = (
        "tiered-route",
        "tiered-routes",
        TieredRouteRow,
        TieredRouteSpec,
        TieredRouteOut,
    )

    async def validate(self, uow: UnitOfWork, row: TieredRouteRow) -> None:
        await name_taken(uow, row.name, TieredRouteRow)
        for index, tier in enumerate(row.tiers):
            await uow.ref(ModelRow, "model", tier, f"tiers.{index}")


CLOUD = CloudKind()
REGION = RegionKind()
NODE_POOL = NodePoolKind()
NODE = NodeKind()
MODEL = ModelKind()
DEPLOYMENT = DeploymentKind()
ROUTING_POLICY = RoutingPolicyKind()
FALLBACK = FallbackRuleKind()
TIERED_ROUTE = TieredRouteKind()
