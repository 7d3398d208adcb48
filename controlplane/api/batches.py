"""Tenants' files and batches: OpenAI's Files and Batches API, for a tenant's API key (the
unchanged `openai` client's files.create, batches.create, batches.retrieve, files.content
work against it). The agents' ports forward the same paths here."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, Path, Query, Request, Response, UploadFile
from pydantic import Field

from controlplane.api.deps import ServicesDep
from controlplane.errors import MalformedBody
from controlplane.schemas.common import Spec
from controlplane.services.batches import batches, files
from controlplane.services.batches.files import TenantCaller
from controlplane.services.batches.lines import MAX_BYTES

router = APIRouter(tags=["batches"])
TENANT = {"x-meridian-role": "tenant"}  # a tenant's API key, not a principal's token


async def current_tenant(request: Request, services: ServicesDep) -> TenantCaller:
    return await files.tenant_of(services.db, request.headers.get("authorization"))


Tenant = Annotated[TenantCaller, Depends(current_tenant)]
Limit = Annotated[int, Query(ge=1, le=100)]
FileId = Annotated[str, Path(max_length=64)]
BatchId = Annotated[str, Path(max_length=64)]
After = Annotated[str | None, Query(max_length=64)]


class BatchCreate(Spec):
    """A batch, as OpenAI's client asks for one."""

    input_file_id: str = Field(max_length=64, description="a file uploaded for a batch")
    endpoint: str = Field(max_length=64, description="what every line asks, e.g. "
                          "/v1/chat/completions")  # fmt: skip
    completion_window: str = Field(pattern=r"^[1-9][0-9]{0,2}h$", description="1h to 168h")
    metadata: (
        dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None
    ) = Field(default=None, max_length=16)


@router.post("/v1/files", summary="Upload a batch's input file (JSONL, purpose batch)",
             openapi_extra=TENANT)  # fmt: skip
async def upload(
    tenant: Tenant,
    services: ServicesDep,
    file: Annotated[UploadFile, File(json_schema_extra={"maxLength": MAX_BYTES})],
    purpose: Annotated[str, Form(max_length=32)],
) -> dict[str, Any]:
    data = await file.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise MalformedBody(f"the file is over {MAX_BYTES} bytes")
    return await files.upload(services.db, services.store, tenant, file.filename or "", purpose,
                              data)  # fmt: skip


@router.get("/v1/files", summary="The tenant's files", openapi_extra=TENANT)
async def list_files(
    tenant: Tenant,
    services: ServicesDep,
    purpose: Annotated[str | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=files.LIST_LIMIT)] = files.LIST_LIMIT,
    after: After = None,
) -> dict[str, Any]:
    return await files.list_files(services.db, tenant, purpose, limit, after)


@router.get("/v1/files/{file_id}", summary="A file of the tenant's", openapi_extra=TENANT)
async def get_file(file_id: FileId, tenant: Tenant, services: ServicesDep) -> dict[str, Any]:
    return files.file_doc(await files.find_file(services.db, tenant, file_id))


@router.get("/v1/files/{file_id}/content", summary="A file's bytes", openapi_extra=TENANT)
async def file_content(file_id: FileId, tenant: Tenant, services: ServicesDep) -> Response:
    data = await files.content(services.db, services.store, tenant, file_id)
    return Response(data, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}", summary="Delete a file", openapi_extra=TENANT)
async def delete_file(file_id: FileId, tenant: Tenant, services: ServicesDep) -> dict[str, Any]:
    return await files.delete_file(services.db, services.store, tenant, file_id)


@router.post("/v1/batches", summary="A batch of an input file's requests, run as the batch "
             "class wherever the tenant's residency allows", openapi_extra=TENANT)  # fmt: skip
async def create_batch(tenant: Tenant, services: ServicesDep, given: BatchCreate) -> dict[str, Any]:
    return await batches.create(services.db, services.store, tenant,
                                given.model_dump(exclude_none=True))  # fmt: skip


@router.get("/v1/batches", summary="The tenant's batches, newest first", openapi_extra=TENANT)
async def list_batches(
    tenant: Tenant, services: ServicesDep, limit: Limit = 20, after: After = None
) -> dict[str, Any]:
    return await batches.list_batches(services.db, tenant, limit, after)


@router.get("/v1/batches/{batch_id}", summary="A batch, and its progress (request_counts)",
            openapi_extra=TENANT)  # fmt: skip
async def get_batch(batch_id: BatchId, tenant: Tenant, services: ServicesDep) -> dict[str, Any]:
    return await batches.retrieve(services.db, tenant, batch_id)


@router.post("/v1/batches/{batch_id}/cancel", summary="Cancel a batch: no new line is sent",
             openapi_extra=TENANT)  # fmt: skip
async def cancel_batch(batch_id: BatchId, tenant: Tenant, services: ServicesDep) -> dict[str, Any]:
    return await batches.cancel(services.db, tenant, batch_id)
