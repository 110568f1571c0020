-- Portable DDL: accepted by both SQLite and PostgreSQL.
-- When the current version's indexing event was accepted by the stream (ms since the epoch);
-- NULL while it has not been (the upload or reindex is between its registry write and its
-- publish, or stopped there: the files service queues such a version again). Rows written before
-- this column read NULL: those still pending are queued once more, which the indexer takes as a
-- repeat.
ALTER TABLE kg_files ADD COLUMN queued_at_ms BIGINT NULL;
