"""Errors as exceptions. Every error answer of the server, ``{"error": {"code", "message", ...}}``,
becomes a :class:`SundialError` subclass chosen by its ``code`` (then by its status), carrying the
code and the fields the server named (``field``, ``index``, ``existing_id``, ``state``). Failures to
reach the server at all are :class:`ConnectionFailed`.

| class | status | codes |
|---|---|---|
| :class:`Malformed` | 400 | ``malformed`` |
| :class:`Unauthorized` | 401 | ``unauthenticated`` |
| :class:`Forbidden` | 403 | ``forbidden`` |
| :class:`NotFound` | 404 | ``not_found`` |
| :class:`MethodNotAllowed` | 405 | ``method_not_allowed`` |
| :class:`Conflict` | 409 | (base of the three below) |
| :class:`AlreadyExists` | 409 | ``already_exists`` (``existing_id``): a duplicate task key, schedule id or running workflow id (``DuplicateKey`` and ``AlreadyRunning`` are other names for it) |
| :class:`WrongState` | 409 | ``wrong_state`` (``state``) |
| :class:`StaleExecution` | 409 | ``stale_execution`` (``state``): stop working on the task |
| :class:`TooLarge` | 413 | ``too_large`` |
| :class:`Invalid` | 422 | ``invalid`` (``field``, ``index``) |
| :class:`RateLimited` | 429 | ``too_many_polls``, ``quota`` (a namespace's quota of live tasks or creates per second) |
| :class:`Unavailable` | 503 | ``unavailable``, ``shutting_down`` (:class:`ShuttingDown`): retry later |
| :class:`InternalError` | 500 | ``internal`` |
| :class:`Unsupported` | 501 | ``unsupported`` |
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type

__all__ = [
    "SundialError",
    "ApiError",
    "ConnectionFailed",
    "Malformed",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "MethodNotAllowed",
    "Conflict",
    "DuplicateKey",
    "WrongState",
    "StaleExecution",
    "AlreadyRunning",
    "AlreadyExists",
    "Unsupported",
    "TooLarge",
    "Invalid",
    "RateLimited",
    "Unavailable",
    "ShuttingDown",
    "InternalError",
    "error_from_response",
]


class SundialError(Exception):
    """Base of every error this package raises."""


class ConnectionFailed(SundialError):
    """The server could not be reached (refused, reset, timed out). Retrying later may work."""


class ApiError(SundialError):
    """The server answered with an error status."""

    #: Whether retrying the same request later may succeed.
    retryable = False

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: Optional[str] = None,
        index: Optional[int] = None,
        existing_id: Optional[str] = None,
        state: Optional[str] = None,
        body: Any = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.index = index
        self.existing_id = existing_id
        self.state = state
        #: The whole error body (``{"error": {...}}``) or the raw text when it was not JSON.
        self.body = body
        #: Seconds the server asked to wait before retrying (its ``Retry-After``), if it said.
        self.retry_after: Optional[float] = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, code={self.code!r}, message={self.message!r})"


class Malformed(ApiError):
    """400: the body was not JSON."""


class Unauthorized(ApiError):
    """401: no or a wrong bearer token."""


class Forbidden(ApiError):
    """403: the token may not do this."""


class NotFound(ApiError):
    """404: no such task, schedule, workflow or route."""


class MethodNotAllowed(ApiError):
    """405: the route exists but not with this method."""


class Conflict(ApiError):
    """409: valid, but in conflict with the current state."""


class WrongState(Conflict):
    """409 ``wrong_state``: the task is in ``state`` and cannot do this."""


class StaleExecution(Conflict):
    """409 ``stale_execution``: the execution id does not match the task's current attempt; stop
    working on it."""


class AlreadyExists(Conflict):
    """409 ``already_exists``: a duplicate. A live task of the queue holds the key, a schedule
    with the id exists, or a workflow with the id is running (or its id reuse policy refuses a
    new run). ``existing_id`` names the task holding the key, or the running workflow's run."""


#: Other names for :class:`AlreadyExists`, by what was duplicated.
DuplicateKey = AlreadyExists
AlreadyRunning = AlreadyExists


class TooLarge(ApiError):
    """413: a body, payload, result or batch over its limit."""


class Invalid(ApiError):
    """422: well-formed but invalid; ``field`` (and ``index`` in a batch) name the culprit."""


class RateLimited(ApiError):
    """429: too many requests (``too_many_polls``), or a create over its namespace's quota
    (``quota``); retry later, after ``retry_after`` seconds."""

    retryable = True


class Unavailable(ApiError):
    """503: the server cannot serve now (stopping, store closed, shard moving); retry later."""

    retryable = True


class ShuttingDown(Unavailable):
    """503 ``shutting_down``: the server is stopping."""


class InternalError(ApiError):
    """500: the server failed."""


class Unsupported(ApiError):
    """501: the server's store does not support this (workflows on a store without them)."""


_BY_CODE: Dict[str, Type[ApiError]] = {
    "malformed": Malformed,
    "unauthenticated": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "wrong_state": WrongState,
    "stale_execution": StaleExecution,
    "already_exists": AlreadyExists,
    "unsupported": Unsupported,
    "too_large": TooLarge,
    "invalid": Invalid,
    "too_many_polls": RateLimited,
    "quota": RateLimited,
    "unavailable": Unavailable,
    "shutting_down": ShuttingDown,
    "internal": InternalError,
}

_BY_STATUS: Dict[int, Type[ApiError]] = {
    400: Malformed,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: TooLarge,
    422: Invalid,
    429: RateLimited,
    500: InternalError,
    501: Unsupported,
    503: Unavailable,
}


def error_from_response(status: int, body: Any) -> ApiError:
    """The exception for an error answer (``body`` parsed JSON, or text)."""
    detail: Dict[str, Any] = {}
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        detail = body["error"]
    code = str(detail.get("code") or "")
    message = str(detail.get("message") or (body if isinstance(body, str) and body else f"HTTP {status}"))
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if cls is None:
        # A proxy's 502 or 504 is worth retrying like a 503.
        cls = Unavailable if status in (502, 504) else ApiError
    return cls(
        status,
        code or f"http_{status}",
        message,
        field=detail.get("field"),
        index=detail.get("index"),
        existing_id=detail.get("existing_id"),
        state=detail.get("state"),
        body=body,
    )
