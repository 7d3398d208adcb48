"""Agents: a bootstrap token exchanged for a node and a credential, and credentials checked."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field
from sqlalchemy import select

from controlplane.db.access_rows import BootstrapTokenRow
from controlplane.db.agent_rows import AgentRow
from controlplane.db.base import utcnow
from controlplane.db.engine import Database
from controlplane.db.fleet_rows import NodeRow, RegionRow
from controlplane.errors import (
    ExpiredBootstrapToken,
    InvalidBootstrapToken,
    InvalidCredential,
    RevokedBootstrapToken,
    WrongRegion,
)
from controlplane.schemas.common import Name, Spec
from controlplane.schemas.fleet import Gpu, NodeSpec
from controlplane.services.fleet_kinds import NODE
from controlplane.services.placements import commit
from controlplane.services.secrets import hash_secret, new_name, new_secret
from controlplane.services.unit import UnitOfWork

HOSTNAME = r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$"


class AgentRegistration(Spec):
    """What an agent says of itself when it registers."""

    region: Name
    node: Name | None = None
    hostname: Annotated[str, Field(pattern=HOSTNAME)]
    gpus: list[Gpu] = Field(default_factory=list, max_length=64)
    agent_version: Annotated[str, Field(max_length=64)] = ""


@dataclass(frozen=True)
class Registration:
    agent: str
    credential: str
    region: str
    node: str
    revision: int | None  # set when registering changed the fleet (a node was created)


@dataclass(frozen=True)
class AgentIdentity:
    agent: str
    node: str
    node_id: int
    region: str


async def register(db: Database, token: str, given: AgentRegistration) -> Registration:
    """Claim (or create) a node of the token's region and issue a fresh credential for it."""
    async with db.sessions() as session, session.begin():
        found = await session.scalar(
            select(BootstrapTokenRow).where(BootstrapTokenRow.token_hash == hash_secret(token))
        )
        if found is None:
            raise InvalidBootstrapToken("no such bootstrap token")
        if found.revoked_at is not None:
            raise RevokedBootstrapToken(
                f"bootstrap token {found.name} was revoked at {found.revoked_at.isoformat()}"
            )
        if found.expires_at <= utcnow():
            raise ExpiredBootstrapToken(
                f"bootstrap token {found.name} expired at {found.expires_at.isoformat()}"
            )
        region: RegionRow = found.region
        if given.region != region.name:
            raise WrongRegion(
                f"this bootstrap token is for region {region.name!r}, not {given.region!r}",
                region=given.region,
            )
        uow = UnitOfWork(session, f"bootstrap-token:{found.name}")
        pool = found.pool.name if found.pool is not None else None
        node = await _claim_node(uow, region, given, pool)
        agent = await session.scalar(select(AgentRow).where(AgentRow.node_id == node.id))
        secret = new_secret("ma")
        if agent is None:
            agent = AgentRow(name=new_name("agent"), node=node, version=1)
            session.add(agent)
        else:
            agent.version += 1
            agent.updated_at = utcnow()
        agent.credential_hash = secret.digest
        agent.agent_version = given.agent_version
        agent.registered_with = found.name
        revision = await commit(uow)
        return Registration(agent.name, secret.value, region.name, node.name, revision)


async def _claim_node(
    uow: UnitOfWork, region: RegionRow, given: AgentRegistration, pool: str | None
) -> NodeRow:
    """The node it names, else an unclaimed one of its hostname, else a new one (in the
    token's pool, if it has one)."""
    if given.node is not None:
        node = await uow.find(NodeRow, given.node, lock=True)
        if node is not None:
            if node.region_id != region.id:
                raise WrongRegion(
                    f"node {node.name!r} is in region {node.region.name!r}, not {region.name!r}",
                    node=node.name,
                )
            return await _learn_gpus(uow, node, given)
        return await _create_node(uow, given.node, region, given, pool)
    claimed = select(AgentRow.node_id)
    unclaimed = await uow.session.scalar(
        select(NodeRow)
        .where(
            NodeRow.region_id == region.id,
            NodeRow.hostname == given.hostname,
            NodeRow.id.not_in(claimed),
        )
        .order_by(NodeRow.name)
        .limit(1)
        .with_for_update(of=NodeRow)
    )
    if unclaimed is not None:
        return await _learn_gpus(uow, unclaimed, given)
    return await _create_node(
        uow, await _free_name(uow, region.name, given.hostname), region, given, pool
    )


async def _learn_gpus(uow: UnitOfWork, node: NodeRow, given: AgentRegistration) -> NodeRow:
    """A node declared without GPUs takes the ones its agent found."""
    if node.gpus or not given.gpus:
        return node
    spec = NodeSpec.model_validate({**NODE.doc(node), "gpus": given.gpus})
    await NODE.update(uow, node, spec)
    return node


async def _create_node(
    uow: UnitOfWork, name: str, region: RegionRow, given: AgentRegistration, pool: str | None
) -> NodeRow:
    spec = NodeSpec(region=region.name, hostname=given.hostname, gpus=given.gpus, pool=pool)
    row, _ = await NODE.create(uow, name, spec)
    return row


async def _free_name(uow: UnitOfWork, region: str, hostname: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9-]+", "-", f"{region}-{hostname}").strip("-")[:56]
    name, n = stem, 1
    while await uow.find(NodeRow, name) is not None:
        n += 1
        name = f"{stem}-{n}"
    return name


async def authenticate(db: Database, credential: str) -> AgentIdentity:
    async with db.sessions() as session:
        agent = await session.scalar(
            select(AgentRow).where(AgentRow.credential_hash == hash_secret(credential))
        )
        if agent is None:
            raise InvalidCredential("no agent has this credential; register again")
        node: NodeRow = agent.node
        return AgentIdentity(agent.name, node.name, node.id, node.region.name)
