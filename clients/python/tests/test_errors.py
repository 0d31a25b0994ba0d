"""Every error class: raised for the server's real answers where the server can be made to give
them (auth on for 401 and 403, a poll cap for 429), from a stubbed transport for the statuses a
healthy local server does not produce (500, 501, 503), and for an unreachable server."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import threading
import time
import uuid

import httpx
import pytest

from sundial_client import (
    AlreadyRunning,
    ApiError,
    AsyncClient,
    Client,
    Conflict,
    ConnectionFailed,
    DuplicateKey,
    Forbidden,
    InternalError,
    Invalid,
    Malformed,
    MethodNotAllowed,
    NotFound,
    RateLimited,
    ShuttingDown,
    StaleExecution,
    SundialError,
    TooLarge,
    Unauthorized,
    Unavailable,
    Unsupported,
    WrongState,
)

from conftest import Server, binary, wait_for


def test_malformed(client):
    with pytest.raises(Malformed) as e:
        client.request("POST", "/v1/tasks", content=b"{not json")
    assert e.value.status == 400 and e.value.code == "malformed"


def test_invalid_names_the_field(client):
    with pytest.raises(Invalid) as e:
        client.create_task("k", delay="soon")
    assert e.value.status == 422 and e.value.code == "invalid" and e.value.field == "delay"
    # An unknown field (sent through the pass-through keywords) is refused, not ignored.
    with pytest.raises(Invalid) as e:
        client.create_task("k", delya="5s")
    assert e.value.status == 422


def test_invalid_batch_item_names_the_index(client, queue):
    with pytest.raises(Invalid) as e:
        client.create_tasks([{"kind": "ok", "queue": queue}, {"kind": "", "queue": queue}])
    assert e.value.index == 1 and e.value.field and e.value.field.startswith("tasks[1]")
    assert client.list_tasks(queue=queue) == []  # nothing stored


def test_not_found(client):
    with pytest.raises(NotFound) as e:
        client.get_task(str(uuid.uuid4()))
    assert e.value.status == 404 and e.value.code == "not_found"
    with pytest.raises(NotFound):
        client.get_workflow("no-such-workflow")


def test_method_not_allowed(client):
    with pytest.raises(MethodNotAllowed) as e:
        client.request("DELETE", "/v1/tasks")
    assert e.value.status == 405


def test_duplicate_key_carries_existing_id(client, queue):
    first = client.create_task("k", queue=queue, key="same")
    with pytest.raises(DuplicateKey) as e:
        client.create_task("k", queue=queue, key="same")
    assert isinstance(e.value, Conflict) and e.value.status == 409
    assert e.value.code == "already_exists"
    assert e.value.existing_id == first.id


def test_wrong_state_carries_state(client, queue):
    t = client.create_task("k", queue=queue)
    client.cancel_task(t.id)
    client.cancel_task(t.id)  # cancel is idempotent
    with pytest.raises(WrongState) as e:
        client.trigger_task(t.id)
    assert e.value.state == "cancelled" and e.value.code == "wrong_state"


def test_stale_execution(client, queue):
    client.create_task("k", queue=queue)
    (p,) = client.poll(queue, "w", wait=5)
    with pytest.raises(StaleExecution) as e:
        client.complete(p.id, str(uuid.uuid4()))
    assert e.value.state == "running"
    client.complete(p.id, p.execution_id)


def test_complete_and_poll_refused(client, queue):
    first = client.create_task("k", queue=queue)
    (p,) = client.poll(queue, "w", wait=5)
    second = client.create_task("k", queue=queue)
    wait_for(lambda: client.get_task(second.id).state == "ready")
    # A stale execution: the completion is refused as complete would refuse it, nothing polled.
    with pytest.raises(StaleExecution) as e:
        client.complete_and_poll(queue, "w", p.id, str(uuid.uuid4()), "late", wait=5)
    assert isinstance(e.value, Conflict) and e.value.status == 409
    assert e.value.state == "running" and e.value.field == "complete.task_id"
    with pytest.raises(NotFound) as nf:
        client.complete_and_poll(queue, "w", str(uuid.uuid4()), p.execution_id, wait=5)
    assert nf.value.field == "complete.task_id"
    assert client.get_task(first.id).state == "running"
    assert client.get_task(second.id).state == "ready"
    got = client.complete_and_poll(queue, "w", p.id, p.execution_id, wait=5)
    assert got.completed.state == "succeeded" and [t.id for t in got.tasks] == [second.id]


def test_too_large(client, queue):
    with pytest.raises(TooLarge) as e:
        client.create_task("k", queue=queue, payload="x" * (300 * 1024))
    assert e.value.status == 413 and e.value.code == "too_large"


def test_already_running_workflow(client):
    wid = f"wf-{uuid.uuid4().hex[:8]}"
    client.start_workflow("t", workflow_id=wid, id_reuse="reject_duplicate")
    with pytest.raises(Conflict) as e:
        client.start_workflow("t", workflow_id=wid)
    assert isinstance(e.value, AlreadyRunning) and e.value.code == "already_exists"
    assert e.value.existing_id is not None


def test_unauthorized_and_forbidden_from_a_server_with_auth_on(tmp_path):
    # A token in the store turns auth on (loopback included); a reader may only read.
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUNDIAL_")}
    made = subprocess.run(
        [str(binary()), "token", "create", "--bootstrap", "--name", "ro", "--scope", "reader", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.splitlines()[0].strip()
    server = Server(data).start()
    try:
        for bad in (None, "sdl_" + "0" * 96):
            with Client(server.url, token=bad or "") as c:
                with pytest.raises(Unauthorized) as e:
                    c.get_task(str(uuid.uuid4()))
            assert e.value.status == 401 and e.value.code == "unauthenticated"
            assert not e.value.retryable
        with server.client(token=token) as c:
            assert c.list_tasks() == []  # a reader reads
            with pytest.raises(Forbidden) as e:
                c.create_task("k")
            assert e.value.status == 403 and e.value.code == "forbidden" and not e.value.retryable
    finally:
        server.stop()


def test_rate_limited_from_the_poll_cap(tmp_path):
    # With auth off every caller shares one cap: one long poll holds it, the next is refused.
    server = Server(tmp_path / "data", ["--max-polls-per-token", "1"]).start()
    try:
        with server.client() as holder, server.client() as c:
            got: list = []

            def hold() -> None:
                while True:  # until this poll is the one holding the cap
                    try:
                        got.extend(holder.poll("capped", "w1", wait=10))
                        return
                    except RateLimited:
                        time.sleep(0.01)

            held = threading.Thread(target=hold)
            held.start()
            deadline = time.monotonic() + 10
            while True:
                try:
                    c.poll("capped", "w2", wait=0.05)
                except RateLimited as e:
                    refused = e
                    break
                assert time.monotonic() < deadline, "the second poll was never refused"
            assert refused.status == 429 and refused.code == "too_many_polls"
            assert refused.retryable and refused.retry_after == 1.0
            c.create_task("k", queue="capped")  # answers the held poll
            held.join(15)
            assert not held.is_alive() and [t.kind for t in got] == ["k"]
    finally:
        server.stop()


def _stub(status: int, body):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body) if not isinstance(body, str) else httpx.Response(status, text=body)

    return handler


@pytest.mark.parametrize(
    "status,code,cls,retryable",
    [
        (401, "unauthenticated", Unauthorized, False),
        (403, "forbidden", Forbidden, False),
        (429, "too_many_polls", RateLimited, True),
        (429, "quota", RateLimited, True),
        (500, "internal", InternalError, False),
        (501, "unsupported", Unsupported, False),
        (503, "shutting_down", ShuttingDown, True),
        (503, "unavailable", Unavailable, True),
        (502, None, Unavailable, True),
        (418, "teapot", ApiError, False),
    ],
)
def test_statuses_map_to_classes(status, code, cls, retryable):
    body = {"error": {"code": code, "message": "m"}} if code else "Bad Gateway"
    with Client("http://stub", transport=httpx.MockTransport(_stub(status, body))) as c:
        with pytest.raises(cls) as e:
            c.get_task("x")
    assert type(e.value) is cls
    assert e.value.status == status and e.value.retryable is retryable
    assert e.value.code == (code or f"http_{status}")


def test_token_is_sent_as_bearer():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["auth"] = request.headers.get("authorization")
        return httpx.Response(200, json={"status": "ok"})

    with Client("http://stub", token="s3cret", transport=httpx.MockTransport(handler)) as c:
        c.health()
    assert seen["auth"] == "Bearer s3cret"


def test_unreachable_server_is_connection_failed():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}") as c:
        with pytest.raises(ConnectionFailed) as e:
            c.health()
    assert isinstance(e.value, SundialError)

    async def main():
        async with AsyncClient(f"http://127.0.0.1:{port}") as ac:
            with pytest.raises(ConnectionFailed):
                await ac.health()

    asyncio.run(main())


def test_retry_after_is_kept():
    def handler(request: httpx.Request) -> httpx.Response:
        body = {"error": {"code": "unavailable", "message": "store restarting"}}
        return httpx.Response(503, json=body, headers={"Retry-After": "2"})

    with Client("http://stub", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(Unavailable) as e:
            c.health()
    assert e.value.retry_after == 2.0
