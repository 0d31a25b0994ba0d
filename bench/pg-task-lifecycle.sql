-- One task's life on the `tasks` table of schema `sundial_lifecycle`, each step its own
-- transaction as in the engine: insert (scheduled), ready, running, succeeded. Run by
-- bench/pg-task-lifecycle.sh with pgbench; ids are time-ordered like the engine's UUIDv7.
INSERT INTO sundial_lifecycle.tasks (id, shard, queue, kind, payload, due_at, state, max_attempts, backoff, timeout_ms, created_at, updated_at) VALUES ((lpad(to_hex((extract(epoch from clock_timestamp()) * 1000)::bigint), 12, '0') || substr(md5(random()::text), 1, 20))::uuid, (random() * 15)::int, 'q', 'k', '{}', 1, 'scheduled', 3, '"none"', 30000, 1, 1) RETURNING id AS tid \gset
UPDATE sundial_lifecycle.tasks SET state = 'ready', updated_at = 2 WHERE id = :tid;
UPDATE sundial_lifecycle.tasks SET state = 'running', attempt = attempt + 1, execution_id = gen_random_uuid(), lease_expires_at = 100000, started_at = 3, updated_at = 3 WHERE id = :tid;
UPDATE sundial_lifecycle.tasks SET state = 'succeeded', result = 'ok', updated_at = 4, finished_at = 4, lease_expires_at = NULL WHERE id = :tid;
