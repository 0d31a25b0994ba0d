"""Tags and search, attempts, retrying, bulk actions, queues (pause and resume, settings with a
default push target) and the push signing secrets."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt

import pytest

from sundial_client import AsyncClient, Attempt, BulkResult, PushSecret, Queue
from sundial_client.errors import Invalid, NotFound


def test_tags_are_stored_and_searched(client, queue):
    tagged = client.create_task("k", queue=queue, tags={"customer": "c7", "tier": "gold"}, delay=3600)
    client.create_task("k", queue=queue, tags={"customer": "c8"}, delay=3600)
    assert tagged.tags == {"customer": "c7", "tier": "gold"}
    assert [t.id for t in client.iter_tasks(queue=queue, tag={"customer": "c7"})] == [tagged.id]
    assert [t.id for t in client.iter_tasks(queue=queue, tag=["customer:c7", "tier:gold"])] == [tagged.id]
    soon = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    assert len(client.list_tasks(queue=queue, due_before=soon)) == 2


def test_attempts_and_retry(client, queue):
    t = client.create_task("k", queue=queue, max_attempts=1)
    (p,) = client.poll(queue, "w", wait=5)
    dead = client.fail(p.id, p.execution_id, "boom")
    assert dead.state == "dead"
    attempts, total = client.list_attempts(t.id)
    assert total == 1 and isinstance(attempts[0], Attempt)
    assert attempts[0].outcome == "failed" and attempts[0].error == "boom" and attempts[0].worker == "w"
    again = client.retry_task(t.id)
    assert again.state in ("scheduled", "ready")


def test_bulk_cancel_and_retry(client, queue):
    for _ in range(3):
        client.create_task("bulk", queue=queue, delay=3600)
    counted = client.cancel_tasks(queue=queue, dry_run=True)
    assert isinstance(counted, BulkResult) and counted.matched == 3 and counted.changed == 0
    assert client.cancel_tasks(queue=queue).changed == 3
    assert client.retry_tasks(queue=queue, state="cancelled").changed == 3


def test_queues_pause_and_resume(client, queue):
    client.create_task("k", queue=queue, delay=3600)
    paused = client.pause_queue(queue)
    assert isinstance(paused, Queue) and paused.paused
    assert client.get_queue(queue).paused
    assert any(q.queue == queue for q in client.list_queues())
    resumed = client.resume_queue(queue)
    assert not resumed.paused and resumed.counts.get("scheduled") == 1


def test_task_with_a_push_target(client, queue):
    t = client.create_task(
        "invoice.remind",
        queue=queue,
        delay=3600,
        target={"url": "https://hooks.example.com/remind", "headers": {"x-tenant": "acme"}, "timeout": 10},
    )
    assert t.target["url"] == "https://hooks.example.com/remind"
    assert t.target["headers"] == {"x-tenant": "acme"}
    assert client.get_task(t.id).target["url"] == "https://hooks.example.com/remind"
    plain = client.create_task("k", queue=queue, delay=3600, target="https://hooks.example.com/p")
    assert plain.target["url"] == "https://hooks.example.com/p"
    assert client.create_task("k", queue=queue, delay=3600).target is None
    with pytest.raises(Invalid):
        client.create_task("k", queue=queue, target="ftp://example.com/x")


def test_queue_default_push_target(client, queue):
    target = {"url": "https://hooks.example.com/q", "headers": {"x-tenant": "acme"}, "timeout": "5s"}
    q = client.set_queue_settings(queue, target=target)
    assert isinstance(q, Queue) and q.queue == queue
    assert q.settings["target"]["url"] == target["url"]
    assert q.settings["target"]["headers"] == {"x-tenant": "acme"}
    assert client.get_queue(queue).settings["target"]["url"] == target["url"]
    # The whole settings object is replaced: no target clears it.
    cleared = client.set_queue_settings(queue, retention={"succeeded": "1h"})
    assert cleared.settings.get("target") is None
    assert cleared.settings["retention"]["succeeded"] == "1h"
    with pytest.raises(Invalid):
        client.set_queue_settings(queue, target={"url": "ftp://example.com/x"})


def test_queue_concurrency_limit(client, queue):
    q = client.set_queue_settings(queue, concurrency=2)
    assert q.settings["concurrency"] == 2
    for _ in range(3):
        client.create_task("k", queue=queue)
    taken = []
    for _ in range(50):
        taken += client.poll(queue, worker="w", max=5, wait=0.1)
        if len(taken) >= 2:
            break
    assert len(taken) == 2, "a poll takes no more than the free places"
    assert client.poll(queue, worker="w", max=5, wait=0.1) == []
    client.complete(taken[0].id, taken[0].execution_id)
    assert len(client.poll(queue, worker="w", max=5, wait=2)) == 1
    with pytest.raises(Invalid):
        client.set_queue_settings(queue, concurrency=0)
    assert client.set_queue_settings(queue).settings.get("concurrency") is None


def test_push_secrets_add_list_rotate_revoke(server):
    with server.client() as c:
        added = c.add_push_secret()
        assert isinstance(added, PushSecret) and added.secret.startswith("whsec_") and added.active
        assert not added.secret.endswith("…")
        listed = c.list_push_secrets()
        assert [s.id for s in listed] == [added.id]
        assert listed[0].secret.endswith("…") and listed[0].active
        rotated = c.rotate_push_secret(overlap="0s")
        assert rotated.active and rotated.id != added.id
        by_id = {s.id: s for s in c.list_push_secrets()}
        assert by_id[rotated.id].active and not by_id[added.id].active
        mine = "whsec_" + base64.b64encode(b"k" * 32).decode()
        assert c.add_push_secret(mine).secret == mine
        with pytest.raises(Invalid):
            c.add_push_secret("not-a-secret")
        after = c.revoke_push_secret(rotated.id)
        assert not {s.id: s for s in after}[rotated.id].active
        with pytest.raises(NotFound):
            c.revoke_push_secret("ps_missing")


def test_push_secrets_async(server):
    async def go():
        async with AsyncClient(server.url) as c:
            added = await c.add_push_secret()
            assert added.secret.startswith("whsec_")
            assert [s.id for s in await c.list_push_secrets()] == [added.id]
            rotated = await c.rotate_push_secret(overlap=0)
            assert rotated.id != added.id
            revoked = await c.revoke_push_secret(rotated.id)
            assert not {s.id: s for s in revoked}[rotated.id].active
            q = await c.set_queue_settings("hooks", target={"url": "https://hooks.example.com/a"})
            assert q.settings["target"]["url"] == "https://hooks.example.com/a"

    asyncio.run(go())
