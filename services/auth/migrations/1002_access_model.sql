-- Groups, group grants, denies and the audit log. Portable DDL: accepted by
-- both SQLite and PostgreSQL (TEXT/BIGINT only, booleans as BIGINT 0/1).

CREATE TABLE kg_groups (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created_at_ms BIGINT NOT NULL
);

-- Members are principals only: groups do not nest.
CREATE TABLE kg_group_members (
    group_id TEXT NOT NULL REFERENCES kg_groups (id),
    principal_id TEXT NOT NULL REFERENCES kg_principals (id),
    added_at_ms BIGINT NOT NULL,
    PRIMARY KEY (group_id, principal_id)
);

CREATE INDEX kg_group_members_principal ON kg_group_members (principal_id);

-- A grant's subject is now a principal or a group. SQLite cannot change a
-- column's nullability, so the table is rebuilt: create, copy, drop, rename
-- (each step valid on both backends; nothing references kg_grants).
-- NULLs are distinct in UNIQUE on both backends, so each UNIQUE holds per
-- subject kind: one grant per (principal, namespace, prefix) and one per
-- (group, namespace, prefix).
CREATE TABLE kg_grants_v2 (
    id TEXT PRIMARY KEY,
    principal_id TEXT NULL REFERENCES kg_principals (id),
    group_id TEXT NULL REFERENCES kg_groups (id),
    namespace TEXT NOT NULL REFERENCES kg_namespaces (name),
    permission TEXT NOT NULL,
    path_prefix TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    CONSTRAINT kg_grants_one_subject
        CHECK ((principal_id IS NULL AND group_id IS NOT NULL) OR (principal_id IS NOT NULL AND group_id IS NULL)),
    CONSTRAINT kg_grants_principal_unique UNIQUE (principal_id, namespace, path_prefix),
    CONSTRAINT kg_grants_group_unique UNIQUE (group_id, namespace, path_prefix)
);

INSERT INTO kg_grants_v2 (id, principal_id, group_id, namespace, permission, path_prefix, created_at_ms)
SELECT id, principal_id, NULL, namespace, permission, path_prefix, created_at_ms FROM kg_grants;

DROP TABLE kg_grants;

ALTER TABLE kg_grants_v2 RENAME TO kg_grants;

CREATE INDEX kg_grants_principal ON kg_grants (principal_id);

CREATE INDEX kg_grants_group ON kg_grants (group_id);

-- Explicit denies; a deny wins over every grant. Subject: a principal, a
-- group, or everyone (both NULL). subject_key ('p:<id>', 'g:<id>' or '*') is
-- the non-NULL form of the subject so UNIQUE also covers everyone-denies.
-- Target: a folder prefix ('a/b/') or a file id; the unused one is ''.
CREATE TABLE kg_denies (
    id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL REFERENCES kg_namespaces (name),
    principal_id TEXT NULL REFERENCES kg_principals (id),
    group_id TEXT NULL REFERENCES kg_groups (id),
    subject_key TEXT NOT NULL,
    path_prefix TEXT NOT NULL,
    file_id TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    CONSTRAINT kg_denies_one_subject CHECK (principal_id IS NULL OR group_id IS NULL),
    CONSTRAINT kg_denies_one_target
        CHECK ((path_prefix = '' AND file_id <> '') OR (path_prefix <> '' AND file_id = '')),
    CONSTRAINT kg_denies_unique UNIQUE (namespace, subject_key, path_prefix, file_id)
);

CREATE INDEX kg_denies_principal ON kg_denies (principal_id);

CREATE INDEX kg_denies_group ON kg_denies (group_id);

-- One row per tool call. Principals are not foreign keys: the log outlives
-- whatever it mentions. namespaces is a JSON array of strings.
CREATE TABLE kg_audit (
    id TEXT PRIMARY KEY,
    at_ms BIGINT NOT NULL,
    principal_id TEXT NOT NULL,
    on_behalf_of TEXT NOT NULL,
    tool TEXT NOT NULL,
    namespaces TEXT NOT NULL,
    outcome TEXT NOT NULL,
    latency_us BIGINT NOT NULL,
    result_bytes BIGINT NOT NULL,
    request_id TEXT NOT NULL,
    transport TEXT NOT NULL
);

CREATE INDEX kg_audit_at ON kg_audit (at_ms, id);

CREATE INDEX kg_audit_principal_at ON kg_audit (principal_id, at_ms, id);
