"""Errors that cross module boundaries, each with the HTTP status and gRPC code it maps to.

The batcher, the codecs and the servers raise these; the HTTP and gRPC front ends turn them into
``{"error": message}`` bodies (with ``Retry-After`` where ``retry_after_s`` is set) or gRPC statuses.
Anything else escaping a handler is a bug and is answered 500.
"""

from __future__ import annotations


class FleetserveError(Exception):
    http_status = 500
    grpc_code = "INTERNAL"
    retry_after_s: float | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(FleetserveError):
    """The request is malformed or does not match the model's inputs (400)."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class PayloadTooLarge(FleetserveError):
    """A body, tensor or element count exceeds a configured bound (413)."""

    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class ModelNotFound(FleetserveError):
    http_status = 404
    grpc_code = "NOT_FOUND"


class Overloaded(FleetserveError):
    """The queue is full or the server is draining: try again later (503 + Retry-After)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotReady(Overloaded):
    """The engine is not loaded and warm yet, or the server is shutting down."""


class RequestExpired(FleetserveError):
    """The request's timeout passed while it waited in the queue; it was never executed (504)."""

    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"


class UsageError(FleetserveError, ValueError):
    """A user's mistake in a flag, an environment variable, the config file or the command's input: the CLI
    prints the message as one line and exits 2."""


class MissingDependency(UsageError):
    """An optional Python package the chosen feature needs is not installed; the message says how to get it."""
