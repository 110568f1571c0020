-- When the current version was last queued to be indexed again (FileChanged.rebuild_at_ms; 0
-- for none since it was uploaded). Indexing outcomes answering an older request are dropped.
-- Portable DDL: accepted by both SQLite and PostgreSQL.
ALTER TABLE kg_files ADD COLUMN index_requested_at_ms BIGINT NOT NULL DEFAULT 0;
