-- reaper schema v1 (CONTRACT.md section 3). Applied once, inside one transaction.
CREATE SCHEMA IF NOT EXISTS reaper;

CREATE TABLE reaper.workers (
    name              text PRIMARY KEY,
    state             text NOT NULL DEFAULT 'running'
                      CHECK (state IN ('running', 'stalled', 'lost')),
    draining          boolean NOT NULL DEFAULT false,
    drain_reason      text,
    boot_id           text,
    last_seq          bigint,
    last_heartbeat_at timestamptz,
    state_since       timestamptz NOT NULL DEFAULT now(),
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workers_state ON reaper.workers (state);

-- Keeps updated_at current on every change, and state_changed_at on state changes only:
-- a row that became `created` after a report was taken is not marked on its account
-- (CONTRACT.md rule 2), which needs the time of the state change, not of any update.
CREATE FUNCTION reaper.touch_handle_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.state_changed_at := COALESCE(NEW.state_changed_at, NEW.created_at, now());
    ELSE
        NEW.updated_at := now();
        IF NEW.state IS DISTINCT FROM OLD.state THEN
            NEW.state_changed_at := now();
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE TABLE reaper.containers (
    handle           text PRIMARY KEY,
    worker           text NOT NULL,
    state            text NOT NULL DEFAULT 'created'
                     CHECK (state IN ('creating', 'created', 'destroying')),
    missing_since    timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    state_changed_at timestamptz
);
CREATE INDEX containers_worker ON reaper.containers (worker);
CREATE INDEX containers_missing ON reaper.containers (worker, missing_since)
    WHERE missing_since IS NOT NULL;
CREATE TRIGGER containers_touch BEFORE INSERT OR UPDATE ON reaper.containers
    FOR EACH ROW EXECUTE FUNCTION reaper.touch_handle_row();

CREATE TABLE reaper.volumes (LIKE reaper.containers INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE reaper.volumes ADD PRIMARY KEY (handle);
CREATE INDEX volumes_worker ON reaper.volumes (worker);
CREATE INDEX volumes_missing ON reaper.volumes (worker, missing_since)
    WHERE missing_since IS NOT NULL;
CREATE TRIGGER volumes_touch BEFORE INSERT OR UPDATE ON reaper.volumes
    FOR EACH ROW EXECUTE FUNCTION reaper.touch_handle_row();

CREATE TABLE reaper.services (
    name          text PRIMARY KEY,
    desired_count integer NOT NULL CHECK (desired_count >= 0),
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE reaper.tasks (
    id               text PRIMARY KEY,
    service          text,
    worker           text,
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'running', 'lost', 'stopped')),
    stop_reason      text,
    replaces         text UNIQUE,
    missing_since    timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    state_changed_at timestamptz
);
CREATE INDEX tasks_worker_state ON reaper.tasks (worker, state);
CREATE INDEX tasks_service_state ON reaper.tasks (service, state);
CREATE TRIGGER tasks_touch BEFORE INSERT OR UPDATE ON reaper.tasks
    FOR EACH ROW EXECUTE FUNCTION reaper.touch_handle_row();

CREATE TABLE reaper.events (
    id      bigserial PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    worker  text,
    kind    text NOT NULL CHECK (kind IN ('container', 'volume', 'task', 'worker')),
    handle  text,
    action  text NOT NULL,
    reason  text,
    actor   text,
    dedupe  text UNIQUE
);
CREATE INDEX events_worker_at ON reaper.events (worker, at);

-- Handles a worker reports that the database does not know, with when they were first
-- reported: after MISSING_TTL they are the worker's orphans, to destroy (CONTRACT.md §2).
CREATE TABLE reaper.unknown_handles (
    worker     text NOT NULL,
    kind       text NOT NULL,
    handle     text NOT NULL,
    first_seen timestamptz NOT NULL,
    PRIMARY KEY (worker, kind, handle)
);

-- One row: the fleet's disruption state (CONTRACT.md rule 6).
CREATE TABLE reaper.fleet (
    id           integer PRIMARY KEY CHECK (id = 1),
    state        text NOT NULL DEFAULT 'normal' CHECK (state IN ('normal', 'partial', 'full')),
    since        timestamptz NOT NULL DEFAULT now(),
    recovered_at timestamptz
);
INSERT INTO reaper.fleet (id) VALUES (1);
