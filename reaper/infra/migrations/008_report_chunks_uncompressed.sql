-- Staged chunks of large reports (003) are stored without compression: up to 128 KiB of
-- handles each, container ids that pglz cannot shrink (64 hexadecimal digits each) but tries
-- to on every insert, which was most of staging a chunk (BENCHMARKS.md, metric 3b). EXTERNAL
-- still moves large values out of line (TOAST); only the compression goes. Metadata only: no
-- rewrite, rows staged before keep their storage until dropped.
ALTER TABLE reaper.report_chunks ALTER COLUMN handles SET STORAGE EXTERNAL;
