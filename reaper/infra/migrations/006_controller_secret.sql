-- The controller's secret (CONTRACT.md §5.2): seals the reports a liveness forwards to its
-- collector, so that nobody else can hand the collector a report. 32 bytes from Postgres'
-- strong random source (gen_random_uuid), generated once and shared by every replica.
CREATE TABLE reaper.controller_secret (
    id     smallint PRIMARY KEY CHECK (id = 1),
    secret bytea NOT NULL
);
INSERT INTO reaper.controller_secret (id, secret)
VALUES (1, sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')));
