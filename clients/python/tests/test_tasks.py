"""The producer client against the real server: tasks, batches, the worker protocol by hand, the
asyncio flavour, schedules and workflows."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import pytest

from sundial_client import (
    AsyncClient,
    BatchCreated,
    BatchDuplicate,
    CompleteAndPoll,
    Fire,
    PolledTask,
    Schedule,
    Task,
    Workflow,
    WorkflowStarted,
)


def test_create_poll_complete(client, queue):
    task = client.create_task("email.send", queue=queue, payload={"to": "a@example.com"}, timeout=30)
    assert isinstance(task, Task)
    assert task.state in ("scheduled", "ready")  # due now: ready once the engine has seen it
    assert task.kind == "email.send"
    assert task.payload == {"to": "a@example.com"}
    assert task.timeout == "30s"
    assert isinstance(task.created_at, dt.datetime) and task.created_at.tzinfo is not None

    polled = client.poll(queue, "w1", wait=5)
    assert [p.id for p in polled] == [task.id]
    p = polled[0]
    assert isinstance(p, PolledTask) and p.attempt == 1 and p.execution_id
    beat = client.heartbeat(p.id, p.execution_id)
    assert beat.state == "running" and beat.worker == "w1"
    done = client.complete(p.id, p.execution_id, {"sent": True})
    assert done.state == "succeeded" and done.result == {"sent": True}
    assert client.get_task(task.id) == done


def test_complete_and_poll(client, queue):
    first = client.create_task("k", queue=queue)
    (p,) = client.poll(queue, "w1", wait=5)
    assert p.id == first.id
    second = client.create_task("k", queue=queue, payload={"n": 2})

    # The completion is recorded and the next task handed out in the same answer.
    got = client.complete_and_poll(queue, "w1", p.id, p.execution_id, {"sent": True}, wait=5)
    assert isinstance(got, CompleteAndPoll)
    assert isinstance(got.completed, Task) and got.completed.id == first.id
    assert got.completed.state == "succeeded" and got.completed.result == {"sent": True}
    assert client.get_task(first.id) == got.completed
    (p2,) = got.tasks
    assert isinstance(p2, PolledTask) and p2.id == second.id and p2.payload == {"n": 2}
    assert p2.attempt == 1 and p2.execution_id
    assert client.get_task(second.id).state == "running"

    # Sent again (its answer lost): counted as recorded, the first result kept; the poll goes on
    # and finds nothing left.
    again = client.complete_and_poll(queue, "w1", p.id, p.execution_id, wait=0.2)
    assert again.completed.state == "succeeded" and again.completed.result == {"sent": True}
    assert again.tasks == []
    last = client.complete_and_poll(queue, "w1", p2.id, p2.execution_id, max=5, wait=0.2, kinds=["k"])
    assert last.completed.id == second.id and last.completed.state == "succeeded"
    assert last.completed.result is None and last.tasks == []


def test_fail_retries_then_dead(client, queue):
    task = client.create_task("k", queue=queue, max_attempts=2, backoff={"initial": 0.05, "jitter": 0})
    (p,) = client.poll(queue, "w", wait=5)
    again = client.fail(p.id, p.execution_id, "boom")
    assert again.state == "scheduled" and again.last_error == "boom"
    (p2,) = client.poll(queue, "w", wait=5)
    assert p2.id == task.id and p2.attempt == 2
    dead = client.fail(p2.id, p2.execution_id, "boom again", retryable=False)
    assert dead.state == "dead"


def test_options_reach_the_server(client, queue):
    run_at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    task = client.create_task(
        "k",
        queue=queue,
        key="order-1",
        run_at=run_at,
        max_attempts=3,
        backoff={"initial": "2s", "factor": 3, "max": "1m", "jitter": 0.1},
        timeout=dt.timedelta(minutes=2),
        exclusive={"key": "customer-7", "mode": "skip"},
    )
    assert task.state == "scheduled"
    assert abs((task.run_at - run_at).total_seconds()) < 0.01
    assert task.key == "order-1" and task.max_attempts == 3
    assert task.backoff.initial == "2s" and task.backoff.factor == 3.0 and task.backoff.max == "1m"
    assert task.timeout == "2m"
    assert task.exclusive is not None and task.exclusive.key == "customer-7" and task.exclusive.mode == "skip"
    later = client.create_task("k", queue=queue, delay=3600)
    assert later.state == "scheduled"
    triggered = client.trigger_task(later.id)
    assert triggered.run_at <= dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
    cancelled = client.cancel_task(task.id)
    assert cancelled.state == "cancelled"


def test_batch_reports_created_and_duplicates(client, queue):
    results = client.create_tasks(
        [
            {"kind": "a", "queue": queue, "key": "k1"},
            {"kind": "b", "queue": queue, "key": "k1"},
            {"kind": "c", "queue": queue, "delay": 60},
        ]
    )
    assert isinstance(results[0], BatchCreated) and results[0].state in ("scheduled", "ready")
    assert isinstance(results[1], BatchDuplicate) and results[1].existing_id == results[0].id
    assert isinstance(results[2], BatchCreated) and results[2].state == "scheduled"


def test_async_client_same_flow(shared_server, queue):
    async def main():
        async with AsyncClient(shared_server.url) as c:
            task = await c.create_task("k", queue=queue, payload=[1, 2])
            (p,) = await c.poll(queue, "aw", wait=5)
            assert p.id == task.id
            done = await c.complete(p.id, p.execution_id, "ok")
            assert done.state == "succeeded"
            fetched = await c.get_task(task.id)
            assert fetched.result == "ok"
            listed = await c.list_tasks(queue=queue)
            assert [t.id for t in listed] == [task.id]
            assert (await c.health()) == {"status": "ok"}

    asyncio.run(main())


def test_async_complete_and_poll(shared_server, queue):
    async def main():
        async with AsyncClient(shared_server.url) as c:
            first = await c.create_task("k", queue=queue)
            (p,) = await c.poll(queue, "aw", wait=5)
            second = await c.create_task("k", queue=queue)
            got = await c.complete_and_poll(queue, "aw", p.id, p.execution_id, "ok", wait=5)
            assert got.completed.id == first.id and got.completed.result == "ok"
            assert [t.id for t in got.tasks] == [second.id]

    asyncio.run(main())


def test_schedules(client):
    sid = f"s-{uuid.uuid4().hex[:8]}"
    s = client.create_schedule(id=sid, every=3600, task={"kind": "report", "queue": "sched-q", "payload": {"x": 1}})
    assert isinstance(s, Schedule) and s.id == sid and s.every == "1h"
    assert s.task.kind == "report" and len(s.next_fires) > 0
    assert isinstance(s.next_fires[0], dt.datetime)
    paused = client.pause_schedule(sid, note="maintenance")
    assert paused.paused
    assert not client.unpause_schedule(sid).paused
    fire = client.trigger_schedule(sid)
    assert isinstance(fire, Fire) and fire.outcome == "fired" and fire.task_id
    fires = list(client.iter_fires(sid))
    assert any(f.task_id == fire.task_id for f in fires)
    updated = client.update_schedule(sid, every="2h")
    assert updated.every == "2h"
    got = client.get_schedule(sid)
    assert got.last_fires is not None
    preview = client.preview_schedule("2030-01-01T00:00:00Z", cron="0 9 * * *", timezone="Europe/Paris", count=3)
    assert [t.isoformat() for t in preview][0].startswith("2030-01-01T08:00:00")
    client.delete_schedule(sid)


def test_workflows_start_signal_get_terminate(client):
    wtype = f"wf-{uuid.uuid4().hex[:8]}"
    started = client.start_workflow(wtype, {"n": 1}, workflow_id=f"{wtype}-1")
    assert isinstance(started, WorkflowStarted) and started.id == f"{wtype}-1" and started.status == "running"
    client.signal_workflow(started.id, "go", {"fast": True})
    wf = client.get_workflow(started.id)
    assert isinstance(wf, Workflow) and wf.workflow_type == wtype and wf.status == "running"
    history = client.workflow_history(started.id)
    assert isinstance(history, dict) and history.get("events")
    ended = client.terminate_workflow(started.id, reason="test over")
    assert ended.status == "terminated"
