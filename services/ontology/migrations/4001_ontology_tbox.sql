-- Namespace TBoxes: one editable draft per namespace, and every published
-- version. Portable DDL (TEXT/BIGINT only) for SQLite and PostgreSQL.
-- Bodies are base64 of the prost-encoded kg.v1.Tbox.

CREATE TABLE kg_tbox_drafts (
    namespace TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    updated_by TEXT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    reviewed_by TEXT NULL,
    reviewed_at_ms BIGINT NULL
);

CREATE TABLE kg_tbox_versions (
    namespace TEXT NOT NULL,
    version BIGINT NOT NULL,
    body TEXT NOT NULL,
    published_by TEXT NOT NULL,
    reviewed_by TEXT NOT NULL,
    published_at_ms BIGINT NOT NULL,
    PRIMARY KEY (namespace, version)
);
