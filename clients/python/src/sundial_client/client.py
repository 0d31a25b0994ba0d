"""The producer client, in a blocking (:class:`Client`) and an asyncio (:class:`AsyncClient`)
flavour over httpx. Both expose the same methods with the same arguments; the async ones are
coroutines, and the ``iter_*`` listings are (async) iterators that fetch the next page when the
current one runs out.

Every error answer raises a :mod:`sundial_client.errors` exception carrying the server's ``code``
and fields; an unreachable server raises :class:`~sundial_client.errors.ConnectionFailed`.
"""

from __future__ import annotations

import os
from typing import Any, AsyncIterator, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import quote

import httpx

from . import _ops as ops
from . import models as m
from ._ops import Duration, Op, Page, Time
from ._version import __version__ as _version
from .errors import ConnectionFailed, error_from_response

__all__ = ["Client", "AsyncClient", "Page", "DEFAULT_URL", "DEFAULT_NAMESPACE", "in_namespace"]

#: Where the clients connect when given no URL and ``SUNDIAL_URL`` is not set.
DEFAULT_URL = "http://127.0.0.1:7373"

#: The namespace of requests without a ``/v1/namespaces/{ns}/`` prefix.
DEFAULT_NAMESPACE = "default"

#: Routes every namespace shares (tokens, namespaces, the audit log): never under a namespace.
_SHARED_ROUTES = ("/v1/tokens", "/v1/namespaces", "/v1/audit")


def _base_url(url: Optional[str]) -> str:
    return (url or os.environ.get("SUNDIAL_URL") or DEFAULT_URL).rstrip("/")


def _namespace(namespace: Optional[str]) -> Optional[str]:
    """The namespace a client acts in: the argument, else ``$SUNDIAL_NAMESPACE``; ``None`` for
    the default namespace (whose paths take no prefix)."""
    ns = namespace if namespace is not None else os.environ.get("SUNDIAL_NAMESPACE")
    return ns if ns and ns != DEFAULT_NAMESPACE else None


def _shared(path: str) -> bool:
    return any(path == r or path.startswith((r + "/", r + "?", r + ":")) for r in _SHARED_ROUTES)


def in_namespace(namespace: Optional[str], path: str) -> str:
    """The path of an API route in ``namespace``: ``/v1/tasks`` in ``acme`` is
    ``/v1/namespaces/acme/tasks``. The default namespace (or ``None``), the routes all
    namespaces share (``/v1/tokens``, ``/v1/namespaces``, ``/v1/audit``) and paths outside
    ``/v1/`` (``/healthz``, ``/metrics``) keep their path."""
    if not namespace or namespace == DEFAULT_NAMESPACE or not path.startswith("/v1/") or _shared(path):
        return path
    return f"/v1/namespaces/{quote(namespace, safe='')}/{path[len('/v1/'):]}"


def _headers(token: Optional[str], headers: Optional[Mapping[str, str]]) -> Dict[str, str]:
    h = {"User-Agent": f"sundial-client-python/{_version}", "Accept": "application/json"}
    token = token if token is not None else os.environ.get("SUNDIAL_TOKEN")
    if token:
        h["Authorization"] = f"Bearer {token}"
    if headers:
        h.update(headers)
    return h


def _request_kwargs(op: Op) -> Dict[str, Any]:
    kw: Dict[str, Any] = {}
    if op.params:
        kw["params"] = op.params
    if op.has_body:
        kw["json"] = op.body
    headers = dict(op.headers or {})
    if op.method not in ("GET", "HEAD", "OPTIONS") and not op.has_body:
        # A bodiless write still says it speaks JSON: the server refuses writes a browser could
        # send cross-site with 415 (README, Security).
        headers.setdefault("Content-Type", "application/json")
    if headers:
        kw["headers"] = headers
    return kw


