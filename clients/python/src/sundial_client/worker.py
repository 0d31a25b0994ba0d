"""A worker for remote task execution over the long-poll protocol.

``Worker(queue, handler, concurrency=4).run()`` polls ``queue``, runs up to ``concurrency`` tasks
at once, heartbeats each task while its handler runs (every third of the task's ``timeout``), then
completes it with the handler's return value or fails it with the exception's text (retried by
the server while attempts remain; raise :class:`Permanent` to fail for good).

Failure handling:

- a ``409`` (or ``404``) on a heartbeat means the attempt no longer belongs to this worker (its
  lease ran out and another attempt may run): ``job.lost`` becomes true, and the handler's outcome
  is dropped rather than reported;
- ``503``, ``429``, ``5xx`` and connection errors back off exponentially (with jitter, up to
  ``max_backoff``) and retry: polls until the server is back, a task's completion until its lease
  would have run out;
- SIGTERM and SIGINT (when ``run`` is called from the main thread) stop polling, let running
  handlers finish and report, then return. The poll in flight is awaited rather than cut off (so
  no task the server has just handed out is dropped): stopping takes up to ``poll_wait``.

Handlers may be plain functions (run in a thread pool of ``concurrency`` threads) or coroutine
functions (run on the worker's event loop). Both receive a :class:`Job`.

Traces: a task created with a W3C ``traceparent`` is polled with the context of its delivery
(``job.traceparent``, ``job.tracestate``). The handler runs with it (pass it on in its own calls),
and the worker sends ``job.traceparent`` with the complete or fail, so the server's record of the
result joins the trace. ``trace_hook`` (optional, no tracing library needed otherwise) is a
function ``hook(job)`` returning a context manager entered around the handler, in the thread (or
task) the handler runs in: with OpenTelemetry it starts a span whose parent is
``job.traceparent``, and sets ``job.traceparent`` to that span's context so the result is
recorded as its child (see the package README).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import random
import signal
import socket
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, ContextManager, Optional, Sequence, Set

from .client import AsyncClient
from .errors import ApiError, ConnectionFailed, Conflict, InternalError, NotFound, RateLimited, Unavailable
from .models import PolledTask, parse_duration

__all__ = ["Worker", "Job", "Permanent"]

log = logging.getLogger("sundial_client.worker")


class Permanent(Exception):
    """Raise from a handler to fail the task for good (``dead``), without further attempts."""


class Job:
    """A task this worker runs: the :class:`~sundial_client.PolledTask` fields (``id``, ``kind``,
    ``payload``, ``attempt``, ...) plus ``lost``, true once the server has taken the attempt back
    (a long handler should check it and give up)."""

    def __init__(self, task: PolledTask) -> None:
        self.task = task
        #: The W3C trace context the handler runs in (the task's delivery, for a traced task); a
        #: trace hook may set it to its own span's, which the worker then sends with the result.
        self.traceparent: Optional[str] = task.traceparent
        self.tracestate: Optional[str] = task.tracestate
        self._lost = threading.Event()

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Block up to ``timeout`` seconds until the attempt is lost; whether it was."""
        return self._lost.wait(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def __repr__(self) -> str:
        return f"Job(id={self.task.id!r}, kind={self.task.kind!r}, attempt={self.task.attempt})"


def _retryable(e: BaseException) -> bool:
    return isinstance(e, (ConnectionFailed, Unavailable, RateLimited, InternalError)) or (
        isinstance(e, ApiError) and e.status >= 500
    )


class Worker:
    """Runs ``handler`` for the tasks of ``queue``; see the module documentation."""

    def __init__(
        self,
        queue: str,
        handler: Callable[[Job], Any],
        concurrency: int = 1,
        *,
        url: Optional[str] = None,
        token: Optional[str] = None,
        client: Optional[AsyncClient] = None,
        name: Optional[str] = None,
        kinds: Optional[Sequence[str]] = None,
        poll_wait: float = 5.0,
        heartbeat_interval: Optional[float] = None,
        max_backoff: float = 10.0,
        handle_signals: bool = True,
        trace_hook: Optional[Callable[[Job], ContextManager[Any]]] = None,
        namespace: Optional[str] = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if client is not None and namespace is not None:
            # The client's own namespace is the one it polls; a second one would be ignored.
            raise ValueError("pass namespace to the client, not beside it")
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.kinds = list(kinds) if kinds is not None else None
        self.poll_wait = poll_wait
        self.heartbeat_interval = heartbeat_interval
        self.max_backoff = max_backoff
        self.handle_signals = handle_signals
        self.trace_hook = trace_hook
        self._url = url
        self._token = token
        self._namespace = namespace
        self._client = client
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stop: Optional[asyncio.Event] = None
        self._stop_requested = threading.Event()
        #: Counts of outcomes so far: tasks completed, failed, and lost (taken back by the server).
        self.completed = 0
        self.failed = 0
        self.lost = 0
        #: Set once the worker is polling (useful to wait for it from another thread).
        self.started = threading.Event()

    # --- control -------------------------------------------------------------------------------

    def run(self) -> None:
        """Run until stopped (SIGTERM, SIGINT or :meth:`stop`)."""
        asyncio.run(self.run_async())

    def stop(self) -> None:
        """Ask the worker to stop: no new polls; running handlers finish and report. Safe from
        any thread and from a signal handler."""
        self._stop_requested.set()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop already ended

    async def run_async(self) -> None:
        """The worker's loop, on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stop_requested.is_set():
            self._stop.set()
        own_client = self._client is None
        client = self._client or AsyncClient(self._url, token=self._token, namespace=self._namespace)
        installed = self._install_signals()
        executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="sundial-worker")
        running: Set[asyncio.Task[None]] = set()
        try:
            await self._poll_loop(client, executor, running)
            if running:
                log.info("stopping: waiting for %d running task(s)", len(running))
                await asyncio.gather(*running, return_exceptions=True)
        finally:
            for sig in installed:
                self._loop.remove_signal_handler(sig)
            executor.shutdown(wait=False)
            if own_client:
                await client.aclose()
            self.started.clear()

    def _install_signals(self) -> list:
        installed: list = []
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return installed
        assert self._loop is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._loop.add_signal_handler(sig, self.stop)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not on this platform
        return installed

    # --- polling -------------------------------------------------------------------------------

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        assert self._stop is not None
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass

    def _next_backoff(self, current: float) -> float:
        return min(self.max_backoff, max(0.1, current * 2))

    async def _poll_loop(self, client: AsyncClient, executor: ThreadPoolExecutor, running: Set[asyncio.Task[None]]) -> None:
        assert self._stop is not None
        backoff = 0.0
        slot_freed = asyncio.Event()
        self.started.set()
        while not self._stop.is_set():
            free = self.concurrency - len(running)
            if free <= 0:
                slot_freed.clear()
                stop_wait = asyncio.ensure_future(self._stop.wait())
                freed_wait = asyncio.ensure_future(slot_freed.wait())
                await asyncio.wait({stop_wait, freed_wait}, return_when=asyncio.FIRST_COMPLETED)
                stop_wait.cancel()
                freed_wait.cancel()
                continue
            try:
                tasks = await client.poll(self.queue, self.name, max=free, wait=self.poll_wait, kinds=self.kinds)
            except Exception as e:  # noqa: BLE001 - classified below
                if not _retryable(e):
                    raise
                backoff = self._next_backoff(backoff)
                delay = backoff * (0.5 + random.random() / 2)
                # The server's Retry-After, when it gave one, within the backoff's cap.
                if isinstance(e, ApiError) and e.retry_after is not None:
                    delay = max(delay, min(e.retry_after, self.max_backoff))
                log.warning("poll failed (%s); retrying in %.1fs", e, delay)
                await self._sleep_unless_stopped(delay)
                continue
            backoff = 0.0
            for t in tasks:
                job_task = asyncio.ensure_future(self._run_one(client, executor, Job(t)))
                running.add(job_task)

                def done(f: "asyncio.Task[None]") -> None:
                    running.discard(f)
                    slot_freed.set()

                job_task.add_done_callback(done)

    # --- one task ------------------------------------------------------------------------------

    async def _call_handler(self, executor: ThreadPoolExecutor, job: Job) -> Any:
        hook = self.trace_hook
        if inspect.iscoroutinefunction(self.handler):
            if hook is None:
                return await self.handler(job)
            with hook(job):
                return await self.handler(job)
        loop = asyncio.get_running_loop()

        def call() -> Any:
            if hook is None:
                return self.handler(job)
            with hook(job):
                return self.handler(job)

        result = await loop.run_in_executor(executor, call)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _run_one(self, client: AsyncClient, executor: ThreadPoolExecutor, job: Job) -> None:
        timeout = parse_duration(job.task.timeout)
        interval = self.heartbeat_interval or max(timeout / 3.0, 0.05)
        # The lease runs `timeout` from the last heartbeat the server accepted.
        lease_until = [time.monotonic() + timeout]
        beat = asyncio.ensure_future(self._heartbeat_loop(client, job, interval, lease_until))
        outcome: tuple
        try:
            result = await self._call_handler(executor, job)
            outcome = ("complete", result)
        except Permanent as e:
            outcome = ("fail", str(e) or type(e).__name__, False)
        except Exception as e:  # noqa: BLE001 - any handler failure fails the attempt
            text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
            outcome = ("fail", text, True)
        finally:
            beat.cancel()
        if job.lost:
            self.lost += 1
            log.warning("task %s: the attempt was taken back; its outcome is dropped", job.task.id)
            return
        await self._report(client, job, outcome, lease_until)

    async def _heartbeat_loop(self, client: AsyncClient, job: Job, interval: float, lease_until: list) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await client.heartbeat(job.task.id, job.task.execution_id)
                lease_until[0] = time.monotonic() + parse_duration(job.task.timeout)
            except (Conflict, NotFound) as e:
                log.warning("task %s: heartbeat refused (%s): stop working on it", job.task.id, e)
                job._lost.set()
                return
            except Exception as e:  # noqa: BLE001 - keep beating while the lease lasts
                log.warning("task %s: heartbeat failed (%s); retrying", job.task.id, e)

    async def _report(self, client: AsyncClient, job: Job, outcome: tuple, lease_until: list) -> None:
        backoff = 0.0
        while True:
            try:
                if outcome[0] == "complete":
                    await client.complete(
                        job.task.id, job.task.execution_id, outcome[1], traceparent=job.traceparent
                    )
                    self.completed += 1
                else:
                    await client.fail(
                        job.task.id,
                        job.task.execution_id,
                        outcome[1],
                        retryable=outcome[2],
                        traceparent=job.traceparent,
                    )
                    self.failed += 1
                return
            except (Conflict, NotFound) as e:
                self.lost += 1
                log.warning("task %s: the server refused the outcome (%s)", job.task.id, e)
                return
            except Exception as e:  # noqa: BLE001
                if not _retryable(e) or time.monotonic() > lease_until[0]:
                    log.error("task %s: cannot report the outcome (%s); giving up", job.task.id, e)
                    self.lost += 1
                    return
                backoff = self._next_backoff(backoff)
                log.warning("task %s: reporting failed (%s); retrying", job.task.id, e)
                await asyncio.sleep(backoff * (0.5 + random.random() / 2))
