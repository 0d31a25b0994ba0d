"""The API's operations as plain request descriptions, shared by the sync and the async client.

An :class:`Op` says what to send and how to read the answer; the clients only carry it out. The
``*_FIELDS`` tuples name the request fields each builder may send: a test checks them against the
committed ``openapi.json`` (the server refuses unknown fields, so a name missing there is a bug).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

from . import models as m

Duration = Union[str, float, int, _dt.timedelta]
Time = Union[str, _dt.datetime]


@dataclass
class Op:
    method: str
    path: str
    params: Optional[Dict[str, Any]] = None
    body: Any = None
    has_body: bool = False
    parse: Callable[[Any], Any] = lambda data: data
    headers: Optional[Dict[str, str]] = None
    #: The answer is text (``/metrics``), not JSON.
    text: bool = False


@dataclass(frozen=True)
class Page:
    """One page of a list, and the cursor of the next (``None`` on the last page)."""

    items: List[Any]
    next_cursor: Optional[str]


def _seg(value: str) -> str:
    return quote(str(value), safe="")


def _drop_none(d: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# --- tasks -------------------------------------------------------------------------------------

#: Fields of ``CreateTask`` (``POST /v1/tasks``).
CREATE_TASK_FIELDS: Tuple[str, ...] = (
    "queue",
    "kind",
    "key",
    "payload",
    "run_at",
    "delay",
    "max_attempts",
    "backoff",
    "timeout",
    "exclusive",
    "tags",
    "target",
)
BACKOFF_FIELDS: Tuple[str, ...] = ("initial", "factor", "max", "jitter")
EXCLUSIVE_FIELDS: Tuple[str, ...] = ("key", "mode")
#: Query parameters of ``GET /v1/tasks``.
LIST_TASKS_PARAMS: Tuple[str, ...] = (
    "queue",
    "kind",
    "state",
    "key",
    "key_prefix",
    "tag",
    "error_group",
    "due_after",
    "due_before",
    "created_after",
    "created_before",
    "limit",
    "cursor",
)
#: Fields of ``BulkRequest`` (``POST /v1/tasks:cancel``, ``POST /v1/tasks:retry``).
BULK_FIELDS: Tuple[str, ...] = (
    "queue",
    "kind",
    "state",
    "key_prefix",
    "tag",
    "error_group",
    "due_after",
    "due_before",
    "created_after",
    "created_before",
    "dry_run",
    "run_at",
)
RETRY_FIELDS: Tuple[str, ...] = ("run_at",)


def task_body(
    kind: str,
    *,
    queue: Optional[str] = None,
    key: Optional[str] = None,
    payload: Any = None,
    run_at: Optional[Time] = None,
    delay: Optional[Duration] = None,
    max_attempts: Optional[int] = None,
    backoff: Optional[Mapping[str, Any]] = None,
    timeout: Optional[Duration] = None,
    exclusive: Union[None, str, Mapping[str, Any]] = None,
    tags: Optional[Mapping[str, str]] = None,
    target: Union[None, str, Mapping[str, Any]] = None,
    **extra: Any,
) -> Dict[str, Any]:
    """The ``CreateTask`` body. ``extra`` passes fields this client does not know yet."""
    body: Dict[str, Any] = {"kind": kind}
    if backoff is not None:
        backoff = {
            k: (m.format_duration(v) if k in ("initial", "max") else v)
            for k, v in backoff.items()
            if v is not None
        }
    if isinstance(exclusive, str):
        exclusive = {"key": exclusive}
    if isinstance(target, str):
        target = {"url": target}
    elif target is not None:
        target = {k: (m.format_duration(v) if k == "timeout" else v) for k, v in target.items() if v is not None}
    body.update(
        _drop_none(
            {
                "queue": queue,
                "key": key,
                "payload": payload,
                "run_at": None if run_at is None else m.format_time(run_at),
                "delay": None if delay is None else m.format_duration(delay),
                "max_attempts": max_attempts,
                "backoff": backoff,
                "timeout": None if timeout is None else m.format_duration(timeout),
                "exclusive": None if exclusive is None else dict(exclusive),
                "tags": None if tags is None else dict(tags),
                "target": target,
            }
        )
    )
    body.update(_drop_none(extra))
    return body


def trace_headers(traceparent: Optional[str], tracestate: Optional[str] = None) -> Optional[Dict[str, str]]:
    """The W3C trace context headers of a request (none without a ``traceparent``)."""
    if not traceparent:
        return None
    h = {"traceparent": traceparent}
    if tracestate:
        h["tracestate"] = tracestate
    return h


def create_task(body: Dict[str, Any], traceparent: Optional[str] = None, tracestate: Optional[str] = None) -> Op:
    return Op(
        "POST",
        "/v1/tasks",
        body=body,
        has_body=True,
        parse=m.Task.from_dict,
        headers=trace_headers(traceparent, tracestate),
    )


def create_tasks(
    tasks: Iterable[Union[Mapping[str, Any]]], traceparent: Optional[str] = None, tracestate: Optional[str] = None
) -> Op:
    items = []
    for t in tasks:
        t = dict(t)
        kind = t.pop("kind")
        items.append(task_body(kind, **t))
    return Op(
        "POST",
        "/v1/tasks:batch",
        body={"tasks": items},
        has_body=True,
        parse=lambda d: [m.batch_result(r) for r in d["results"]],
        headers=trace_headers(traceparent, tracestate),
    )


def get_task(task_id: str) -> Op:
    return Op("GET", f"/v1/tasks/{_seg(task_id)}", parse=m.Task.from_dict)


def _filters(filters: Mapping[str, Any]) -> Dict[str, Any]:
    """Task filters for the wire: times formatted, ``tag`` as ``k:v`` strings (a mapping, one
    string, or a list of strings)."""
    out: Dict[str, Any] = {}
    for k, v in filters.items():
        if v is None:
            continue
        if k in ("due_after", "due_before", "created_after", "created_before", "run_at"):
            v = m.format_time(v)
        elif k == "tag":
            if isinstance(v, Mapping):
                v = [f"{a}:{b}" for a, b in v.items()]
            elif isinstance(v, str):
                v = [v]
            else:
                v = list(v)
        out[k] = v
    return out


def list_tasks(
    *,
    queue: Optional[str] = None,
    kind: Optional[str] = None,
    state: Optional[str] = None,
    key: Optional[str] = None,
    limit: Optional[int] = None,
    cursor: Optional[str] = None,
    **filters: Any,
) -> Op:
    params = _filters(
        {"queue": queue, "kind": kind, "state": state, "key": key, "limit": limit, "cursor": cursor, **filters}
    )
    return Op(
        "GET",
        "/v1/tasks",
        params=params,
        parse=lambda d: Page([m.Task.from_dict(t) for t in d["tasks"]], d.get("next_cursor")),
    )


def cancel_task(task_id: str) -> Op:
    return Op("POST", f"/v1/tasks/{_seg(task_id)}/cancel", parse=m.Task.from_dict)


def trigger_task(task_id: str) -> Op:
    return Op("POST", f"/v1/tasks/{_seg(task_id)}/trigger", parse=m.Task.from_dict)


def retry_task(task_id: str, run_at: Optional[Time] = None) -> Op:
    return Op(
        "POST",
        f"/v1/tasks/{_seg(task_id)}/retry",
        body=_filters({"run_at": run_at}),
        has_body=True,
        parse=m.Task.from_dict,
    )


def list_attempts(task_id: str) -> Op:
    return Op(
        "GET",
        f"/v1/tasks/{_seg(task_id)}/attempts",
        parse=lambda d: ([m.Attempt.from_dict(a) for a in d["attempts"]], d["total"]),
    )


def bulk(action: str, filters: Mapping[str, Any]) -> Op:
    return Op("POST", f"/v1/tasks:{action}", body=_filters(filters), has_body=True, parse=m.BulkResult.from_dict)


# --- queues ------------------------------------------------------------------------------------


def list_queues() -> Op:
    return Op("GET", "/v1/queues", parse=lambda d: [m.Queue.from_dict(q) for q in d["queues"]])


def get_queue(queue: str) -> Op:
    return Op("GET", f"/v1/queues/{_seg(queue)}", parse=m.Queue.from_dict)


def pause_queue(queue: str) -> Op:
    return Op("POST", f"/v1/queues/{_seg(queue)}/pause", parse=m.Queue.from_dict)


def resume_queue(queue: str) -> Op:
    return Op("POST", f"/v1/queues/{_seg(queue)}/resume", parse=m.Queue.from_dict)


QUEUE_SETTINGS_FIELDS: Tuple[str, ...] = ("retention", "target", "concurrency")


def set_queue_settings(queue: str, settings: Mapping[str, Any]) -> Op:
    """``PUT /v1/queues/{queue}``: the whole settings object is replaced (absent fields are
    cleared); the pause state is not part of it."""
    return Op(
        "PUT", f"/v1/queues/{_seg(queue)}", body=_drop_none(settings), has_body=True, parse=m.Queue.from_dict
    )


# --- push signing secrets (admin) ---------------------------------------------------------------

ADD_SECRET_FIELDS: Tuple[str, ...] = ("secret",)
ROTATE_SECRET_FIELDS: Tuple[str, ...] = ("secret", "overlap")


def _secrets(d: Mapping[str, Any]) -> List[m.PushSecret]:
    return [m.PushSecret.from_dict(s) for s in d["secrets"]]


def list_push_secrets() -> Op:
    return Op("GET", "/v1/push/secrets", parse=_secrets)


def add_push_secret(secret: Optional[str] = None) -> Op:
    body = _drop_none({"secret": secret})
    return Op("POST", "/v1/push/secrets", body=body, has_body=True, parse=m.PushSecret.from_dict)


def rotate_push_secret(secret: Optional[str] = None, overlap: Optional[Duration] = None) -> Op:
    body = _drop_none({"secret": secret, "overlap": None if overlap is None else m.format_duration(overlap)})
    return Op("POST", "/v1/push/secrets:rotate", body=body, has_body=True, parse=m.PushSecret.from_dict)


def revoke_push_secret(secret_id: str) -> Op:
    return Op("DELETE", f"/v1/push/secrets/{_seg(secret_id)}", parse=_secrets)


# --- the worker protocol -----------------------------------------------------------------------

POLL_FIELDS: Tuple[str, ...] = ("worker", "max", "wait", "kinds", "complete")
#: Fields of ``PollCompletion`` (a poll's ``complete``).
POLL_COMPLETION_FIELDS: Tuple[str, ...] = ("task_id", "execution_id", "result")
HEARTBEAT_FIELDS: Tuple[str, ...] = ("execution_id",)
COMPLETE_FIELDS: Tuple[str, ...] = ("execution_id", "result")
FAIL_FIELDS: Tuple[str, ...] = ("execution_id", "error", "retryable")


def _poll_body(
    worker: str, max: Optional[int], wait: Optional[Duration], kinds: Optional[Sequence[str]]
) -> Dict[str, Any]:
    return _drop_none(
        {
            "worker": worker,
            "max": max,
            "wait": None if wait is None else m.format_duration(wait),
            "kinds": None if kinds is None else list(kinds),
        }
    )


def poll(
    queue: str,
    worker: str,
    *,
    max: Optional[int] = None,
    wait: Optional[Duration] = None,
    kinds: Optional[Sequence[str]] = None,
) -> Op:
    return Op(
        "POST",
        f"/v1/queues/{_seg(queue)}/poll",
        body=_poll_body(worker, max, wait, kinds),
        has_body=True,
        parse=lambda d: [m.PolledTask.from_dict(t) for t in d["tasks"]],
    )


def complete_and_poll(
    queue: str,
    worker: str,
    task_id: str,
    execution_id: str,
    result: Any = None,
    *,
    max: Optional[int] = None,
    wait: Optional[Duration] = None,
    kinds: Optional[Sequence[str]] = None,
) -> Op:
    """A poll carrying the completion of the worker's previous task (``complete``)."""
    body = _poll_body(worker, max, wait, kinds)
    body["complete"] = _drop_none({"task_id": task_id, "execution_id": execution_id, "result": result})
    return Op(
        "POST",
        f"/v1/queues/{_seg(queue)}/poll",
        body=body,
        has_body=True,
        parse=m.CompleteAndPoll.from_dict,
    )


