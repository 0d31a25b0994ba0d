"""The Worker against the real server: completing and failing, heartbeats keeping a long task's
lease, a 409 taking the attempt back, surviving a server restart, backing off on 503, and a
graceful stop on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx

from sundial_client import AsyncClient, Permanent, Worker

from conftest import REPO, wait_for


def start_in_thread(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    assert worker.started.wait(10), "the worker did not start"
    return t


def stop(worker: Worker, thread: threading.Thread) -> None:
    worker.stop()
    thread.join(20)
    assert not thread.is_alive(), "the worker did not stop"


def test_worker_completes_and_fails(client, shared_server, queue):
    def handler(job):
        if job.kind == "bad":
            raise RuntimeError("handler exploded")
        if job.kind == "fatal":
            raise Permanent("no point retrying")
        return {"doubled": job.payload * 2}

    worker = Worker(queue, handler, concurrency=4, url=shared_server.url, poll_wait=1)
    thread = start_in_thread(worker)
    try:
        ok = client.create_task("double", queue=queue, payload=21)
        bad = client.create_task("bad", queue=queue, max_attempts=2, backoff={"initial": "50ms", "jitter": 0})
        fatal = client.create_task("fatal", queue=queue, max_attempts=5)
        done = wait_for(lambda: (t := client.get_task(ok.id)).finished and t)
        assert done.state == "succeeded" and done.result == {"doubled": 42}
        dead = wait_for(lambda: (t := client.get_task(bad.id)).finished and t)
        assert dead.state == "dead" and dead.attempt == 2 and "handler exploded" in (dead.last_error or "")
        permanent = wait_for(lambda: (t := client.get_task(fatal.id)).finished and t)
        assert permanent.state == "dead" and permanent.attempt == 1
        assert permanent.last_error == "no point retrying"
    finally:
        stop(worker, thread)
    assert worker.completed == 1 and worker.failed == 3


def test_concurrency_and_async_handlers(client, shared_server, queue):
    active, peak = 0, 0
    lock = threading.Lock()

    async def handler(job):
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        await asyncio.sleep(0.3)
        with lock:
            active -= 1
        return job.payload

    worker = Worker(queue, handler, concurrency=3, url=shared_server.url, poll_wait=1)
    thread = start_in_thread(worker)
    try:
        ids = [t.id for t in (client.create_task("k", queue=queue, payload=i) for i in range(9))]
        wait_for(lambda: all(client.get_task(i).state == "succeeded" for i in ids), timeout=20)
    finally:
        stop(worker, thread)
    assert peak == 3


def test_heartbeats_keep_a_long_task(client, shared_server, queue):
    def handler(job):
        time.sleep(2.5)  # well past the 1 s timeout: only heartbeats keep the lease
        return "slow but fine"

    worker = Worker(queue, handler, url=shared_server.url, poll_wait=1)
    thread = start_in_thread(worker)
    try:
        t = client.create_task("slow", queue=queue, timeout=1, max_attempts=1)
        done = wait_for(lambda: (x := client.get_task(t.id)).finished and x, timeout=20)
        assert done.state == "succeeded" and done.attempt == 1 and done.result == "slow but fine"
    finally:
        stop(worker, thread)


def test_a_409_takes_the_attempt_back(client, shared_server, queue):
    saw_lost = threading.Event()

    def handler(job):
        if job.wait_lost(10):
            saw_lost.set()
        return "too late"

    worker = Worker(queue, handler, url=shared_server.url, poll_wait=1, heartbeat_interval=0.1)
    thread = start_in_thread(worker)
    try:
        t = client.create_task("k", queue=queue)
        wait_for(lambda: client.get_task(t.id).state == "running")
        client.cancel_task(t.id)
        assert saw_lost.wait(10), "the handler never heard that the attempt was lost"
        wait_for(lambda: worker.lost == 1)
        assert client.get_task(t.id).state == "cancelled"
    finally:
        stop(worker, thread)
    assert worker.completed == 0


def test_worker_survives_a_server_restart(server):
    client = server.client()
    release = threading.Event()

    def handler(job):
        if job.kind == "hold":
            release.wait(30)
        return job.kind

    worker = Worker("restart", handler, concurrency=2, url=server.url, poll_wait=1, max_backoff=0.5)
    thread = start_in_thread(worker)
    try:
        first = client.create_task("first", queue="restart")
        wait_for(lambda: client.get_task(first.id).state == "succeeded")
        held = client.create_task("hold", queue="restart", timeout=60)
        wait_for(lambda: client.get_task(held.id).state == "running")

        server.restart(signal.SIGKILL)  # same port and data directory
        release.set()  # the held task's completion now has to wait for the server
        after = client.create_task("after", queue="restart")
        wait_for(lambda: client.get_task(after.id).state == "succeeded", timeout=30)
        done = wait_for(lambda: (t := client.get_task(held.id)).finished and t, timeout=30)
        assert done.state == "succeeded" and done.result == "hold" and done.attempt == 1
    finally:
        stop(worker, thread)
        client.close()


def test_backs_off_on_503_then_polls_again():
    calls = {"poll": 0, "complete": 0}
    times = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/poll"):
            calls["poll"] += 1
            times.append(time.monotonic())
            if calls["poll"] <= 3:
                return httpx.Response(503, json={"error": {"code": "unavailable", "message": "shard moving"}})
            if calls["poll"] == 4:
                task = {
                    "id": "00000000-0000-0000-0000-000000000001",
                    "queue": "q",
                    "kind": "k",
                    "key": None,
                    "payload": None,
                    "attempt": 1,
                    "max_attempts": 5,
                    "execution_id": "00000000-0000-0000-0000-0000000000e1",
                    "lease_expires_at": "2030-01-01T00:00:00Z",
                    "run_at": "2030-01-01T00:00:00Z",
                    "timeout": "5m",
                }
                return httpx.Response(200, json={"tasks": [task]})
            await asyncio.sleep(0.05)
            return httpx.Response(200, json={"tasks": []})
        if request.url.path.endswith("/complete"):
            calls["complete"] += 1
            if calls["complete"] == 1:
                return httpx.Response(503, json={"error": {"code": "shutting_down", "message": "bye"}})
            return httpx.Response(200, json={})
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "?"}})

    async def main():
        client = AsyncClient("http://stub", transport=httpx.MockTransport(handler))
        worker = Worker("q", lambda job: "ok", client=client, poll_wait=0.1, max_backoff=0.4, handle_signals=False)
        run = asyncio.ensure_future(worker.run_async())
        for _ in range(200):
            if worker.completed:
                break
            await asyncio.sleep(0.02)
        worker.stop()
        await asyncio.wait_for(run, 5)
        await client.aclose()
        return worker

    worker = asyncio.run(main())
    assert worker.completed == 1
    assert calls["complete"] == 2  # the 503 on complete was retried
    gaps = [b - a for a, b in zip(times, times[1:4])]
    assert all(g >= 0.04 for g in gaps), gaps  # backed off between the refused polls


WORKER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {src!r})
    from sundial_client import Worker

    def handler(job):
        print("started", job.id, flush=True)
        time.sleep(1.0)
        return "finished after SIGTERM"

    Worker("graceful", handler, url={url!r}, poll_wait=1).run()
    print("stopped", flush=True)
    """
)


