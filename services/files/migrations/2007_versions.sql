-- Versions of a namespace: preview branches overlay file versions on main
-- (the live kg_files registry), releases snapshot file_id -> version_id,
-- environments point at a release with their deploy history.
-- Portable DDL: accepted by both SQLite and PostgreSQL.
CREATE TABLE kg_branches (
    branch_id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    created_by TEXT NOT NULL,
    UNIQUE (namespace, name)
);

-- One row per file whose version on the branch differs from main. Blob
-- columns live here because a branch-only file has no kg_files row.
CREATE TABLE kg_branch_files (
    branch_id TEXT NOT NULL REFERENCES kg_branches (branch_id),
    file_id TEXT NOT NULL,
    path TEXT NOT NULL,
    version_id TEXT NOT NULL,
    content_sha256 TEXT NOT NULL,
    blob_key TEXT NOT NULL,
    size BIGINT NOT NULL,
    mime TEXT NOT NULL,
    deleted BIGINT NOT NULL DEFAULT 0,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (branch_id, file_id),
    UNIQUE (branch_id, path)
);

CREATE TABLE kg_releases (
    release_id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    version TEXT NOT NULL,
    branch_id TEXT NOT NULL,
    note TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    created_by TEXT NOT NULL,
    UNIQUE (namespace, version)
);

CREATE TABLE kg_release_files (
    release_id TEXT NOT NULL REFERENCES kg_releases (release_id),
    file_id TEXT NOT NULL,
    path TEXT NOT NULL,
    version_id TEXT NOT NULL,
    PRIMARY KEY (release_id, file_id)
);

CREATE TABLE kg_environments (
    environment_id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    release_id TEXT NOT NULL REFERENCES kg_releases (release_id),
    updated_at_ms BIGINT NOT NULL,
    UNIQUE (namespace, name)
);

CREATE TABLE kg_environment_deploys (
    environment_id TEXT NOT NULL REFERENCES kg_environments (environment_id),
    seq BIGINT NOT NULL,
    release_id TEXT NOT NULL REFERENCES kg_releases (release_id),
    deployed_at_ms BIGINT NOT NULL,
    deployed_by TEXT NOT NULL,
    PRIMARY KEY (environment_id, seq)
);
