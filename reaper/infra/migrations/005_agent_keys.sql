-- Who may speak for a worker (CONTRACT.md §5.2): pinned or enrolled agent keys.
-- An operator enrols a key before the worker's first heartbeat with
--   INSERT INTO reaper.agent_keys (worker, public_key) VALUES ('w1', '<base64>');
-- retirement deletes the worker's row.
CREATE TABLE reaper.agent_keys (
    worker     text PRIMARY KEY,
    public_key text NOT NULL CHECK (public_key ~ '^[A-Za-z0-9+/]{43}=$'),
    pinned_at  timestamptz NOT NULL DEFAULT now()
);

-- When an operator's force_reap was accepted by the worker's liveness: the evidence a forced
-- reap needs (a WorkerReap started by anyone else, with forced=true, reaps nothing).
ALTER TABLE reaper.workers ADD COLUMN force_reap_at timestamptz;
