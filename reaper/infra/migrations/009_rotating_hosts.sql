-- Rotating hosts (CONTRACT.md §6): a migrating drain, drained workers, a service's surge.

-- How many of a service's tasks may be migrating at once (placed, replacement not running).
ALTER TABLE reaper.services ADD COLUMN max_surge integer NOT NULL DEFAULT 1
    CHECK (max_surge >= 1);

-- A draining worker that holds no pending or running task is drained (§6.2).
ALTER TABLE reaper.workers ADD COLUMN drained_at timestamptz;
-- A migrating drain that runs: when it started and its deadline (NULL: none runs, §6.1).
ALTER TABLE reaper.workers ADD COLUMN migrate_since timestamptz;
ALTER TABLE reaper.workers ADD COLUMN migrate_until timestamptz;

-- One active replacement per task: a migration's replacement whose worker is lost is
-- reaped, and the original (still running) gets another (§6.1). A task reaper took down is
-- still replaced at most once (the backfill links only tasks no replacement names).
ALTER TABLE reaper.tasks DROP CONSTRAINT tasks_replaces_key;
CREATE UNIQUE INDEX tasks_active_replacement ON reaper.tasks (replaces)
    WHERE state IN ('pending', 'running');
CREATE INDEX tasks_replaces ON reaper.tasks (replaces) WHERE replaces IS NOT NULL;
CREATE INDEX workers_migrating ON reaper.workers (migrate_until) WHERE migrate_until IS NOT NULL;
