-- Portable DDL: accepted by both SQLite and PostgreSQL.
-- One row per proposal. The resolved effect URL is never stored: only the
-- template and host, as they are the only parts a model may ever see.
CREATE TABLE approval_proposals (
    id TEXT PRIMARY KEY,
    object_name TEXT NOT NULL,
    action_name TEXT NOT NULL,
    arguments_json TEXT NOT NULL,
    arguments_sha256 TEXT NOT NULL,
    policy_version BIGINT NOT NULL,
    proposer TEXT NOT NULL,
    on_behalf_of TEXT NOT NULL,
    agent TEXT NOT NULL,
    role TEXT NOT NULL,
    state TEXT NOT NULL,
    refusal TEXT NOT NULL,
    outcome_detail TEXT NOT NULL,
    effect_method TEXT NOT NULL,
    effect_url_template TEXT NOT NULL,
    effect_host TEXT NOT NULL,
    attempts BIGINT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    execute_now BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    decided_at_ms BIGINT NULL,
    decided_by TEXT NOT NULL,
    decision_reason TEXT NOT NULL,
    finished_at_ms BIGINT NULL
);

CREATE INDEX approval_proposals_state ON approval_proposals (state, created_at_ms);
CREATE INDEX approval_proposals_created ON approval_proposals (created_at_ms);

-- The audit trail: one row per step, written in the same transaction as the
-- state change it records.
CREATE TABLE approval_events (
    proposal_id TEXT NOT NULL REFERENCES approval_proposals (id),
    seq BIGINT NOT NULL,
    at_ms BIGINT NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT NOT NULL,
    detail TEXT NOT NULL,
    attempt BIGINT NOT NULL,
    http_status BIGINT NOT NULL,
    PRIMARY KEY (proposal_id, seq)
);
