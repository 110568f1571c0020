-- How many flag changes (enable, disable, hide, show) a file has had. Every change event
-- carries it, so the indexer keeps a file's newest flags whatever order concurrent changes
-- reach it in. Portable DDL: accepted by both SQLite and PostgreSQL.
ALTER TABLE kg_files ADD COLUMN flags_version BIGINT NOT NULL DEFAULT 0;
