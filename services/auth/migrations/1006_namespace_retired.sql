-- When a namespace's deletion began (NULL for a live namespace). A retired namespace reaches
-- no token and shows in no listing; its row keeps the name taken until the deletion ends.
-- Portable DDL: accepted by both SQLite and PostgreSQL.
ALTER TABLE kg_namespaces ADD COLUMN retired_at_ms BIGINT NULL;
