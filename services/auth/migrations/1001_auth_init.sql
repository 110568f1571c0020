-- Portable DDL: accepted by both SQLite and PostgreSQL.
CREATE TABLE kg_namespaces (
    name TEXT PRIMARY KEY,
    description TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL
);

CREATE TABLE kg_principals (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    acts_for TEXT NULL REFERENCES kg_principals (id),
    is_admin BIGINT NOT NULL DEFAULT 0,
    created_at_ms BIGINT NOT NULL
);

CREATE TABLE kg_grants (
    id TEXT PRIMARY KEY,
    principal_id TEXT NOT NULL REFERENCES kg_principals (id),
    namespace TEXT NOT NULL REFERENCES kg_namespaces (name),
    permission TEXT NOT NULL,
    path_prefix TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    UNIQUE (principal_id, namespace, path_prefix)
);

CREATE INDEX kg_grants_principal ON kg_grants (principal_id);

CREATE TABLE kg_pats (
    id TEXT PRIMARY KEY,
    principal_id TEXT NOT NULL REFERENCES kg_principals (id),
    name TEXT NOT NULL,
    prefix TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at_ms BIGINT NOT NULL,
    last_used_at_ms BIGINT NULL,
    expires_at_ms BIGINT NULL,
    revoked_at_ms BIGINT NULL
);

CREATE INDEX kg_pats_principal ON kg_pats (principal_id);
