-- The access epoch: one counter that every change to what Authorize reads
-- (namespaces, principals, groups, members, grants, denies, a PAT's hash,
-- owner, expiry or revocation) moves forward, in the same transaction as the
-- change. Authorize keeps what it resolved per token only while the epoch it
-- read is current, so no cached permission outlives a revocation, on any
-- replica. The triggers that move it are dialect-specific: AuthStore::open
-- creates them. Portable DDL: accepted by both SQLite and PostgreSQL.
CREATE TABLE kg_auth_epoch (
    id BIGINT PRIMARY KEY,
    epoch BIGINT NOT NULL
);

INSERT INTO kg_auth_epoch (id, epoch) VALUES (1, 0);
