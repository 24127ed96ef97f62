-- When each worker's heartbeats last carried a complete report of each kind (CONTRACT.md §2:
-- a list, not null), as its liveness knew it when it last wrote the row: written with
-- last_heartbeat_at by the same statements (record_worker_state, refresh_heartbeat), so the
-- two are one snapshot. A worker whose beats keep coming while these stay behind reports
-- liveness only (an agent that cannot read its host): `reaper workers`, `reaper explain
-- worker`, the gauge reaper_workers_reports_incomplete (reaper.core.policy.reports).
-- NULL: no complete report of the kind since the row was made. Rows made before this
-- migration start from their last heartbeat: their history is not known, and an upgrade
-- must not count every worker as reporting liveness only until its next write.
ALTER TABLE reaper.workers
    ADD COLUMN containers_complete_at timestamptz,
    ADD COLUMN volumes_complete_at timestamptz,
    ADD COLUMN tasks_complete_at timestamptz;
UPDATE reaper.workers SET containers_complete_at = last_heartbeat_at,
    volumes_complete_at = last_heartbeat_at, tasks_complete_at = last_heartbeat_at;
