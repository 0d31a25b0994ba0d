"""Namespaces: a client (and a worker) with ``namespace=`` sends its requests under
``/v1/namespaces/{ns}/`` but the shared admin routes as they are; against the real server, a task
created in a namespace is listed, polled and completed there and is absent from the default one;
a create over the namespace's quota is :class:`RateLimited` with code ``quota``."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sundial_client import AsyncClient, Client, NotFound, RateLimited, Worker, in_namespace

from conftest import wait_for
from test_worker import start_in_thread, stop


def _recording_client(seen: list, **kw) -> Client:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path.decode())
        if request.url.path.endswith("/poll"):
            return httpx.Response(200, json={"tasks": []})
        return httpx.Response(200, json={})

    return Client("http://stub", transport=httpx.MockTransport(handler), **kw)


def test_paths_in_a_namespace():
    seen: list = []
    with _recording_client(seen, namespace="acme") as c:
        c.poll("q", "w", wait=0)
        c.request("GET", "/v1/tasks?queue=q")
        c.request("POST", "/v1/tasks:batch", json={"tasks": []})
        c.request("GET", "/v1/tokens")
        c.request("POST", "/v1/namespaces", json={"name": "x"})
        c.request("GET", "/v1/namespaces")
        c.request("GET", "/v1/audit?limit=1")
        c.request("GET", "/healthz")
    assert seen == [
        "/v1/namespaces/acme/queues/q/poll",
        "/v1/namespaces/acme/tasks?queue=q",
        "/v1/namespaces/acme/tasks:batch",
        "/v1/tokens",
        "/v1/namespaces",
        "/v1/namespaces",
        "/v1/audit?limit=1",
        "/healthz",
    ]
    assert in_namespace("default", "/v1/tasks") == "/v1/tasks"
    assert in_namespace(None, "/v1/tasks") == "/v1/tasks"
    assert in_namespace("acme", "/v1/tokensmith") == "/v1/namespaces/acme/tokensmith"


def test_namespace_from_the_environment(monkeypatch):
    monkeypatch.setenv("SUNDIAL_NAMESPACE", "acme")
    seen: list = []
    with _recording_client(seen) as c:
        assert c.namespace == "acme"
        c.request("GET", "/v1/queues")
    with _recording_client(seen, namespace="default") as c:  # the argument wins
        assert c.namespace is None
        c.request("GET", "/v1/queues")
    assert AsyncClient("http://stub").namespace == "acme"
    assert seen == ["/v1/namespaces/acme/queues", "/v1/queues"]


def test_worker_takes_a_namespace_or_a_client_not_both():
    with pytest.raises(ValueError):
        Worker("q", lambda job: None, client=AsyncClient("http://stub"), namespace="acme")


def test_a_task_lives_in_its_namespace(server):
    with server.client() as admin:
        created = admin.request("POST", "/v1/namespaces", json={"name": "acme"})
        assert created["name"] == "acme"
    queue = "jobs"
    with server.client(namespace="acme") as acme, server.client() as default:
        task = acme.create_task("double", queue=queue, payload=21)
        assert [t.id for t in acme.list_tasks(queue=queue)] == [task.id]
        assert acme.get_task(task.id).queue == queue
        # Not in the default namespace, by listing or by id.
        assert default.list_tasks(queue=queue) == []
        with pytest.raises(NotFound):
            default.get_task(task.id)
        # The shared routes keep their paths from a namespaced client.
        assert "acme" in [n["name"] for n in acme.request("GET", "/v1/namespaces")["namespaces"]]

        # The async flavour sees the same.
        async def listed():
            async with AsyncClient(server.url, namespace="acme") as ac:
                return [t.id for t in await ac.list_tasks(queue=queue)]

        assert asyncio.run(listed()) == [task.id]

        worker = Worker(queue, lambda job: {"doubled": job.payload * 2}, url=server.url, namespace="acme", poll_wait=1)
        thread = start_in_thread(worker)
        try:
            done = wait_for(lambda: (t := acme.get_task(task.id)).finished and t)
        finally:
            stop(worker, thread)
        assert done.state == "succeeded" and done.result == {"doubled": 42}
        assert worker.completed == 1
        assert default.list_tasks(queue=queue) == []


def test_an_unknown_namespace_is_not_found(shared_server):
    with shared_server.client(namespace="nowhere") as c:
        with pytest.raises(NotFound):
            c.list_tasks()


def test_a_create_over_the_quota_is_rate_limited(server):
    with server.client() as admin:
        admin.request("POST", "/v1/namespaces", json={"name": "tight", "max_live_tasks": 1})
    with server.client(namespace="tight") as c:
        c.create_task("k", queue="q")
        with pytest.raises(RateLimited) as e:
            c.create_task("k", queue="q")
        assert e.value.status == 429 and e.value.code == "quota"
        assert e.value.retryable and e.value.retry_after is not None and e.value.retry_after >= 1
        with pytest.raises(RateLimited) as e:
            c.create_tasks([{"kind": "k", "queue": "q"}])
        assert e.value.code == "quota"
        assert len(c.list_tasks(queue="q")) == 1  # nothing more stored