def heartbeat(task_id: str, execution_id: str) -> Op:
    return Op(
        "POST",
        f"/v1/tasks/{_seg(task_id)}/heartbeat",
        body={"execution_id": execution_id},
        has_body=True,
        parse=m.Task.from_dict,
    )


def complete(task_id: str, execution_id: str, result: Any = None, traceparent: Optional[str] = None) -> Op:
    return Op(
        "POST",
        f"/v1/tasks/{_seg(task_id)}/complete",
        body=_drop_none({"execution_id": execution_id, "result": result}),
        has_body=True,
        parse=m.Task.from_dict,
        headers=trace_headers(traceparent),
    )


def fail(
    task_id: str,
    execution_id: str,
    error: Optional[str] = None,
    retryable: Optional[bool] = None,
    traceparent: Optional[str] = None,
) -> Op:
    return Op(
        "POST",
        f"/v1/tasks/{_seg(task_id)}/fail",
        body=_drop_none({"execution_id": execution_id, "error": error, "retryable": retryable}),
        has_body=True,
        parse=m.Task.from_dict,
        headers=trace_headers(traceparent),
    )


# --- schedules ---------------------------------------------------------------------------------

#: Fields of ``ScheduleRequest`` (``POST /v1/schedules``, ``PATCH /v1/schedules/{id}``).
SCHEDULE_FIELDS: Tuple[str, ...] = (
    "id",
    "cron",
    "every",
    "anchor",
    "timezone",
    "dst",
    "overlap",
    "catchup_window",
    "jitter",
    "start_at",
    "end_at",
    "paused",
    "note",
    "task",
)
PREVIEW_FIELDS: Tuple[str, ...] = ("cron", "every", "anchor", "timezone", "dst", "from", "count")
BACKFILL_FIELDS: Tuple[str, ...] = ("from", "to", "overlap")
LIST_SCHEDULES_PARAMS: Tuple[str, ...] = ("limit", "cursor")
LIST_FIRES_PARAMS: Tuple[str, ...] = ("limit", "before")

