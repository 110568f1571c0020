-- Portable DDL: accepted by both SQLite and PostgreSQL.
-- Until when the process running an approved proposal's effect holds it: it renews the lease
-- while the run lives, and any approval process settles a proposal whose lease has lapsed
-- (its process stopped mid-run). NULL for proposals approved before this column: they are
-- settled by their decision's age, as before.
ALTER TABLE approval_proposals ADD COLUMN run_lease_until_ms BIGINT NULL;