def test_sigterm_lets_running_tasks_finish(client, shared_server, tmp_path: Path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT.format(src=str(REPO / "clients" / "python" / "src"), url=shared_server.url))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        task = client.create_task("k", queue="graceful")
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("started"), line
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0
        assert "stopped" in out
        done = client.get_task(task.id)
        assert done.state == "succeeded" and done.result == "finished after SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_worker_runs_the_handler_in_the_tasks_trace(client, shared_server, queue):
    """A task created with a ``traceparent`` is polled with it (the server exports nothing here, so
    the context is the caller's, unchanged); the trace hook is entered around the handler in the
    handler's own thread, and the context the hook leaves on the job goes back with the result."""
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    handler_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111222233334444-01"
    seen = {}
    sent = []

    class Recording(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request):
            if request.url.path.endswith("/complete"):
                sent.append(request.headers.get("traceparent"))
            return await self.inner.handle_async_request(request)

    from contextlib import contextmanager

    @contextmanager
    def hook(job):
        seen["hook"] = (job.traceparent, job.tracestate, threading.get_ident())
        job.traceparent = handler_span
        yield

    def handler(job):
        seen["handler"] = (job.traceparent, threading.get_ident())
        return "ok"

    worker_client = AsyncClient(shared_server.url, transport=Recording())
    worker = Worker(queue, handler, client=worker_client, poll_wait=1, trace_hook=hook)
    thread = start_in_thread(worker)
    try:
        task = client.create_task("traced", queue=queue, traceparent=caller, tracestate="congo=t61rcWkgMzE")
        assert task.traceparent == caller and task.tracestate == "congo=t61rcWkgMzE"
        done = wait_for(lambda: (t := client.get_task(task.id)).finished and t)
        assert done.state == "succeeded"
    finally:
        stop(worker, thread)
        asyncio.run(worker_client.aclose())
    assert seen["hook"][:2] == (caller, "congo=t61rcWkgMzE")
    assert seen["handler"][0] == handler_span, "the handler runs inside the hook"
    assert seen["hook"][2] == seen["handler"][1], "the hook is entered in the handler's thread"
    assert sent == [handler_span], "the result is reported from the handler's span"


def test_a_malformed_traceparent_is_ignored(client, queue):
    task = client.create_task("k", queue=queue, traceparent="not-a-traceparent")
    assert task.traceparent is None
    (item,) = client.create_tasks([{"kind": "k", "queue": queue}], traceparent="00-" + "0" * 32 + "-" + "1" * 16 + "-01")
    assert client.get_task(item.id).traceparent is None
