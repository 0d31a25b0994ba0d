"""Listing pages through every result automatically, for tasks, schedules and workflows."""

from __future__ import annotations

import asyncio
import uuid

from sundial_client import AsyncClient


def test_tasks_page_by_cursor(client, queue):
    created = [client.create_task("page", queue=queue, delay=3600).id for _ in range(23)]
    first = client.list_tasks_page(queue=queue, limit=5)
    assert len(first.items) == 5 and first.next_cursor
    seen = [t.id for t in client.iter_tasks(queue=queue, limit=5)]
    # Newest first, every task once.
    assert seen == list(reversed(created))
    assert [t.id for t in client.list_tasks(queue=queue, limit=1000)] == seen
    assert client.list_tasks(queue=queue, kind="no-such-kind") == []


def test_async_paging(shared_server, queue):
    async def main():
        async with AsyncClient(shared_server.url) as c:
            ids = [(await c.create_task("page", queue=queue, delay=3600)).id for _ in range(7)]
            seen = [t.id async for t in c.iter_tasks(queue=queue, limit=3)]
            assert seen == list(reversed(ids))

    asyncio.run(main())


def test_schedules_and_workflows_page(server):
    with server.client() as c:
        ids = sorted(f"s{i}-{uuid.uuid4().hex[:6]}" for i in range(5))
        for sid in ids:
            c.create_schedule(id=sid, every="1h", task={"kind": "k"})
        assert c.list_schedules_page(limit=2).next_cursor
        assert sorted(s.id for s in c.iter_schedules(limit=2)) == ids
        wtype = "paged"
        wids = [c.start_workflow(wtype, workflow_id=f"w{i}").id for i in range(5)]
        assert sorted(w.id for w in c.iter_workflows(workflow_type=wtype, limit=2)) == sorted(wids)
        assert c.list_workflows(workflow_type="none") == []