_SCHEDULE_DURATIONS = ("every", "catchup_window", "jitter")
_SCHEDULE_TIMES = ("anchor", "start_at", "end_at")


def schedule_body(fields: Mapping[str, Any]) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    for k, v in fields.items():
        if v is None:
            continue
        if k in _SCHEDULE_DURATIONS:
            v = m.format_duration(v)
        elif k in _SCHEDULE_TIMES:
            v = m.format_time(v)
        elif k == "task" and isinstance(v, Mapping):
            t = dict(v)
            v = task_body(t.pop("kind"), **t)
        body[k] = v
    return body


def create_schedule(fields: Mapping[str, Any]) -> Op:
    return Op("POST", "/v1/schedules", body=schedule_body(fields), has_body=True, parse=m.Schedule.from_dict)


def update_schedule(schedule_id: str, fields: Mapping[str, Any]) -> Op:
    return Op(
        "PATCH",
        f"/v1/schedules/{_seg(schedule_id)}",
        body=schedule_body(fields),
        has_body=True,
        parse=m.Schedule.from_dict,
    )


def get_schedule(schedule_id: str) -> Op:
    return Op("GET", f"/v1/schedules/{_seg(schedule_id)}", parse=m.Schedule.from_dict)


def delete_schedule(schedule_id: str) -> Op:
    return Op("DELETE", f"/v1/schedules/{_seg(schedule_id)}", parse=lambda d: None)


