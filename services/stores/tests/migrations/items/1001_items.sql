-- Portable DDL: accepted by SQLite and PostgreSQL alike.
CREATE TABLE test_items (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    size BIGINT NOT NULL,
    enabled BIGINT NOT NULL DEFAULT 1,
    score DOUBLE PRECISION,
    created_at BIGINT NOT NULL
);
CREATE INDEX test_items_size ON test_items (size);