def _answer(op: Op, resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        try:
            body: Any = resp.json()
        except ValueError:
            body = resp.text
        err = error_from_response(resp.status_code, body)
        retry_after = resp.headers.get("retry-after", "")
        if retry_after.strip().isdigit():
            err.retry_after = float(retry_after.strip())
        raise err
    if op.text:
        return resp.text
    if resp.status_code == 204 or not resp.content:
        return op.parse(None)
    return op.parse(resp.json())


def _transport_error(op: Op, e: httpx.TransportError) -> ConnectionFailed:
    err = ConnectionFailed(f"{op.method} {op.path}: {type(e).__name__}: {e}")
    err.__cause__ = e
    return err


class _Methods:
    """The methods both flavours share. ``_run`` carries out one operation; the async client's
    returns a coroutine, so each method here returns whatever ``_run`` returns."""

    def _run(self, op: Op) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    # tasks

    def create_task(
        self,
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
        exclusive: Any = None,
        tags: Optional[Mapping[str, str]] = None,
        target: Any = None,
        traceparent: Optional[str] = None,
        tracestate: Optional[str] = None,
        **extra: Any,
    ) -> Any:
        """Create a task (``POST /v1/tasks``) and return the stored :class:`~sundial_client.Task`.

        ``delay`` and ``timeout`` take seconds, a ``timedelta`` or a wire string (``"30s"``);
        ``run_at`` a datetime or an RFC 3339 string; ``exclusive`` a key or ``{"key", "mode"}``;
        ``target`` a URL or ``{"url", "method", "headers", "timeout"}``: Sundial calls it at the
        due time (push delivery) instead of handing the task to a worker.
        ``traceparent`` (and ``tracestate``), W3C trace context headers, make the task part of the
        caller's trace. Further keyword arguments are sent as they are (fields newer than this
        client)."""
        body = ops.task_body(
            kind,
            queue=queue,
            key=key,
            payload=payload,
            run_at=run_at,
            delay=delay,
            max_attempts=max_attempts,
            backoff=backoff,
            timeout=timeout,
            exclusive=exclusive,
            tags=tags,
            target=target,
            **extra,
        )
        return self._run(ops.create_task(body, traceparent, tracestate))

    def create_tasks(
        self,
        tasks: Iterable[Mapping[str, Any]],
        *,
        traceparent: Optional[str] = None,
        tracestate: Optional[str] = None,
    ) -> Any:
        """Create many tasks in one transaction (``POST /v1/tasks:batch``). Each item takes the
        arguments of :meth:`create_task` as a dict. Returns one ``BatchCreated`` or
        ``BatchDuplicate`` per item, in order. ``traceparent``: as for :meth:`create_task`, for
        every task of the batch."""
        return self._run(ops.create_tasks(tasks, traceparent, tracestate))

    def get_task(self, task_id: str) -> Any:
        return self._run(ops.get_task(task_id))

    def list_tasks_page(
        self,
        *,
        queue: Optional[str] = None,
        kind: Optional[str] = None,
        state: Optional[str] = None,
        key: Optional[str] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
        **filters: Any,
    ) -> Any:
        """One page of tasks, newest first (a :class:`Page`). More filters: ``key_prefix``,
        ``tag`` (``{"k": "v"}`` or ``"k:v"`` strings), ``error_group`` (the first line of the
        last error, as the dead letters group them), ``due_after``, ``due_before``,
        ``created_after``, ``created_before``."""
        return self._run(
            ops.list_tasks(queue=queue, kind=kind, state=state, key=key, limit=limit, cursor=cursor, **filters)
        )

    def cancel_task(self, task_id: str) -> Any:
        return self._run(ops.cancel_task(task_id))

    def trigger_task(self, task_id: str) -> Any:
        return self._run(ops.trigger_task(task_id))

    def retry_task(self, task_id: str, run_at: Optional[Time] = None) -> Any:
        """Run a dead or cancelled task again (now, or at ``run_at``)."""
        return self._run(ops.retry_task(task_id, run_at))

    def list_attempts(self, task_id: str) -> Any:
        """The task's kept attempts, oldest first, and how many it had in all: ``(attempts, total)``."""
        return self._run(ops.list_attempts(task_id))

    def cancel_tasks(self, **filters: Any) -> Any:
        """Cancel every live task matching the filters (``queue``, ``kind``, ``state``,
        ``key_prefix``, ``tag``, ``error_group``, ``due_*``, ``created_*``; ``dry_run=True`` only
        counts)."""
        return self._run(ops.bulk("cancel", filters))

    def retry_tasks(self, **filters: Any) -> Any:
        """Run again every dead or cancelled task matching the filters (``run_at`` for when)."""
        return self._run(ops.bulk("retry", filters))

    # queues

    def list_queues(self) -> Any:
        return self._run(ops.list_queues())

    def get_queue(self, queue: str) -> Any:
        return self._run(ops.get_queue(queue))

    def pause_queue(self, queue: str) -> Any:
        """While paused nothing of the queue starts; creates are still accepted."""
        return self._run(ops.pause_queue(queue))

    def resume_queue(self, queue: str) -> Any:
        return self._run(ops.resume_queue(queue))

    def set_queue_settings(
        self,
        queue: str,
        *,
        target: Optional[Mapping[str, Any]] = None,
        retention: Optional[Mapping[str, Any]] = None,
        concurrency: Optional[int] = None,
    ) -> Any:
        """Replace a queue's settings: its default push ``target`` (``{"url": …, "method"?,
        "headers"?, "timeout"?}``; tasks of the queue created without a target are delivered to
        it), its ``retention`` overrides and its ``concurrency`` limit (at most that many of the
        queue's tasks run at once, on every node: handlers, push calls and workers alike). The
        whole settings object is replaced: a field left out is cleared (``target=None`` removes
        the default target, ``concurrency=None`` the limit). Answers the :class:`Queue`."""
        return self._run(
            ops.set_queue_settings(
                queue, {"target": target, "retention": retention, "concurrency": concurrency}
            )
        )

    # push signing secrets (admin)

    def list_push_secrets(self) -> Any:
        """Every signing secret, oldest first, masked, with whether it signs now."""
        return self._run(ops.list_push_secrets())

    def add_push_secret(self, secret: Optional[str] = None) -> Any:
        """Add a signing secret (``whsec_…``; generated when not given). The answer holds it in
        full, this once."""
        return self._run(ops.add_push_secret(secret))

    def rotate_push_secret(self, secret: Optional[str] = None, *, overlap: Optional[Duration] = None) -> Any:
        """Add a secret; the other active ones stop signing after ``overlap`` (server default
        ``24h``; ``0`` stops them at once). Both signatures are sent meanwhile."""
        return self._run(ops.rotate_push_secret(secret, overlap))

    def revoke_push_secret(self, secret_id: str) -> Any:
        """Stop a secret signing now; answers the secrets as :meth:`list_push_secrets` does."""
        return self._run(ops.revoke_push_secret(secret_id))

    # the worker protocol (the Worker uses these; they are here for custom loops)

    def poll(
        self,
        queue: str,
        worker: str,
        *,
        max: Optional[int] = None,
        wait: Optional[Duration] = None,
        kinds: Optional[Sequence[str]] = None,
    ) -> Any:
        """Long-poll ``queue``: the tasks now running for ``worker`` (maybe none)."""
        return self._run(ops.poll(queue, worker, max=max, wait=wait, kinds=kinds))

    def complete_and_poll(
        self,
        queue: str,
        worker: str,
        task_id: str,
        execution_id: str,
        result: Any = None,
        *,
        max: Optional[int] = None,
        wait: Optional[Duration] = None,
        kinds: Optional[Sequence[str]] = None,
    ) -> Any:
        """Record success of ``task_id`` (as :meth:`complete`) and long-poll ``queue`` (as
        :meth:`poll`) in one request: a :class:`~sundial_client.CompleteAndPoll` with the
        ``completed`` task and the ``tasks`` now running for ``worker`` (maybe none); the first
        one's claim commits with the result. A refused completion raises as :meth:`complete`
        would (``NotFound`` or ``StaleExecution`` with ``field`` ``complete.task_id``,
        ``TooLarge`` with ``complete.result``) and polls nothing. Sending the same completion
        again (after a lost answer) counts as recorded."""
        return self._run(
            ops.complete_and_poll(
                queue, worker, task_id, execution_id, result, max=max, wait=wait, kinds=kinds
            )
        )

    def heartbeat(self, task_id: str, execution_id: str) -> Any:
        return self._run(ops.heartbeat(task_id, execution_id))

    def complete(
        self, task_id: str, execution_id: str, result: Any = None, *, traceparent: Optional[str] = None
    ) -> Any:
        """Record success; ``traceparent``: the W3C context of the run, continued by the server."""
        return self._run(ops.complete(task_id, execution_id, result, traceparent))

    def fail(
        self,
        task_id: str,
        execution_id: str,
        error: Optional[str] = None,
        *,
        retryable: Optional[bool] = None,
        traceparent: Optional[str] = None,
    ) -> Any:
        return self._run(ops.fail(task_id, execution_id, error, retryable, traceparent))

    # schedules

    def create_schedule(self, **fields: Any) -> Any:
        """Create a schedule: ``cron=`` or ``every=``, ``task={"kind": ...}`` and the other
        ``ScheduleRequest`` fields (``id``, ``timezone``, ``overlap``, ``catchup_window``, ...)."""
        return self._run(ops.create_schedule(fields))

    def update_schedule(self, schedule_id: str, **fields: Any) -> Any:
        return self._run(ops.update_schedule(schedule_id, fields))

    def get_schedule(self, schedule_id: str) -> Any:
        return self._run(ops.get_schedule(schedule_id))

    def delete_schedule(self, schedule_id: str) -> Any:
        return self._run(ops.delete_schedule(schedule_id))

    def list_schedules_page(self, *, limit: Optional[int] = None, cursor: Optional[str] = None) -> Any:
        return self._run(ops.list_schedules(limit=limit, cursor=cursor))

    def pause_schedule(self, schedule_id: str, note: Optional[str] = None) -> Any:
        return self._run(ops.pause_schedule(schedule_id, note))

    def unpause_schedule(self, schedule_id: str, note: Optional[str] = None) -> Any:
        return self._run(ops.unpause_schedule(schedule_id, note))

    def trigger_schedule(self, schedule_id: str) -> Any:
        """Fire the schedule now (a :class:`~sundial_client.Fire`)."""
        return self._run(ops.trigger_schedule(schedule_id))

    def backfill_schedule(self, schedule_id: str, start: Time, end: Time, *, overlap: Optional[str] = None) -> Any:
        """Fire every time in ``[start, end]`` not fired before: ``(fires, already_recorded)``;
        ``overlap`` overrides the schedule's overlap policy for these fires."""
        return self._run(ops.backfill_schedule(schedule_id, start, end, overlap))

    def list_fires_page(self, schedule_id: str, *, limit: Optional[int] = None, before: Optional[str] = None) -> Any:
        return self._run(ops.list_fires(schedule_id, limit=limit, before=before))

    def preview_schedule(self, start: Time, **fields: Any) -> Any:
        """The fire times a schedule would have from ``start`` (``cron``/``every``, ``count``...)."""
        return self._run(ops.preview_schedule({"from": start, **fields}))

    # workflows

    def start_workflow(
        self,
        workflow_type: str,
        input: Any = None,
        *,
        workflow_id: Optional[str] = None,
        id_reuse: Optional[str] = None,
    ) -> Any:
        """Start a workflow run (a :class:`~sundial_client.WorkflowStarted`)."""
        return self._run(ops.start_workflow(workflow_type, input, workflow_id=workflow_id, id_reuse=id_reuse))

    def signal_workflow(self, workflow_id: str, name: str, input: Any = None) -> Any:
        return self._run(ops.signal_workflow(workflow_id, name, input))

    def get_workflow(self, workflow_id: str) -> Any:
        return self._run(ops.get_workflow(workflow_id))

    def list_workflows_page(
        self,
        *,
        workflow_type: Optional[str] = None,
        status: Optional[str] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> Any:
        return self._run(ops.list_workflows(workflow_type=workflow_type, status=status, limit=limit, cursor=cursor))

    def cancel_workflow(self, workflow_id: str, reason: Optional[str] = None) -> Any:
        return self._run(ops.cancel_workflow(workflow_id, reason))

    def terminate_workflow(self, workflow_id: str, reason: Optional[str] = None) -> Any:
        return self._run(ops.terminate_workflow(workflow_id, reason))

    def workflow_history(self, workflow_id: str) -> Any:
        return self._run(ops.workflow_history(workflow_id))

    # service

    def health(self) -> Any:
        return self._run(ops.health())

    def metrics(self) -> Any:
        """The Prometheus text of ``/metrics``."""
        return self._run(ops.metrics())

    def request(self, method: str, path: str, *, json: Any = None, content: Optional[bytes] = None) -> Any:
        """Any request, answered with parsed JSON (or raising the matching error): for routes this
        client has no method for yet."""
        op = Op(method.upper(), path, body=json, has_body=json is not None)
        op.headers = {"Content-Type": "application/json"} if content is not None else None
        return self._run_raw(op, content)

    def _run_raw(self, op: Op, content: Optional[bytes]) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError


class Client(_Methods):
    """Blocking client. ``Client(url, token=...)``; use as a context manager or call
    :meth:`close`. ``url`` defaults to ``$SUNDIAL_URL``, else ``http://127.0.0.1:7373``; ``token``
    (default ``$SUNDIAL_TOKEN``) is sent as ``Authorization: Bearer``. ``timeout`` is in seconds
    and applies to every request except polls, which wait up to their ``wait`` longer.
    ``namespace`` (default ``$SUNDIAL_NAMESPACE``, else ``default``) is the namespace every
    request acts in: its paths go under ``/v1/namespaces/{ns}/``, except the routes all
    namespaces share (tokens, namespaces, the audit log); see :func:`in_namespace`."""

    def __init__(
        self,
        url: Optional[str] = None,
        *,
        token: Optional[str] = None,
        timeout: float = 30.0,
        headers: Optional[Mapping[str, str]] = None,
        transport: Optional[httpx.BaseTransport] = None,
        namespace: Optional[str] = None,
    ) -> None:
        self.url = _base_url(url)
        #: The namespace this client acts in (``None``: the default one).
        self.namespace = _namespace(namespace)
        self._timeout = timeout
        self._http = httpx.Client(
            base_url=self.url, headers=_headers(token, headers), timeout=timeout, transport=transport
        )

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, op: Op, **kw: Any) -> httpx.Response:
        timeout = self._timeout
        if op.path.endswith("/poll") and isinstance(op.body, dict) and "wait" in op.body:
            timeout += m.parse_duration(op.body["wait"])
        elif op.path.endswith("/poll"):
            timeout += 60.0
        try:
            return self._http.request(op.method, in_namespace(self.namespace, op.path), timeout=timeout, **kw)
        except httpx.TransportError as e:
            raise _transport_error(op, e) from e

    def _run(self, op: Op) -> Any:
        return _answer(op, self._send(op, **_request_kwargs(op)))

    def _run_raw(self, op: Op, content: Optional[bytes]) -> Any:
        kw = _request_kwargs(op)
        if content is not None:
            kw["content"] = content
        return _answer(op, self._send(op, **kw))

    def _iter(self, fetch: Any, cursor_name: str = "cursor", **kw: Any) -> Iterator[Any]:
        cursor: Optional[str] = None
        while True:
            page: Page = fetch(**kw, **({cursor_name: cursor} if cursor else {}))
            yield from page.items
            # A page may be short, even empty, and still have a cursor: the server bounds
            # the tasks one page visits. Only the end of the cursors ends the iteration.
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def iter_tasks(self, **filters: Any) -> Iterator[m.Task]:
        """Every task matching the filters (``queue``, ``kind``, ``state``, ``key``), newest
        first, fetching ``limit`` per page as the iteration goes."""
        return self._iter(self.list_tasks_page, **filters)

    def list_tasks(self, **filters: Any) -> List[m.Task]:
        """Every matching task (all pages) as a list."""
        return list(self.iter_tasks(**filters))

    def iter_schedules(self, *, limit: Optional[int] = None) -> Iterator[m.Schedule]:
        return self._iter(self.list_schedules_page, limit=limit)

    def list_schedules(self, *, limit: Optional[int] = None) -> List[m.Schedule]:
        return list(self.iter_schedules(limit=limit))

    def iter_fires(self, schedule_id: str, *, limit: Optional[int] = None) -> Iterator[m.Fire]:
        return self._iter(lambda **kw: self.list_fires_page(schedule_id, **kw), "before", limit=limit)

    def iter_workflows(self, **filters: Any) -> Iterator[m.Workflow]:
        return self._iter(self.list_workflows_page, **filters)

    def list_workflows(self, **filters: Any) -> List[m.Workflow]:
        return list(self.iter_workflows(**filters))


class AsyncClient(_Methods):
    """The asyncio flavour of :class:`Client`: the same methods, as coroutines; the ``iter_*``
    listings are async iterators. Use ``async with AsyncClient(...)`` or ``await aclose()``."""

    def __init__(
        self,
        url: Optional[str] = None,
        *,
        token: Optional[str] = None,
        timeout: float = 30.0,
        headers: Optional[Mapping[str, str]] = None,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        namespace: Optional[str] = None,
    ) -> None:
        self.url = _base_url(url)
        #: The namespace this client acts in (``None``: the default one).
        self.namespace = _namespace(namespace)
        self._timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=_headers(token, headers), timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, op: Op, **kw: Any) -> httpx.Response:
        timeout = self._timeout
        if op.path.endswith("/poll") and isinstance(op.body, dict) and "wait" in op.body:
            timeout += m.parse_duration(op.body["wait"])
        elif op.path.endswith("/poll"):
            timeout += 60.0
        try:
            return await self._http.request(
                op.method, in_namespace(self.namespace, op.path), timeout=timeout, **kw
            )
        except httpx.TransportError as e:
            raise _transport_error(op, e) from e

    async def _run(self, op: Op) -> Any:
        return _answer(op, await self._send(op, **_request_kwargs(op)))

    async def _run_raw(self, op: Op, content: Optional[bytes]) -> Any:
        kw = _request_kwargs(op)
        if content is not None:
            kw["content"] = content
        return _answer(op, await self._send(op, **kw))

    async def _iter(self, fetch: Any, cursor_name: str = "cursor", **kw: Any) -> AsyncIterator[Any]:
        cursor: Optional[str] = None
        while True:
            page: Page = await fetch(**kw, **({cursor_name: cursor} if cursor else {}))
            for item in page.items:
                yield item
            # A page may be short, even empty, and still have a cursor: the server bounds
            # the tasks one page visits. Only the end of the cursors ends the iteration.
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def iter_tasks(self, **filters: Any) -> AsyncIterator[m.Task]:
        return self._iter(self.list_tasks_page, **filters)

    async def list_tasks(self, **filters: Any) -> List[m.Task]:
        return [t async for t in self.iter_tasks(**filters)]

    def iter_schedules(self, *, limit: Optional[int] = None) -> AsyncIterator[m.Schedule]:
        return self._iter(self.list_schedules_page, limit=limit)

    async def list_schedules(self, *, limit: Optional[int] = None) -> List[m.Schedule]:
        return [s async for s in self.iter_schedules(limit=limit)]

    def iter_fires(self, schedule_id: str, *, limit: Optional[int] = None) -> AsyncIterator[m.Fire]:
        return self._iter(lambda **kw: self.list_fires_page(schedule_id, **kw), "before", limit=limit)

    def iter_workflows(self, **filters: Any) -> AsyncIterator[m.Workflow]:
        return self._iter(self.list_workflows_page, **filters)

    async def list_workflows(self, **filters: Any) -> List[m.Workflow]:
        return [w async for w in self.iter_workflows(**filters)]
