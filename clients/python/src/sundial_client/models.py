"""Typed results: what the server's responses hold, as frozen dataclasses.

Each model names the OpenAPI schema it reads (``__schema__``); a test checks every field against the
committed ``openapi.json`` so the models stay in step with the server. Responses are open for
extension: fields the model does not know are kept in ``extra`` rather than refused, so an older
client keeps working against a newer server.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

__all__ = [
    "Backoff",
    "BatchCreated",
    "BatchDuplicate",
    "BatchResult",
    "Exclusive",
    "Fire",
    "PolledTask",
    "CompleteAndPoll",
    "Schedule",
    "ScheduleCounts",
    "Task",
    "TaskTemplate",
    "Workflow",
    "WorkflowStarted",
    "Attempt",
    "Queue",
    "BulkResult",
    "parse_time",
    "parse_duration",
    "format_duration",
]


def parse_time(value: str) -> _dt.datetime:
    """An RFC 3339 time from the server (``2030-01-02T03:04:05.123Z``) as an aware datetime."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    # Python before 3.11 accepts only 3 or 6 fraction digits.
    if "." in text:
        head, _, rest = text.partition(".")
        digits = ""
        while rest and rest[0].isdigit():
            digits, rest = digits + rest[0], rest[1:]
        text = f"{head}.{(digits + '000000')[:6]}{rest}"
    return _dt.datetime.fromisoformat(text)


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: str) -> float:
    """A wire duration (``"1500ms"``, ``"30s"``, ``"1h30m"``, ``"3d"``) in seconds."""
    text = value.strip()
    if not text:
        raise ValueError("empty duration")
    total, i = 0.0, 0
    while i < len(text):
        j = i
        while j < len(text) and (text[j].isdigit() or text[j] == "."):
            j += 1
        if j == i:
            raise ValueError(f"not a duration: {value!r}")
        number = float(text[i:j])
        k = j
        while k < len(text) and text[k].isalpha():
            k += 1
        unit = text[j:k]
        if unit not in _UNITS:
            raise ValueError(f"unknown unit {unit!r} in duration {value!r}")
        total += number * _UNITS[unit]
        i = k
    return total


def format_duration(value: Union[str, float, int, _dt.timedelta]) -> str:
    """Seconds (or a timedelta, or an already formatted string) as a wire duration."""
    if isinstance(value, str):
        return value
    seconds = value.total_seconds() if isinstance(value, _dt.timedelta) else float(value)
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    millis = round(seconds * 1000)
    if millis % 1000:
        return f"{millis}ms"
    return f"{millis // 1000}s"


