-- The last purge of each deleted namespace: when it was asked for, and when the indexer
-- reported its graph and vectors gone (0 until then). While a purge is unconfirmed nothing
-- can be written to the namespace, and the gateway refuses to create it again.
-- Portable DDL: accepted by both SQLite and PostgreSQL.
CREATE TABLE kg_namespace_purges (
    namespace TEXT PRIMARY KEY,
    requested_at_ms BIGINT NOT NULL,
    purged_at_ms BIGINT NOT NULL DEFAULT 0
);