def list_schedules(*, limit: Optional[int] = None, cursor: Optional[str] = None) -> Op:
    return Op(
        "GET",
        "/v1/schedules",
        params=_drop_none({"limit": limit, "cursor": cursor}),
        parse=lambda d: Page([m.Schedule.from_dict(s) for s in d["schedules"]], d.get("next_cursor")),
    )


def pause_schedule(schedule_id: str, note: Optional[str] = None) -> Op:
    return Op(
        "POST",
        f"/v1/schedules/{_seg(schedule_id)}/pause",
        body=_drop_none({"note": note}),
        has_body=True,
        parse=m.Schedule.from_dict,
    )


def unpause_schedule(schedule_id: str, note: Optional[str] = None) -> Op:
    return Op(
        "POST",
        f"/v1/schedules/{_seg(schedule_id)}/unpause",
        body=_drop_none({"note": note}),
        has_body=True,
        parse=m.Schedule.from_dict,
    )


def trigger_schedule(schedule_id: str) -> Op:
    return Op("POST", f"/v1/schedules/{_seg(schedule_id)}/trigger", parse=m.Fire.from_dict)


def backfill_schedule(schedule_id: str, start: Time, end: Time, overlap: Optional[str] = None) -> Op:
    return Op(
        "POST",
        f"/v1/schedules/{_seg(schedule_id)}/backfill",
        body=_drop_none({"from": m.format_time(start), "to": m.format_time(end), "overlap": overlap}),
        has_body=True,
        parse=lambda d: ([m.Fire.from_dict(f) for f in d["fires"]], [m.parse_time(t) for t in d["already_recorded"]]),
    )


