-- Portable DDL: accepted by both SQLite and PostgreSQL.
CREATE TABLE kg_files (
    file_id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    path TEXT NOT NULL,
    version_id TEXT NOT NULL,
    content_sha256 TEXT NOT NULL,
    size BIGINT NOT NULL,
    mime TEXT NOT NULL,
    status TEXT NOT NULL,
    status_reason TEXT NOT NULL,
    enabled BIGINT NOT NULL DEFAULT 1,
    hidden BIGINT NOT NULL DEFAULT 0,
    chunk_count BIGINT NOT NULL DEFAULT 0,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    UNIQUE (namespace, path)
);

CREATE TABLE kg_file_versions (
    version_id TEXT PRIMARY KEY,
    file_id TEXT NOT NULL REFERENCES kg_files (file_id),
    content_sha256 TEXT NOT NULL,
    blob_key TEXT NOT NULL,
    size BIGINT NOT NULL,
    mime TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL
);

CREATE INDEX kg_file_versions_file ON kg_file_versions (file_id);
