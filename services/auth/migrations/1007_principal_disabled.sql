-- When a principal was disabled (NULL while it is enabled). A disabled principal's tokens,
-- and those of agents acting for it, pass no Authorize; its grants, groups and tokens stay,
-- so enabling it again restores what it had. Portable DDL: accepted by both SQLite and
-- PostgreSQL.
ALTER TABLE kg_principals ADD COLUMN disabled_at_ms BIGINT NULL;
