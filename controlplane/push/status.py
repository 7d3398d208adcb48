"""The control plane's errors as gRPC status: the one place they are mapped."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import grpc

from controlplane.errors import MeridianError

log = logging.getLogger(__name__)

CODE_KEY = "meridian-code"

_BY_HTTP = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.ALREADY_EXISTS,
    412: grpc.StatusCode.FAILED_PRECONDITION,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    428: grpc.StatusCode.FAILED_PRECONDITION,
    503: grpc.StatusCode.UNAVAILABLE,
}


def status_of(error: MeridianError) -> grpc.StatusCode:
    return _BY_HTTP.get(error.status, grpc.StatusCode.INTERNAL)


@contextlib.asynccontextmanager
async def guarded(context: grpc.aio.ServicerContext[object, object]) -> AsyncIterator[None]:
    """End the call with the error's status and stable code in the trailing metadata."""
    try:
        yield
    except MeridianError as exc:
        await context.abort(status_of(exc), exc.detail, trailing_metadata=((CODE_KEY, exc.code),))
    except grpc.aio.AbortError:
        raise
    except Exception:
        log.exception("a Fleet call failed")
        await context.abort(
            grpc.StatusCode.INTERNAL, "internal error", trailing_metadata=((CODE_KEY, "internal"),)
        )
