"""The spec of a LoRA adapter: a tenant's fine-tune of a model (issue 45)."""

from __future__ import annotations

from typing import Annotated, Self

from meridian_pb.fleet.v1.adapters import DIGEST_PATTERN, source_problem
from pydantic import Field, StringConstraints, model_validator

from controlplane.schemas.common import Meta, Name, Spec, Unique

MAX_RANK = 1024
MAX_TENANTS = 10_000


class AdapterSpec(Spec):
    base_model: Name = Field(
        description="the model it adapts: its engines load it; a request names it "
        "`base_model:adapter` or the adapter's name alone"
    )
    source: Annotated[str, StringConstraints(min_length=1, max_length=1024)] = Field(
        description="its directory as PEFT saves it: an absolute path on the nodes, or an "
        "object store's URI (s3://bucket/key), fetched to each node's cache"
    )
    digest: Annotated[str, StringConstraints(pattern=DIGEST_PATTERN)] | None = Field(
        default=None,
        description="sha256: and the SHA-256 of its files' manifest (meridian_pb.fleet.v1."
        "adapters.digest_of), checked on every fetch; required for an object store's source. "
        "A new digest is a new version of the adapter",
    )
    rank: int = Field(ge=1, le=MAX_RANK, description="its LoRA rank")
    tenants: Annotated[list[Name], Unique] = Field(
        default_factory=list,
        max_length=MAX_TENANTS,
        description="the tenants that may use it; to any other it does not exist",
    )

    @model_validator(mode="after")
    def _source(self) -> Self:
        problem = source_problem(self.source, self.digest)
        if problem is not None:
            raise ValueError(problem)
        return self


class AdapterOut(Meta, AdapterSpec):
    pass