def format_time(value: Union[str, _dt.datetime]) -> str:
    """A datetime (aware, or naive meaning UTC) or an RFC 3339 string, for the wire."""
    if isinstance(value, str):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    # The server keeps milliseconds and refuses finer digits.
    return value.isoformat(timespec="milliseconds")


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(args[0], value) if len(args) == 1 else value
    if origin in (list, List):
        (item,) = typing.get_args(tp)
        return [_convert(item, v) for v in value]
    if tp is _dt.datetime:
        return parse_time(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp.from_dict(value)
    if tp is float and isinstance(value, int):
        return float(value)
    return value


class _Model:
    """``from_dict`` for the dataclasses below: converts nested models, times and lists."""

    __schema__: typing.ClassVar[str]
    #: Wire names that differ from the Python field names (``type`` is a builtin).
    __renames__: typing.ClassVar[Dict[str, str]] = {}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Any:
        hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
        renames = cls.__renames__
        wire_to_field = {renames.get(f.name, f.name): f.name for f in dataclasses.fields(cls)}
        kwargs: Dict[str, Any] = {}
        extra: Dict[str, Any] = {}
        for key, value in data.items():
            name = wire_to_field.get(key)
            if name is None or name == "extra":
                extra[key] = value
            else:
                kwargs[name] = _convert(hints[name], value)
        for f in dataclasses.fields(cls):
            if f.name not in kwargs and f.name != "extra":
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    kwargs[f.name] = None
        if "extra" in {f.name for f in dataclasses.fields(cls)}:
            kwargs["extra"] = extra
        return cls(**kwargs)


@dataclass(frozen=True)
class Backoff(_Model):
    """The delay between attempts."""

    __schema__ = "BackoffView"
    initial: str
    factor: float
    max: str
    jitter: float


@dataclass(frozen=True)
class Exclusive(_Model):
    """At most one running task per exclusive key; ``mode`` is ``wait`` or ``skip``."""

    __schema__ = "ExclusiveView"
    key: str
    mode: str


@dataclass(frozen=True)
class Task(_Model):
    """A task as stored."""

    __schema__ = "TaskView"
    id: str
    queue: str
    kind: str
    key: Optional[str]
    payload: Any
    #: ``scheduled``, ``ready``, ``running``, ``succeeded``, ``dead`` or ``cancelled``.
    state: str
    run_at: _dt.datetime
    attempt: int
    max_attempts: int
    backoff: Backoff
    timeout: str
    exclusive: Optional[Exclusive]
    execution_id: Optional[str]
    lease_expires_at: Optional[_dt.datetime]
    worker: Optional[str]
    last_error: Optional[str]
    result: Any
    created_at: _dt.datetime
    updated_at: _dt.datetime
    started_at: Optional[_dt.datetime]
    finished_at: Optional[_dt.datetime]
    #: String tags given at create (``GET /v1/tasks?tag=k:v`` finds them).
    tags: Dict[str, str] = field(default_factory=dict)
    #: The W3C trace context it carries from the request that created it.
    traceparent: Optional[str] = None
    tracestate: Optional[str] = None
    #: The HTTP target Sundial calls at the due time (push delivery), when it has one.
    target: Optional[Dict[str, Any]] = None
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def finished(self) -> bool:
        return self.state in ("succeeded", "dead", "cancelled")


@dataclass(frozen=True)
class BatchCreated(_Model):
    """A batch item that was stored."""

    __schema__ = "BatchItem"
    id: str
    state: str
    run_at: _dt.datetime
    status: str = "created"


@dataclass(frozen=True)
class BatchDuplicate(_Model):
    """A batch item not stored: a live task of the queue already holds its key."""

    __schema__ = "BatchItem"
    existing_id: str
    status: str = "duplicate"


BatchResult = Union[BatchCreated, BatchDuplicate]


def batch_result(data: Dict[str, Any]) -> BatchResult:
    if data.get("status") == "duplicate":
        return BatchDuplicate.from_dict(data)
    return BatchCreated.from_dict(data)


@dataclass(frozen=True)
class PolledTask(_Model):
    """A task handed to this worker: every later call about it presents ``execution_id``."""

    __schema__ = "PolledTask"
    id: str
    queue: str
    kind: str
    key: Optional[str]
    payload: Any
    attempt: int
    max_attempts: int
    execution_id: str
    lease_expires_at: _dt.datetime
    run_at: _dt.datetime
    timeout: str
    #: The W3C trace context to run the attempt in (its delivery's), for a traced task.
    traceparent: Optional[str] = None
    tracestate: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class CompleteAndPoll(_Model):
    """The answer to a poll that carried the worker's completion: the task it recorded as
    succeeded, and the tasks now running for the worker (maybe none)."""

    __schema__ = "PollResponse"
    #: The completed task as stored (``succeeded``, with its result). The server sends it in
    #: every answer to a poll that carried a completion (only those: hence optional).
    completed: Optional[Task]
    tasks: List[PolledTask]
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class ScheduleCounts(_Model):
    __schema__ = "CountsView"
    fired: int
    skipped: int
    missed: int


@dataclass(frozen=True)
class TaskTemplate(_Model):
    """The task each fire of a schedule creates."""

    __schema__ = "TaskTemplateView"
    queue: str
    kind: str
    payload: Any
    max_attempts: int
    timeout: str
    #: The push target of the tasks, when they have one.
    target: Optional[Dict[str, Any]] = None
    #: The tags each fire's task carries.
    tags: Dict[str, str] = field(default_factory=dict)
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Fire(_Model):
    """One fire record of a schedule: ``outcome`` is ``fired``, ``skipped`` or ``missed``."""

    __schema__ = "FireView"
    nominal_time: _dt.datetime
    outcome: str
    reason: str
    count: int
    recorded_at: _dt.datetime
    task_id: Optional[str]
    through: Optional[_dt.datetime]
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Schedule(_Model):
    """A recurring schedule (``cron`` or ``every``)."""

    __schema__ = "ScheduleView"
    id: str
    cron: Optional[str]
    every: Optional[str]
    anchor: Optional[str]
    timezone: str
    dst: Dict[str, Any]
    overlap: str
    catchup_window: str
    jitter: str
    start_at: Optional[str]
    end_at: Optional[str]
    paused: bool
    note: Optional[str]
    task: TaskTemplate
    next_fires: List[_dt.datetime]
    counts: ScheduleCounts
    created_at: _dt.datetime
    updated_at: _dt.datetime
    last_fires: Optional[List[Fire]] = None
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Workflow(_Model):
    """A workflow's current run."""

    __schema__ = "WorkflowView"
    __renames__ = {"workflow_type": "type"}
    id: str
    run_id: str
    workflow_type: str
    status: str
    history_length: int
    created_at: _dt.datetime
    updated_at: _dt.datetime
    closed_at: Optional[_dt.datetime]
    result: Any
    error: Optional[str]
    parent_id: Optional[str]
    continued_from: Optional[str]
    continued_to: Optional[str]
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class WorkflowStarted(_Model):
    """The answer to starting a workflow."""

    __schema__ = "StartResponse"
    id: str
    run_id: str
    status: str
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Attempt(_Model):
    """One attempt of a task: ``outcome`` is ``succeeded``, ``failed``, ``lease_expired``,
    ``cancelled``, or ``None`` while it runs."""

    __schema__ = "AttemptView"
    seq: int
    started_at: _dt.datetime
    ended_at: Optional[_dt.datetime]
    outcome: Optional[str]
    error: Optional[str]
    execution_id: Optional[str]
    worker: Optional[str]
    duration_ms: Optional[int]
    #: The HTTP status a push receiver answered (push attempts that got an answer only).
    status_code: Optional[int] = None
    #: The content type of that answer, when it named one.
    content_type: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Queue(_Model):
    """A queue as an operator sees it: counts per state, paused, and its oldest overdue task."""

    __schema__ = "QueueView"
    queue: str
    paused: bool
    counts: Dict[str, int]
    settings: Dict[str, Any]
    oldest_overdue_at: Optional[_dt.datetime] = None
    lateness: Optional[str] = None
    lateness_ms: Optional[int] = None
    paused_changed_at: Optional[_dt.datetime] = None
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class PushSecret(_Model):
    """A push signing secret (``whsec_…``). ``secret`` is in full only in the answer that created
    it; listings show its first characters and ``…``."""

    __schema__ = "SecretView"
    id: str
    secret: str
    created_at: _dt.datetime
    #: Whether calls are signed with it now.
    active: bool
    #: When it stops signing (``None``: until rotated or revoked).
    expires_at: Optional[_dt.datetime] = None
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class BulkResult(_Model):
    """What a bulk cancel or retry matched and changed (``changed`` is 0 for a dry run)."""

    __schema__ = "BulkResponse"
    matched: int
    changed: int
    dry_run: bool
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
