-- Which rows name a version, for the prune of versions nothing names (version_prune.rs): each
-- of its NOT EXISTS checks is an index probe instead of a scan of the table.
-- Portable DDL: accepted by both SQLite and PostgreSQL.
CREATE INDEX kg_files_version ON kg_files (version_id);
CREATE INDEX kg_branch_files_version ON kg_branch_files (version_id);
CREATE INDEX kg_release_files_version ON kg_release_files (version_id);