def list_fires(schedule_id: str, *, limit: Optional[int] = None, before: Optional[str] = None) -> Op:
    return Op(
        "GET",
        f"/v1/schedules/{_seg(schedule_id)}/fires",
        params=_drop_none({"limit": limit, "before": before}),
        parse=lambda d: Page([m.Fire.from_dict(f) for f in d["fires"]], d.get("next_cursor")),
    )


def preview_schedule(fields: Mapping[str, Any]) -> Op:
    body = schedule_body({k: v for k, v in fields.items() if k != "from"})
    body["from"] = m.format_time(fields["from"])
    return Op(
        "POST",
        "/v1/schedules:preview",
        body=body,
        has_body=True,
        parse=lambda d: [m.parse_time(t) for t in d["fires"]],
    )


# --- workflows ---------------------------------------------------------------------------------

START_WORKFLOW_FIELDS: Tuple[str, ...] = ("type", "id", "input", "id_reuse")
SIGNAL_FIELDS: Tuple[str, ...] = ("input",)
REASON_FIELDS: Tuple[str, ...] = ("reason",)
LIST_WORKFLOWS_PARAMS: Tuple[str, ...] = ("type", "status", "limit", "cursor")


def start_workflow(
    workflow_type: str,
    input: Any = None,
    *,
    workflow_id: Optional[str] = None,
    id_reuse: Optional[str] = None,
) -> Op:
    body = _drop_none({"type": workflow_type, "id": workflow_id, "input": input, "id_reuse": id_reuse})
    return Op("POST", "/v1/workflows", body=body, has_body=True, parse=m.WorkflowStarted.from_dict)


def signal_workflow(workflow_id: str, name: str, input: Any = None) -> Op:
    return Op(
        "POST",
        f"/v1/workflows/{_seg(workflow_id)}/signals/{_seg(name)}",
        body=_drop_none({"input": input}),
        has_body=True,
        parse=lambda d: None,
    )


def get_workflow(workflow_id: str) -> Op:
    return Op("GET", f"/v1/workflows/{_seg(workflow_id)}", parse=m.Workflow.from_dict)


def list_workflows(
    *,
    workflow_type: Optional[str] = None,
    status: Optional[str] = None,
    limit: Optional[int] = None,
    cursor: Optional[str] = None,
) -> Op:
    return Op(
        "GET",
        "/v1/workflows",
        params=_drop_none({"type": workflow_type, "status": status, "limit": limit, "cursor": cursor}),
        parse=lambda d: Page([m.Workflow.from_dict(w) for w in d["workflows"]], d.get("next_cursor")),
    )


def cancel_workflow(workflow_id: str, reason: Optional[str] = None) -> Op:
    return Op(
        "POST",
        f"/v1/workflows/{_seg(workflow_id)}/cancel",
        body=_drop_none({"reason": reason}),
        has_body=True,
        parse=lambda d: None,
    )


def terminate_workflow(workflow_id: str, reason: Optional[str] = None) -> Op:
    return Op(
        "POST",
        f"/v1/workflows/{_seg(workflow_id)}/terminate",
        body=_drop_none({"reason": reason}),
        has_body=True,
        parse=m.Workflow.from_dict,
    )


def workflow_history(workflow_id: str) -> Op:
    return Op("GET", f"/v1/workflows/{_seg(workflow_id)}/history")


# --- service -----------------------------------------------------------------------------------


def health() -> Op:
    return Op("GET", "/healthz")


def metrics() -> Op:
    return Op("GET", "/metrics", text=True)
