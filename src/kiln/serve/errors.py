"""The serving errors users see: each carries its HTTP status and gRPC status code name."""

from __future__ import annotations

from kiln.errors import KilnError


class ServeError(KilnError):
    """Base of serving errors; `http_status` and `grpc_code` (a grpc.StatusCode name) say how to answer."""

    http_status: int = 500
    grpc_code: str = "INTERNAL"

    def __init__(self, message: str, *, http_status: int | None = None):
        super().__init__(message)
        if http_status is not None:
            self.http_status = http_status


class BadRequest(ServeError):
    """The request is malformed: unknown or missing tensors, wrong dtype or shape, a bad model name."""

    http_status, grpc_code = 400, "INVALID_ARGUMENT"


class ModelNotFound(ServeError):
    """No such model (or version) in the repository."""

    http_status, grpc_code = 404, "NOT_FOUND"


class ModelNotReady(ServeError):
    """The model exists but is not loaded, failed to load, or is unloading."""

    http_status, grpc_code = 400, "UNAVAILABLE"


class ModelLoadError(ServeError):
    """Loading (or building) a model failed; the message gives the reason."""

    http_status, grpc_code = 400, "INVALID_ARGUMENT"


class QueueFull(ServeError):
    """The model's request queue is at its limit; retry later."""

    http_status, grpc_code = 503, "UNAVAILABLE"


class RequestTimeout(ServeError):
    """The request waited in the queue past its timeout."""

    http_status, grpc_code = 504, "DEADLINE_EXCEEDED"


class TooLarge(ServeError):
    """The request body or a tensor is larger than the server accepts."""

    http_status, grpc_code = 413, "RESOURCE_EXHAUSTED"


class InferenceFailed(ServeError):
    """The engine failed while running a batch (not the caller's fault)."""

    http_status, grpc_code = 500, "INTERNAL"


class RegionNotFound(ServeError):
    """No system shared memory region of that name is registered."""

    http_status, grpc_code = 404, "NOT_FOUND"


class AlreadyExists(ServeError):
    """A shared memory region of that name is already registered."""

    http_status, grpc_code = 400, "ALREADY_EXISTS"


class Unsupported(ServeError):
    """The server does not serve this (e.g. shared memory when started without it)."""

    http_status, grpc_code = 400, "UNIMPLEMENTED"


class ClientGone(ServeError):
    """The client disconnected before its answer: the request was dropped (nginx's 499, gRPC CANCELLED)."""

    http_status, grpc_code = 499, "CANCELLED"
