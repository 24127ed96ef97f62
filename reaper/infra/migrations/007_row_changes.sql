-- The change feed (CONTRACT.md §5.3, issue 11): which workers' rows changed since the fleet
-- monitor last looked. A worker's unchanged complete report needs diffing against Postgres
-- only when its rows changed: a row inserted, moved to or from it, deleted, or whose state
-- changed (creating -> created makes it markable, rule 2; a reaped task is an orphan, rule 7).
-- The fleet monitor takes these rows every heartbeat interval and asks each worker's liveness
-- to diff its next reports (activities/changes.py).
--
-- Append-only, one row per statement and worker: concurrent writers never wait on each other
-- here. Rows are taken with DELETE ... RETURNING, so a change committed after a take is
-- simply seen by the next one (no cursor, no lost change).
CREATE TABLE reaper.row_changes (
    id     bigserial PRIMARY KEY,
    worker text NOT NULL,
    kind   text NOT NULL CHECK (kind IN ('containers', 'volumes', 'tasks'))
);

-- The collector's own writes (missing_since, its destroys, the tasks it starts) follow a
-- diff already: its transactions set reaper.collecting and are not fed back.
-- TG_ARGV[0]: the kind; TG_ARGV[1]: the key column (`handle`, or `id` for tasks).
CREATE FUNCTION reaper.note_row_changes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('reaper.collecting', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO reaper.row_changes (worker, kind)
        SELECT DISTINCT worker, TG_ARGV[0] FROM new_rows WHERE worker IS NOT NULL;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO reaper.row_changes (worker, kind)
        SELECT DISTINCT worker, TG_ARGV[0] FROM old_rows WHERE worker IS NOT NULL;
    ELSE
        -- Only the state and the worker matter: an update of updated_at alone, or of a
        -- column of the scheduler's own, is no change for the diff. Both the old and the
        -- new worker of a moved row are noted.
        EXECUTE format(
            'INSERT INTO reaper.row_changes (worker, kind)'
            ' SELECT DISTINCT v.w, $1 FROM old_rows o FULL JOIN new_rows n ON o.%1$I = n.%1$I'
            ' CROSS JOIN LATERAL (VALUES (o.worker), (n.worker)) AS v(w)'
            ' WHERE v.w IS NOT NULL AND (o.%1$I IS NULL OR n.%1$I IS NULL'
            ' OR (o.state, o.worker) IS DISTINCT FROM (n.state, n.worker))',
            TG_ARGV[1]
        ) USING TG_ARGV[0];
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER containers_changes_ins AFTER INSERT ON reaper.containers
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION reaper.note_row_changes('containers', 'handle');
CREATE TRIGGER containers_changes_upd AFTER UPDATE ON reaper.containers
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION reaper.note_row_changes('containers', 'handle');
CREATE TRIGGER containers_changes_del AFTER DELETE ON reaper.containers
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION reaper.note_row_changes('containers', 'handle');

CREATE TRIGGER volumes_changes_ins AFTER INSERT ON reaper.volumes
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION reaper.note_row_changes('volumes', 'handle');
CREATE TRIGGER volumes_changes_upd AFTER UPDATE ON reaper.volumes
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION reaper.note_row_changes('volumes', 'handle');
CREATE TRIGGER volumes_changes_del AFTER DELETE ON reaper.volumes
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION reaper.note_row_changes('volumes', 'handle');

CREATE TRIGGER tasks_changes_ins AFTER INSERT ON reaper.tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION reaper.note_row_changes('tasks', 'id');
CREATE TRIGGER tasks_changes_upd AFTER UPDATE ON reaper.tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION reaper.note_row_changes('tasks', 'id');
CREATE TRIGGER tasks_changes_del AFTER DELETE ON reaper.tasks
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION reaper.note_row_changes('tasks', 'id');
