-- Portable DDL: accepted by both SQLite and PostgreSQL.
-- Whether the proposer's role was asserted by a stdio launcher (1) rather than granted (0).
-- Proposals stored before this column were made with granted or asserted roles alike; they
-- read as granted.
ALTER TABLE approval_proposals ADD COLUMN role_asserted BIGINT NOT NULL DEFAULT 0;
