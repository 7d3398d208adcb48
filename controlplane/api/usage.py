"""The usage ledger's reports: sums by bucket of time and group, as OpenAI's organization
usage API shapes them, and the raw records of a period as JSON lines or CSV."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from controlplane.api.deps import CurrentPrincipal, ServicesDep, allowed
from controlplane.domain import Role
from controlplane.errors import ValidationFailed
from controlplane.services.auth import Principal
from controlplane.services.kind import parse
from controlplane.services.usage.reconcile import reconcile
from controlplane.services.usage.report import EPOCH_MAX, UsageQuery, records, usage_report

router = APIRouter(tags=["usage"])
Listed = Annotated[str | None, Query(max_length=4096, description="comma-separated")]
Time = Annotated[int | None, Query(ge=0, le=EPOCH_MAX)]
GROUPED = "comma-separated: tenant, api_key, model, region, service_class"


def _query(
    start_time: int | None,
    end_time: int | None,
    bucket_width: str | None,
    time_zone: str | None,
    group_by: str | None,
    tenants: str | None,
    api_keys: str | None,
    models: str | None,
    regions: str | None,
    limit: int | None = None,
    page: int | None = None,
) -> UsageQuery:
    given: dict[str, Any] = {"start_time": start_time, "end_time": end_time, "limit": limit,
                             "page": page}  # fmt: skip
    if bucket_width is not None:
        given["bucket_width"] = bucket_width
    if time_zone is not None:
        given["time_zone"] = time_zone
    for field, value in (("group_by", group_by), ("tenants", tenants), ("api_keys", api_keys),
                         ("models", models), ("regions", regions)):  # fmt: skip
        if value:
            given[field] = [v.strip() for v in value.split(",") if v.strip()]
    query: UsageQuery = parse(UsageQuery, given)
    return query


def own(query: UsageQuery, who: Principal) -> UsageQuery:
    """A tenant admin's query kept to its tenant, whatever tenants it named."""
    if who.tenant is None:
        return query
    return query.model_copy(update={"tenants": [who.tenant]})


@router.get("/v1/usage", summary="Usage and its cost, summed by bucket of time and by group",
            **allowed(Role.VIEWER, tenant_scoped=True))  # fmt: skip
async def usage(
    who: CurrentPrincipal,
    services: ServicesDep,
    start_time: Annotated[int | None, Query(ge=0, le=EPOCH_MAX, description="Unix seconds")] = None,
    end_time: Time = None,
    bucket_width: Annotated[str | None, Query(max_length=8, description="1h, 1d or 1mo")] = None,
    time_zone: Annotated[str | None, Query(max_length=64)] = None,
    group_by: Annotated[str | None, Query(max_length=256, description=GROUPED)] = None,
    tenants: Listed = None,
    api_keys: Listed = None,
    models: Listed = None,
    regions: Listed = None,
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
    page: Time = None,
) -> dict[str, Any]:
    query = _query(start_time, end_time, bucket_width, time_zone, group_by, tenants, api_keys,
                   models, regions, limit, page)  # fmt: skip
    return await usage_report(services.db, own(query, who), services.settings.currency)


@router.get("/v1/usage/records", summary="The raw usage records of a period, oldest first",
            response_class=StreamingResponse,
            **allowed(Role.VIEWER, tenant_scoped=True))  # fmt: skip
async def usage_records(
    who: CurrentPrincipal,
    services: ServicesDep,
    start_time: Annotated[int | None, Query(ge=0, le=EPOCH_MAX, description="Unix seconds")] = None,
    end_time: Time = None,
    tenants: Listed = None,
    api_keys: Listed = None,
    models: Listed = None,
    regions: Listed = None,
    format: Annotated[Literal["jsonl", "csv"], Query()] = "jsonl",
) -> StreamingResponse:
    query = _query(start_time, end_time, None, None, None, tenants, api_keys, models, regions)
    media = "application/x-ndjson" if format == "jsonl" else "text/csv"
    return StreamingResponse(records(services.db, own(query, who), format), media_type=media)


@router.get("/v1/usage/reconciliation",
            summary="The ledger's tokens per engine against the engines' own counters",
            **allowed(Role.VIEWER))  # fmt: skip
async def reconciliation(
    services: ServicesDep,
    start_time: Annotated[
        int | None,
        Query(ge=0, le=EPOCH_MAX, description="Unix seconds; default: a day before end_time"),
    ] = None,
    end_time: Annotated[
        int | None, Query(ge=0, le=EPOCH_MAX, description="Unix seconds; default: now")
    ] = None,
) -> dict[str, Any]:
    """Per engine metered within the period: the prompt and generation tokens it counted
    itself, the ledger's sums of its served records over the same intervals, and the drift
    (docs/usage.md, "Reconciliation")."""
    end = datetime.fromtimestamp(end_time, UTC) if end_time is not None else datetime.now(UTC)
    start = (datetime.fromtimestamp(start_time, UTC) if start_time is not None
             else end - timedelta(days=1))  # fmt: skip
    if start >= end:
        raise ValidationFailed("start_time must be before end_time", [
            {"loc": ["query", "start_time"], "msg": "must be before end_time"}])  # fmt: skip
    return {"start_time": int(start.timestamp()), "end_time": int(end.timestamp()),
            "engines": await reconcile(services.db, start, end)}  # fmt: skip
