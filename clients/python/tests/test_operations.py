"""Tags and search, attempts, retrying, bulk actions and queues (pause and resume)."""

from __future__ import annotations

import datetime as dt

from sundial_client import Attempt, BulkResult, Queue


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
