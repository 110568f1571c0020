//! The approval tables (SQLite or PostgreSQL through one pool). Every state
//! change is a guarded `UPDATE ... WHERE state = <expected>` in the same
//! transaction as the audit event that records it, so two deciders can never
//! both win and no step goes unrecorded.

use kg_proto::v1::{Proposal, ProposalEvent, ProposalState};
use kg_stores::sql::SqlStore;
use sqlx::Row as _;
use sqlx::any::AnyRow;

use crate::error::{ApprovalError, Result};

pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Stored name of a state.
pub(crate) fn state_str(state: ProposalState) -> &'static str {
    match state {
        ProposalState::Pending => "pending",
        ProposalState::Rejected => "rejected",
        ProposalState::Executed => "executed",
        ProposalState::EffectFailed => "effect_failed",
        ProposalState::Unknown => "unknown",
        ProposalState::PreconditionFailed => "precondition_failed",
        ProposalState::Approved => "approved",
        ProposalState::EffectMisconfigured => "effect_misconfigured",
        ProposalState::Unspecified => "unspecified",
    }
}

fn state_from(s: &str) -> Result<ProposalState> {
    Ok(match s {
        "pending" => ProposalState::Pending,
        "rejected" => ProposalState::Rejected,
        "executed" => ProposalState::Executed,
        "effect_failed" => ProposalState::EffectFailed,
        "unknown" => ProposalState::Unknown,
        "precondition_failed" => ProposalState::PreconditionFailed,
        "approved" => ProposalState::Approved,
        "effect_misconfigured" => ProposalState::EffectMisconfigured,
        other => return Err(ApprovalError::Corrupt(format!("proposal state `{other}`"))),
    })
}

/// One audit step to write.
#[derive(Debug, Clone, Default)]
pub(crate) struct Event {
    pub(crate) kind: &'static str,
    pub(crate) actor: String,
    pub(crate) detail: String,
    pub(crate) attempt: u32,
    pub(crate) http_status: u16,
}

impl Event {
    pub(crate) fn new(kind: &'static str, actor: &str, detail: impl Into<String>) -> Self {
        Self {
            kind,
            actor: actor.to_owned(),
            detail: detail.into(),
            ..Default::default()
        }
    }
}

/// How a proposal ended (or the re-check refused).
pub(crate) struct Outcome<'a> {
    pub(crate) state: ProposalState,
    pub(crate) refusal: &'a str,
    pub(crate) detail: &'a str,
}

const COLUMNS: &str = "id, object_name, action_name, arguments_json, arguments_sha256, policy_version, \
    proposer, on_behalf_of, agent, role, state, refusal, outcome_detail, effect_method, \
    effect_url_template, effect_host, attempts, idempotency_key, execute_now, created_at_ms, \
    decided_at_ms, decided_by, decision_reason, finished_at_ms, role_asserted";

fn proposal_from(row: &AnyRow) -> Result<Proposal> {
    let state = state_from(&row.try_get::<String, _>("state")?)?;
    Ok(Proposal {
        id: row.try_get("id")?,
        object: row.try_get("object_name")?,
        action: row.try_get("action_name")?,
        arguments_json: row.try_get("arguments_json")?,
        arguments_sha256: row.try_get("arguments_sha256")?,
        policy_version: row.try_get("policy_version")?,
        proposer: row.try_get("proposer")?,
        on_behalf_of: row.try_get("on_behalf_of")?,
        agent: row.try_get("agent")?,
        role: row.try_get("role")?,
        role_asserted: row.try_get::<i64, _>("role_asserted")? != 0,
        state: state as i32,
        refusal: row.try_get("refusal")?,
        outcome_detail: row.try_get("outcome_detail")?,
        effect_method: row.try_get("effect_method")?,
        effect_url_template: row.try_get("effect_url_template")?,
        effect_host: row.try_get("effect_host")?,
        attempts: u32::try_from(row.try_get::<i64, _>("attempts")?).unwrap_or(0),
        idempotency_key: row.try_get("idempotency_key")?,
        execute_now: row.try_get::<i64, _>("execute_now")? != 0,
        created_at_ms: row.try_get("created_at_ms")?,
        decided_at_ms: row.try_get("decided_at_ms")?,
        decided_by: row.try_get("decided_by")?,
        decision_reason: row.try_get("decision_reason")?,
        finished_at_ms: row.try_get("finished_at_ms")?,
        events: Vec::new(),
    })
}

