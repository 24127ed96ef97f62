-- Large reports arrive in chunks (protocol extension, CONTRACT v1.1) and are staged here, one
-- row per chunk holding its handles as an array, until the collector diffs them.
CREATE TABLE reaper.report_chunks (
    worker    text NOT NULL,
    kind      text NOT NULL,
    report_id text NOT NULL,
    idx       integer NOT NULL,
    count     integer NOT NULL,
    digest    text NOT NULL,
    handles   text[] NOT NULL,
    PRIMARY KEY (worker, kind, report_id, idx)
);
