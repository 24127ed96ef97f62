-- Dry run (REAPER_DRY_RUN): what would be marked lives here, not on the user's rows.
CREATE TABLE reaper.dry_marks (
    worker        text NOT NULL,
    kind          text NOT NULL,
    handle        text NOT NULL,
    missing_since timestamptz NOT NULL,
    done          boolean NOT NULL DEFAULT false,  -- a would-destroy was recorded
    PRIMARY KEY (worker, kind, handle)
);

-- Token bucket limiting automatic reaps fleet-wide (REAPER_REAP_RATE, REAPER_REAP_BURST).
CREATE TABLE reaper.reap_tokens (
    id         integer PRIMARY KEY CHECK (id = 1),
    tokens     double precision,
    updated_at timestamptz
);
INSERT INTO reaper.reap_tokens (id) VALUES (1);
