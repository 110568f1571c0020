-- What an admin API change was made on (its path, e.g. /api/v1/grants/gr_1); empty for the
-- events of tool calls. Portable DDL: accepted by both SQLite and PostgreSQL.
ALTER TABLE kg_audit ADD COLUMN target TEXT NOT NULL DEFAULT '';
