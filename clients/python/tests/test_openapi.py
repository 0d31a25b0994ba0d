"""The client stays in step with the server: every model field and every request field this
client sends is checked against the committed ``openapi.json`` (itself kept equal to the
server's document by ``crates/sundial-server/tests/openapi_snapshot.rs``).

What is checked is what would break: a field the client reads that the server does not have, a
field the client needs (not ``Optional``) that the server may leave out, a type that does not
match, a request field or query parameter the server does not accept (requests refuse unknown
fields). Fields the server added and this client does not name yet are not failures (responses
keep them in ``extra``, requests pass them as extra keywords); they are listed in the output.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sys
import typing
import warnings
from typing import Any, Dict, List, Tuple

import pytest

import sundial_client.models as m
from sundial_client import _ops as ops

from conftest import REPO

DOC = json.loads((REPO / "openapi.json").read_text())
SCHEMAS: Dict[str, Any] = DOC["components"]["schemas"]

MODELS = [
    m.Task,
    m.Backoff,
    m.Exclusive,
    m.PolledTask,
    m.CompleteAndPoll,
    m.Schedule,
    m.ScheduleCounts,
    m.TaskTemplate,
    m.Fire,
    m.Workflow,
    m.WorkflowStarted,
    m.Attempt,
    m.Queue,
    m.PushSecret,
    m.BulkResult,
]


def resolve(schema: Dict[str, Any]) -> Dict[str, Any]:
    if "$ref" in schema:
        return SCHEMAS[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def schema_types(schema: Dict[str, Any]) -> Tuple[set, bool]:
    """The JSON types a property may hold, and whether it may be null."""
    if "$ref" in schema:
        return schema_types(resolve(schema))
    if "enum" in schema and "type" not in schema:
        return {"string"}, None in schema["enum"]
    if "oneOf" in schema:
        types, nullable = set(), False
        for s in schema["oneOf"]:
            t, n = schema_types(s)
            types |= t - {"null"}
            nullable = nullable or n or "null" in t
        return types, nullable
    t = schema.get("type")
    if t is None:
        return {"any"}, True
    types = set(t) if isinstance(t, list) else {t}
    return types - {"null"}, "null" in types


def python_types(tp: Any) -> Tuple[set, bool]:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        types, _ = python_types(args[0]) if len(args) == 1 else ({"any"}, True)
        return types, type(None) in typing.get_args(tp)
    if origin in (list, List):
        return {"array"}, False
    if tp is Any:
        return {"any"}, True
    if tp in (str, dt.datetime):
        return {"string"}, False
    if tp is int:
        return {"integer"}, False
    if tp is float:
        return {"number"}, False
    if tp is bool:
        return {"boolean"}, False
    if tp is dict or origin in (dict, Dict) or dataclasses.is_dataclass(tp):
        return {"object"}, False
    raise AssertionError(f"no JSON type for {tp}")


@pytest.mark.parametrize("model", MODELS, ids=lambda c: c.__name__)
def test_models_match_the_schemas(model):
    schema = SCHEMAS[model.__schema__]
    props = schema["properties"]
    required = set(schema.get("required", []))
    hints = typing.get_type_hints(model, vars(sys.modules[model.__module__]))
    named = set()
    for f in dataclasses.fields(model):
        if f.name == "extra":
            continue
        wire = model.__renames__.get(f.name, f.name)
        named.add(wire)
        assert wire in props, f"{model.__name__}.{f.name}: the server's {model.__schema__} has no {wire!r}"
        client_types, client_nullable = python_types(hints[f.name])
        server_types, server_nullable = schema_types(props[wire])
        optional_on_server = server_nullable or wire not in required
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if optional_on_server and not client_nullable and not has_default:
            pytest.fail(f"{model.__name__}.{f.name} is required by the client but may be absent or null")
        if "any" not in client_types and "any" not in server_types:
            compatible = client_types & server_types or (client_types == {"number"} and "integer" in server_types)
            assert compatible, f"{model.__name__}.{f.name}: client {client_types}, server {server_types}"
    new = set(props) - named
    if new:
        warnings.warn(f"{model.__schema__} has fields this client does not name yet: {sorted(new)}")


def test_batch_items_match():
    one_of = SCHEMAS["BatchItem"]["oneOf"]
    by_status = {}
    for variant in one_of:
        status = variant["properties"]["status"]["enum"][0]
        by_status[status] = variant
    for model, status in ((m.BatchCreated, "created"), (m.BatchDuplicate, "duplicate")):
        props = by_status[status]["properties"]
        for f in dataclasses.fields(model):
            assert f.name in props, f"{model.__name__}.{f.name} missing in BatchItem {status}"


REQUESTS = [
    ("CreateTask", ops.CREATE_TASK_FIELDS),
    ("BackoffSpec", ops.BACKOFF_FIELDS),
    ("ExclusiveSpec", ops.EXCLUSIVE_FIELDS),
    ("PollRequest", ops.POLL_FIELDS),
    ("PollCompletion", ops.POLL_COMPLETION_FIELDS),
    ("HeartbeatRequest", ops.HEARTBEAT_FIELDS),
    ("CompleteRequest", ops.COMPLETE_FIELDS),
    ("FailRequest", ops.FAIL_FIELDS),
    ("ScheduleRequest", ops.SCHEDULE_FIELDS),
    ("PreviewRequest", ops.PREVIEW_FIELDS),
    ("BackfillRequest", ops.BACKFILL_FIELDS),
    ("StartRequest", ops.START_WORKFLOW_FIELDS),
    ("SignalRequest", ops.SIGNAL_FIELDS),
    ("ReasonRequest", ops.REASON_FIELDS),
    ("NoteRequest", ("note",)),
    ("BulkRequest", ops.BULK_FIELDS),
    ("RetryRequest", ops.RETRY_FIELDS),
    ("QueueSettingsView", ops.QUEUE_SETTINGS_FIELDS),
    ("AddSecret", ops.ADD_SECRET_FIELDS),
    ("RotateSecret", ops.ROTATE_SECRET_FIELDS),
]


@pytest.mark.parametrize("name,fields", REQUESTS, ids=[r[0] for r in REQUESTS])
def test_request_fields_are_accepted(name, fields):
    schema = SCHEMAS[name]
    props = schema["properties"]
    for f in fields:
        assert f in props, f"the client sends {f!r} but the server's {name} has no such field"
    for r in schema.get("required", []):
        assert r in fields, f"the server's {name} requires {r!r}, which the client never sends"
    new = set(props) - set(fields)
    if new:
        warnings.warn(f"{name} has fields this client does not name yet: {sorted(new)}")


QUERIES = [
    ("/v1/tasks", "get", ops.LIST_TASKS_PARAMS),
    ("/v1/schedules", "get", ops.LIST_SCHEDULES_PARAMS),
    ("/v1/schedules/{id}/fires", "get", ops.LIST_FIRES_PARAMS),
    ("/v1/workflows", "get", ops.LIST_WORKFLOWS_PARAMS),
]


@pytest.mark.parametrize("path,method,params", QUERIES, ids=[q[0] for q in QUERIES])
def test_query_parameters_exist(path, method, params):
    declared = {p["name"] for p in DOC["paths"][path][method].get("parameters", []) if p["in"] == "query"}
    for p in params:
        assert p in declared, f"{method.upper()} {path} has no query parameter {p!r}"


def test_every_route_the_client_calls_exists():
    """Each operation builder's method and path are in the document."""
    calls = [
        ops.create_task({"kind": "k"}),
        ops.create_tasks([{"kind": "k"}]),
        ops.get_task("x"),
        ops.list_tasks(),
        ops.cancel_task("x"),
        ops.trigger_task("x"),
        ops.retry_task("x"),
        ops.list_attempts("x"),
        ops.bulk("cancel", {"queue": "q"}),
        ops.bulk("retry", {"queue": "q"}),
        ops.list_queues(),
        ops.get_queue("q"),
        ops.pause_queue("q"),
        ops.set_queue_settings("q", {"target": {"url": "https://example.com/hook"}}),
        ops.list_push_secrets(),
        ops.add_push_secret(),
        ops.rotate_push_secret(overlap="1h"),
        ops.revoke_push_secret("ps_x"),
        ops.resume_queue("q"),
        ops.poll("q", "w"),
        ops.complete_and_poll("q", "w", "x", "e"),
        ops.heartbeat("x", "e"),
        ops.complete("x", "e"),
        ops.fail("x", "e"),
        ops.create_schedule({"every": "1h"}),
        ops.update_schedule("x", {}),
        ops.get_schedule("x"),
        ops.delete_schedule("x"),
        ops.list_schedules(),
        ops.pause_schedule("x"),
        ops.unpause_schedule("x"),
        ops.trigger_schedule("x"),
        ops.backfill_schedule("x", "2030-01-01T00:00:00Z", "2030-01-02T00:00:00Z"),
        ops.list_fires("x"),
        ops.preview_schedule({"from": "2030-01-01T00:00:00Z"}),
        ops.start_workflow("t"),
        ops.signal_workflow("x", "n"),
        ops.get_workflow("x"),
        ops.list_workflows(),
        ops.cancel_workflow("x"),
        ops.terminate_workflow("x"),
        ops.workflow_history("x"),
        ops.health(),
        ops.metrics(),
    ]
    templates = []
    for path, item in DOC["paths"].items():
        for method in item:
            parts = path.split("/")
            templates.append((method.upper(), parts))
    for op in calls:
        parts = op.path.split("/")
        ok = any(
            method == op.method
            and len(tparts) == len(parts)
            and all(t == p or (t.startswith("{") and t.endswith("}")) for t, p in zip(tparts, parts))
            for method, tparts in templates
        )
        assert ok, f"{op.method} {op.path} is not in openapi.json"
