-- An audit event lists at most 64 namespaces and counts the rest here (a search that
-- names none covers every namespace the caller may read, which can be more).
-- Portable DDL: accepted by both SQLite and PostgreSQL.
ALTER TABLE kg_audit ADD COLUMN more_namespaces BIGINT NOT NULL DEFAULT 0;