/// The approval tables.
#[derive(Clone)]
pub(crate) struct ProposalStore {
    sql: SqlStore,
    /// How long a run's lease lasts without renewal.
    run_lease: std::time::Duration,
}

async fn insert_event(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    proposal_id: &str,
    event: &Event,
) -> Result<()> {
    // seq = next number for this proposal; events of one proposal are written
    // one after another (the state machine serialises them).
    sqlx::query(
        "INSERT INTO approval_events (proposal_id, seq, at_ms, kind, actor, detail, attempt, http_status) \
         SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4, $5, $6, $7 FROM approval_events WHERE proposal_id = $1",
    )
    .bind(proposal_id)
    .bind(kg_common::caller::now_ms())
    .bind(event.kind)
    .bind(&event.actor)
    .bind(&event.detail)
    .bind(i64::from(event.attempt))
    .bind(i64::from(event.http_status))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl ProposalStore {
    pub(crate) async fn open(sql: SqlStore, run_lease: std::time::Duration) -> Result<Self> {
        sql.migrate(&MIGRATOR).await?;
        Ok(Self { sql, run_lease })
    }

    /// When a lease taken or renewed now lapses.
    fn lease_until(&self) -> i64 {
        kg_common::caller::now_ms() + i64::try_from(self.run_lease.as_millis()).unwrap_or(i64::MAX)
    }

    /// Stores a new proposal with its first events.
    pub(crate) async fn insert(&self, p: &Proposal, events: &[Event]) -> Result<()> {
        let mut tx = self.sql.begin_write().await?;
        sqlx::query(
            "INSERT INTO approval_proposals (id, object_name, action_name, arguments_json, arguments_sha256, \
             policy_version, proposer, on_behalf_of, agent, role, state, refusal, outcome_detail, effect_method, \
             effect_url_template, effect_host, attempts, idempotency_key, execute_now, created_at_ms, \
             decided_at_ms, decided_by, decision_reason, finished_at_ms, role_asserted, run_lease_until_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26)",
        )
        .bind(&p.id)
        .bind(&p.object)
        .bind(&p.action)
        .bind(&p.arguments_json)
        .bind(&p.arguments_sha256)
        .bind(p.policy_version)
        .bind(&p.proposer)
        .bind(&p.on_behalf_of)
        .bind(&p.agent)
        .bind(&p.role)
        .bind(state_str(p.state()))
        .bind(&p.refusal)
        .bind(&p.outcome_detail)
        .bind(&p.effect_method)
        .bind(&p.effect_url_template)
        .bind(&p.effect_host)
        .bind(i64::from(p.attempts))
        .bind(&p.idempotency_key)
        .bind(i64::from(p.execute_now))
        .bind(p.created_at_ms)
        .bind(p.decided_at_ms)
        .bind(&p.decided_by)
        .bind(&p.decision_reason)
        .bind(p.finished_at_ms)
        .bind(i64::from(p.role_asserted))
        // A proposal stored approved (execute_now) is this process's run from the start.
        .bind((p.state() == ProposalState::Approved).then(|| self.lease_until()))
        .execute(&mut *tx)
        .await?;
        for event in events {
            insert_event(&mut tx, &p.id, event).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn get(&self, id: &str) -> Result<Option<Proposal>> {
        let sql = format!("SELECT {COLUMNS} FROM approval_proposals WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(self.sql.pool())
            .await?;
        row.as_ref().map(proposal_from).transpose()
    }

    pub(crate) async fn events(&self, id: &str) -> Result<Vec<ProposalEvent>> {
        let rows = sqlx::query(
            "SELECT at_ms, kind, actor, detail, attempt, http_status FROM approval_events \
             WHERE proposal_id = $1 ORDER BY seq",
        )
        .bind(id)
        .fetch_all(self.sql.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ProposalEvent {
                    at_ms: row.try_get("at_ms")?,
                    kind: row.try_get("kind")?,
                    actor: row.try_get("actor")?,
                    detail: row.try_get("detail")?,
                    attempt: u32::try_from(row.try_get::<i64, _>("attempt")?).unwrap_or(0),
                    http_status: u32::try_from(row.try_get::<i64, _>("http_status")?).unwrap_or(0),
                })
            })
            .collect()
    }

    pub(crate) async fn list(
        &self,
        state: Option<ProposalState>,
        limit: u32,
    ) -> Result<Vec<Proposal>> {
        let limit = i64::from(limit);
        let rows = match state {
            Some(state) => {
                let sql = format!(
                    "SELECT {COLUMNS} FROM approval_proposals WHERE state = $1 \
                     ORDER BY created_at_ms DESC, id DESC LIMIT $2"
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(state_str(state))
                    .bind(limit)
                    .fetch_all(self.sql.pool())
                    .await?
            }
            None => {
                let sql = format!(
                    "SELECT {COLUMNS} FROM approval_proposals ORDER BY created_at_ms DESC, id DESC LIMIT $1"
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(limit)
                    .fetch_all(self.sql.pool())
                    .await?
            }
        };
        rows.iter().map(proposal_from).collect()
    }

    /// pending -> approved | rejected. `false` when another decision came first.
    pub(crate) async fn claim_decision(
        &self,
        id: &str,
        to: ProposalState,
        by: &str,
        reason: &str,
        event: &Event,
    ) -> Result<bool> {
        let mut tx = self.sql.begin_write().await?;
        let now = kg_common::caller::now_ms();
        let finished = (to == ProposalState::Rejected).then_some(now);
        let lease = (to == ProposalState::Approved).then(|| self.lease_until());
        let done = sqlx::query(
            "UPDATE approval_proposals SET state = $1, decided_by = $2, decision_reason = $3, \
             decided_at_ms = $4, finished_at_ms = $5, run_lease_until_ms = $6 \
             WHERE id = $7 AND state = 'pending'",
        )
        .bind(state_str(to))
        .bind(by)
        .bind(reason)
        .bind(now)
        .bind(finished)
        .bind(lease)
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if done != 1 {
            return Ok(false);
        }
        insert_event(&mut tx, id, event).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// approved -> pending, when the re-check could not run (nothing was sent).
    pub(crate) async fn release_claim(&self, id: &str, event: &Event) -> Result<bool> {
        let mut tx = self.sql.begin_write().await?;
        let done = sqlx::query(
            "UPDATE approval_proposals SET state = 'pending', decided_by = '', decision_reason = '', \
             decided_at_ms = NULL, run_lease_until_ms = NULL \
             WHERE id = $1 AND state = 'approved' AND attempts = 0",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if done != 1 {
            return Ok(false);
        }
        insert_event(&mut tx, id, event).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Records an audit event without a state change.
    pub(crate) async fn record(&self, id: &str, event: &Event) -> Result<()> {
        let mut tx = self.sql.begin_write().await?;
        insert_event(&mut tx, id, event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records a passed re-check with the effect's method, template and host
    /// as rendered now (a pending proposal may have been stored without them).
    pub(crate) async fn record_recheck(
        &self,
        id: &str,
        method: &str,
        url_template: &str,
        host: &str,
        event: &Event,
    ) -> Result<()> {
        let mut tx = self.sql.begin_write().await?;
        sqlx::query(
            "UPDATE approval_proposals SET effect_method = $1, effect_url_template = $2, effect_host = $3 \
             WHERE id = $4 AND state = 'approved'",
        )
        .bind(method)
        .bind(url_template)
        .bind(host)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        insert_event(&mut tx, id, event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Counts an attempt before it is sent, so a crash mid-send is visible.
    pub(crate) async fn begin_attempt(&self, id: &str, attempt: u32) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE approval_proposals SET attempts = $1 WHERE id = $2 AND state = 'approved'",
        )
        .bind(i64::from(attempt))
        .bind(id)
        .execute(self.sql.pool())
        .await?
        .rows_affected();
        Ok(done == 1)
    }

    /// approved -> a final state.
    pub(crate) async fn finish(
        &self,
        id: &str,
        outcome: &Outcome<'_>,
        event: &Event,
    ) -> Result<bool> {
        let mut tx = self.sql.begin_write().await?;
        let done = sqlx::query(
            "UPDATE approval_proposals SET state = $1, refusal = $2, outcome_detail = $3, finished_at_ms = $4 \
             WHERE id = $5 AND state = 'approved'",
        )
        .bind(state_str(outcome.state))
        .bind(outcome.refusal)
        .bind(outcome.detail)
        .bind(kg_common::caller::now_ms())
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if done != 1 {
            return Ok(false);
        }
        insert_event(&mut tx, id, event).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Extends the leases of the runs this process holds (`ids`), for as long as each is
    /// still approved.
    pub(crate) async fn renew_leases(&self, ids: &[String]) -> Result<()> {
        let until = self.lease_until();
        for id in ids {
            sqlx::query(
                "UPDATE approval_proposals SET run_lease_until_ms = $1 WHERE id = $2 AND state = 'approved'",
            )
            .bind(until)
            .bind(id)
            .execute(self.sql.pool())
            .await?;
        }
        Ok(())
    }

    /// Settles the proposals left `approved` by a process that stopped mid-run: those whose
    /// lease lapsed, and those approved before leases existed and decided before
    /// `unleased_before_ms`.
    pub(crate) async fn settle_interrupted(&self, unleased_before_ms: i64) -> Result<usize> {
        let rows = sqlx::query(
            "SELECT id, attempts FROM approval_proposals WHERE state = 'approved' \
             AND (run_lease_until_ms < $1 OR (run_lease_until_ms IS NULL AND decided_at_ms < $2))",
        )
        .bind(kg_common::caller::now_ms())
        .bind(unleased_before_ms)
        .fetch_all(self.sql.pool())
        .await?;
        let mut interrupted = Vec::with_capacity(rows.len());
        for row in rows {
            interrupted.push((row.try_get("id")?, row.try_get("attempts")?));
        }
        self.settle(&interrupted).await
    }

    /// Settles the runs this process holds and is about to abandon (it is stopping).
    pub(crate) async fn settle_abandoned(&self, ids: &[String]) -> Result<usize> {
        let mut abandoned = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(proposal) = self.get(id).await? {
                abandoned.push((proposal.id, i64::from(proposal.attempts)));
            }
        }
        self.settle(&abandoned).await
    }

    /// Ends interrupted runs, given as (id, attempts counted): with attempts they become
    /// UNKNOWN (a request may have gone out), without they become EFFECT_FAILED (nothing was
    /// sent). A run that ended meanwhile is left as it ended.
    async fn settle(&self, interrupted: &[(String, i64)]) -> Result<usize> {
        let mut settled = 0;
        for (id, attempts) in interrupted {
            let (id, attempts) = (id.as_str(), *attempts);
            let (state, detail) = if attempts > 0 {
                (
                    ProposalState::Unknown,
                    "the approval service stopped while the effect was running: it may or may not have been applied; do not retry",
                )
            } else {
                (
                    ProposalState::EffectFailed,
                    "the approval service stopped before the effect was sent; nothing was sent",
                )
            };
            let outcome = Outcome {
                state,
                refusal: "",
                detail,
            };
            if self
                .finish(id, &outcome, &Event::new("outcome", "", detail))
                .await?
            {
                settled += 1;
            }
        }
        Ok(settled)
    }
}
