-- What each file version says about itself and where it links, as the indexer
-- reported it (kg.index.v1.<ns>.indexed). Keyed by version_id: versions are
-- content-addressed, so branches and releases share these rows at no cost.
-- Whether an internal link is broken is decided when the link graph is read,
-- against the files live in the branch or release being read.
-- Portable DDL: accepted by both SQLite and PostgreSQL.
CREATE TABLE kg_file_version_meta (
    version_id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    file_id TEXT NOT NULL,
    -- The file's path when the links were resolved.
    source_path TEXT NOT NULL,
    title TEXT NOT NULL,
    doc_type TEXT NOT NULL,
    -- JSON arrays of strings.
    tags TEXT NOT NULL,
    collections TEXT NOT NULL,
    -- YYYY-MM-DD, or '' when unknown.
    document_date TEXT NOT NULL,
    effective_from TEXT NOT NULL,
    effective_to TEXT NOT NULL,
    link_count BIGINT NOT NULL,
    -- Links the indexer left out of its event (over its size cap).
    links_omitted BIGINT NOT NULL,
    indexed_at_ms BIGINT NOT NULL
);

CREATE TABLE kg_file_version_links (
    version_id TEXT NOT NULL,
    -- Position among the document's links.
    ordinal BIGINT NOT NULL,
    -- internal | external | invalid
    kind TEXT NOT NULL,
    -- link | image | wiki
    syntax TEXT NOT NULL,
    -- internal: normalised namespace path; external: the URL; invalid: ''.
    target_path TEXT NOT NULL,
    raw_target TEXT NOT NULL,
    fragment TEXT NOT NULL,
    label TEXT NOT NULL,
    PRIMARY KEY (version_id, ordinal)
);

CREATE INDEX kg_file_version_links_target ON kg_file_version_links (target_path);
