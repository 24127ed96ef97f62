-- A fleet that changes (CONTRACT.md §5.1): retired workers, completed reaps, owed replacements.
ALTER TABLE reaper.workers DROP CONSTRAINT workers_state_check;
ALTER TABLE reaper.workers ADD CONSTRAINT workers_state_check
    CHECK (state IN ('running', 'stalled', 'lost', 'retired'));

-- When the worker's latest reap completed: tasks a scheduler writes onto a worker that is
-- lost and reaped, or retired, are reaped as strays (Kubernetes #12545).
ALTER TABLE reaper.workers ADD COLUMN reaped_at timestamptz;

-- Owed replacements: `pending` tasks with no worker yet, placed as soon as one is available.
CREATE INDEX tasks_owed ON reaper.tasks (created_at) WHERE state = 'pending' AND worker IS NULL;
