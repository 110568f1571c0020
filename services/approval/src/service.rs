//! The approval logic: submit, list, inspect, decide, and the effect run.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kg_common::caller::{attach_caller, require_admin};
use kg_common::sanitize::sanitize_text;
use kg_common::{ErrorCode, ErrorExt as _};
use kg_proto::v1::ontology_client::OntologyClient;
use kg_proto::v1::{
    CallerContext, CheckActionRequest, CheckActionResponse, PrincipalKind, Proposal, ProposalState,
    SignedCallerContext, SubmitProposalRequest, WebhookEffect,
};
use kg_stores::sql::SqlStore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::effect::{self, Attempt, Final, SecretSource, Step};
use crate::error::{ApprovalError, Result};
use crate::signature::{canonical_json, idempotency_key, sha256_hex};
use crate::store::{Event, Outcome, ProposalStore, state_str};

/// Default number of proposals a list returns.
pub const DEFAULT_LIST_LIMIT: u32 = 100;
/// Most proposals a list returns.
pub const MAX_LIST_LIMIT: u32 = 1000;
/// Most bytes of proposals one list answer carries: a full page of the largest proposals
/// would be over what a gRPC message carries.
const LIST_BYTES: usize = 16 * 1024 * 1024;
/// Largest arguments document accepted.
const MAX_ARGUMENTS_BYTES: usize = kg_proto::limits::PROPOSAL_ARGUMENTS_BYTES;
/// Deadline on one CheckAction call.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);
/// A proposal approved before run leases existed (it has none) and still `approved` this
/// long after its decision belongs to a process that stopped (a run is bounded far below).
const INTERRUPTED_AFTER: Duration = Duration::from_secs(30 * 60);
/// How long a run's lease lasts without renewal (renewed every third of it): a process that
/// stopped mid-run leaves its proposals approved at most about this long.
pub const DEFAULT_RUN_LEASE: Duration = Duration::from_secs(30);
/// How long a stopping service lets its running effects finish before it settles them.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(5);

/// How the approval service runs.
#[derive(Clone, Debug)]
pub struct ApprovalConfig {
    /// gRPC address of the ontology service (`http://host:port`); without it
    /// nothing can be approved or executed (proposals are still stored).
    pub ontology_addr: Option<String>,
    /// Key of the `X-Kgmesh-Signature` HMAC (per deployment).
    pub webhook_signing_secret: Vec<u8>,
    /// Environment variables no secret header may read (the signing secret's).
    pub protected_env: Vec<String>,
    /// Where secret header values come from.
    pub secrets: SecretSource,
    /// How long Decide / Submit(execute_now) wait for the effect before
    /// answering with the proposal still APPROVED (the run continues).
    pub decide_wait: Duration,
    /// First backoff between attempts; doubles each time.
    pub backoff_base: Duration,
    /// Four-eyes rule: the proposer (the user behind the agent) may not
    /// approve their own proposal (`[approval] four_eyes`, default off).
    pub four_eyes: bool,
    /// How long the hold on a running effect lasts unless renewed: any approval process
    /// settles a proposal whose run's process stopped once this lapses.
    pub run_lease: Duration,
    /// How long a stopping service waits for its running effects before settling them.
    pub stop_grace: Duration,
}

impl ApprovalConfig {
    /// Defaults around a signing secret: secrets from the environment, 15 s
    /// wait (under the gateway's 20 s backend deadline), 250 ms first backoff.
    pub fn new(webhook_signing_secret: Vec<u8>, ontology_addr: Option<String>) -> Self {
        Self {
            ontology_addr,
            webhook_signing_secret,
            protected_env: Vec::new(),
            secrets: SecretSource::Env,
            decide_wait: Duration::from_secs(15),
            backoff_base: Duration::from_millis(250),
            four_eyes: false,
            run_lease: DEFAULT_RUN_LEASE,
            stop_grace: DEFAULT_STOP_GRACE,
        }
    }
}

/// The approval service: cheap to clone, constructible in-process.
#[derive(Clone)]
pub struct ApprovalService {
    inner: Arc<Inner>,
}

struct Inner {
    store: ProposalStore,
    ontology: Option<OntologyClient<Channel>>,
    http: reqwest::Client,
    config: ApprovalConfig,
    /// The approved proposals whose run this process holds (their leases it renews).
    runs: Arc<Mutex<HashSet<String>>>,
}

/// This process's hold on one proposal's run, from the approval until the run ends; dropping
/// it (the run ended, or never started) lets the lease lapse.
struct RunHold {
    runs: Arc<Mutex<HashSet<String>>>,
    id: String,
}

impl RunHold {
    fn new(runs: &Arc<Mutex<HashSet<String>>>, id: &str) -> Self {
        lock(runs).insert(id.to_owned());
        Self {
            runs: runs.clone(),
            id: id.to_owned(),
        }
    }
}

impl Drop for RunHold {
    fn drop(&mut self) {
        lock(&self.runs).remove(&self.id);
    }
}

fn lock(runs: &Mutex<HashSet<String>>) -> std::sync::MutexGuard<'_, HashSet<String>> {
    runs.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn state_name(state: ProposalState) -> &'static str {
    state_str(state)
}

fn check_name(what: &str, value: &str) -> Result<()> {
    if value.is_empty() || value.len() > 128 || value.chars().any(|c| c.is_control()) {
        return Err(ApprovalError::Invalid(format!(
            "{what} must be 1-128 printable characters"
        )));
    }
    Ok(())
}

impl ApprovalService {
    /// Opens the store (running migrations), connects lazily to the ontology
    /// service, and settles proposals a stopped process left running.
    pub async fn new(sql: SqlStore, config: ApprovalConfig) -> Result<Self> {
        if config.webhook_signing_secret.len() < crate::secret::MIN_SECRET_BYTES {
            return Err(ApprovalError::Config(
                "the webhook signing secret must be at least 16 bytes".to_owned(),
            ));
        }
        let store = ProposalStore::open(sql, config.run_lease).await?;
        let ontology = match &config.ontology_addr {
            Some(addr) => Some(OntologyClient::new(
                kg_common::grpc::channel(addr).map_err(|err| {
                    ApprovalError::Config(format!("ontology address `{addr}`: {err}"))
                })?,
            )),
            None => None,
        };
        let http =
            effect::client().map_err(|err| ApprovalError::Config(format!("http client: {err}")))?;
        let service = Self {
            inner: Arc::new(Inner {
                store,
                ontology,
                http,
                config,
                runs: Arc::default(),
            }),
        };
        service.settle_interrupted().await?;
        Ok(service)
    }

    /// Settles the proposals a stopped process left approved (their lease lapsed).
    pub(crate) async fn settle_interrupted(&self) -> Result<usize> {
        let cutoff = kg_common::caller::now_ms()
            - i64::try_from(INTERRUPTED_AFTER.as_millis()).unwrap_or(i64::MAX);
        let settled = self.inner.store.settle_interrupted(cutoff).await?;
        if settled > 0 {
            tracing::warn!(
                settled,
                "settled proposals left running by a stopped process"
            );
        }
        Ok(settled)
    }

    /// Until `shutdown`: renews the leases of this process's runs and settles the proposals
    /// whose lease lapsed, every third of a lease (so a live run's lease never lapses). A
    /// store error is logged and tried again at the next turn.
    pub(crate) async fn keep_leases(&self, shutdown: CancellationToken) {
        let every = (self.inner.config.run_lease / 3).max(Duration::from_millis(10));
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let held: Vec<String> = lock(&self.inner.runs).iter().cloned().collect();
            if let Err(err) = self.inner.store.renew_leases(&held).await {
                tracing::warn!(error = %err, code = %err.code(), "cannot renew the leases of running effects");
            }
            if let Err(err) = self.settle_interrupted().await {
                tracing::warn!(error = %err, code = %err.code(), "cannot settle interrupted proposals");
            }
        }
    }

    /// For a stopping service: waits up to `stop_grace` for its running effects to end, then
    /// settles those still running as interrupted (`unknown` once a request may have gone
    /// out), so none is left approved for another process to find later.
    pub(crate) async fn drain_on_stop(&self) {
        let until = Instant::now() + self.inner.config.stop_grace;
        while !lock(&self.inner.runs).is_empty() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let abandoned: Vec<String> = lock(&self.inner.runs).iter().cloned().collect();
        if abandoned.is_empty() {
            return;
        }
        match self.inner.store.settle_abandoned(&abandoned).await {
            Ok(settled) => {
                tracing::warn!(settled, "stopping: settled the effects still running");
            }
            Err(err) => {
                tracing::warn!(error = %err, code = %err.code(), "stopping: cannot settle the effects still running; another approval process settles them once their lease lapses");
            }
        }
    }

    /// Stores a proposal for `caller` (the proposer), or with `execute_now`
    /// runs it at once when the ontology says the action needs no approval.
    /// `allowed` is the time the call may take (its gRPC deadline): the check and
    /// the wait for the effect stay within it.
    pub async fn submit(
        &self,
        caller: &CallerContext,
        signed: &SignedCallerContext,
        request: SubmitProposalRequest,
        allowed: Duration,
    ) -> Result<Proposal> {
        let done_by = kg_common::grpc::work_deadline(allowed);
        check_name("object", &request.object)?;
        check_name("action", &request.action)?;
        if request.role.len() > 128 {
            return Err(ApprovalError::Invalid("role is too long".to_owned()));
        }
        // The role is the proposer's only if its signed context carries it: a role named in
        // the request alone would let any holder of a context propose as any role.
        kg_common::caller::require_role(caller, &request.role)?;
        if request.arguments_json.len() > MAX_ARGUMENTS_BYTES {
            return Err(ApprovalError::Invalid(format!(
                "arguments_json is larger than {MAX_ARGUMENTS_BYTES} bytes"
            )));
        }
        let arguments: serde_json::Value = serde_json::from_str(&request.arguments_json)
            .map_err(|_| ApprovalError::Invalid("arguments_json is not valid JSON".to_owned()))?;
        if !arguments.is_object() {
            return Err(ApprovalError::Invalid(
                "arguments_json must be a JSON object".to_owned(),
            ));
        }
        if caller.principal_id.is_empty() {
            return Err(kg_common::caller::CallerError::Missing.into());
        }
        let canonical = canonical_json(&arguments);
        let arguments_sha256 = sha256_hex(canonical.as_bytes());
        let id = format!("prp_{}", uuid::Uuid::now_v7().simple());
        let now = kg_common::caller::now_ms();
        let mut proposal = Proposal {
            idempotency_key: idempotency_key(&id, &arguments_sha256),
            id,
            object: request.object.clone(),
            action: request.action.clone(),
            arguments_json: canonical,
            arguments_sha256,
            policy_version: request.policy_version,
            proposer: caller.principal_id.clone(),
            on_behalf_of: caller.on_behalf_of.clone(),
            agent: sanitize_text(&request.agent, 200),
            role: request.role.clone(),
            role_asserted: caller.roles_asserted,
            state: ProposalState::Pending as i32,
            created_at_ms: now,
            execute_now: request.execute_now,
            ..Default::default()
        };
        let submitted = Event::new(
            "submitted",
            &caller.principal_id,
            format!(
                "{}.{} proposed as role `{}`, {} (policy version {})",
                proposal.object,
                proposal.action,
                proposal.role,
                role_source(proposal.role_asserted),
                proposal.policy_version
            ),
        );

        if !request.execute_now {
            // The method, template and host an approver reads come from the ontology, like
            // the effect that runs: a caller that went round the generated tool could send
            // any. When the ontology cannot render them now (down, or serving no project
            // here) the proposal is stored without them, and the re-check at decision time,
            // which must succeed before anything runs, fills them in.
            match self.check(&proposal, signed, done_by).await {
                Ok(check) => {
                    if let (true, Some(effect)) = (check.refusal.is_empty(), &check.effect) {
                        set_effect_summary(&mut proposal, effect);
                    }
                }
                Err(err) => {
                    tracing::info!(proposal = %proposal.id, error = %err, "no effect summary at submit; the re-check will render it");
                }
            }
            self.inner.store.insert(&proposal, &[submitted]).await?;
            tracing::info!(proposal = %proposal.id, object = %proposal.object, action = %proposal.action, "proposal stored, pending approval");
            return Ok(proposal);
        }

        // execute_now: the ontology, not the caller, says whether a human must decide.
        let check = self.check(&proposal, signed, done_by).await?;
        if check.approval_required != Some(false) {
            tracing::warn!(principal = %caller.principal_id, object = %proposal.object, action = %proposal.action,
                "execute_now refused: the action needs approval");
            return Err(ApprovalError::ApprovalRequired {
                object: proposal.object,
                action: proposal.action,
            });
        }
        if let Some(effect) = &check.effect {
            set_effect_summary(&mut proposal, effect);
        }
        let refusal = refusal_of(&proposal, &check);
        let mut events = vec![submitted];
        if let Some((code, detail)) = refusal {
            proposal.state = ProposalState::PreconditionFailed as i32;
            proposal.refusal = code.clone();
            proposal.outcome_detail = detail.clone();
            proposal.finished_at_ms = Some(now);
            events.push(Event::new(
                "rechecked",
                "",
                format!("refused: {code}: {detail}"),
            ));
            self.inner.store.insert(&proposal, &events).await?;
            return Ok(proposal);
        }
        proposal.state = ProposalState::Approved as i32;
        proposal.decided_at_ms = Some(now);
        proposal.decided_by = caller.principal_id.clone();
        proposal.decision_reason =
            "no approval required; the server allows auto effects".to_owned();
        events.push(Event::new(
            "auto_approved",
            &caller.principal_id,
            "the action declares no approval for these arguments",
        ));
        events.push(Event::new(
            "rechecked",
            "",
            "precondition holds on live data",
        ));
        let hold = RunHold::new(&self.inner.runs, &proposal.id);
        self.inner.store.insert(&proposal, &events).await?;
        let id = proposal.id.clone();
        self.spawn_and_wait(proposal, check.effect, hold, done_by)
            .await?;
        self.get_stored(&id).await
    }

    /// Proposals, newest first (admin only), and whether the list ended early because
    /// more would have been over [`LIST_BYTES`].
    pub async fn list(
        &self,
        caller: &CallerContext,
        state: Option<ProposalState>,
        limit: u32,
    ) -> Result<(Vec<Proposal>, bool)> {
        require_admin_not_agent(caller)?;
        let limit = match limit {
            0 => DEFAULT_LIST_LIMIT,
            n => n.min(MAX_LIST_LIMIT),
        };
        let mut proposals = self.inner.store.list(state, limit).await?;
        let truncated = within_bytes(&mut proposals, LIST_BYTES);
        Ok((proposals, truncated))
    }

    /// One proposal with its audit events (admin only).
    pub async fn get(&self, caller: &CallerContext, id: &str) -> Result<Proposal> {
        require_admin_not_agent(caller)?;
        let mut proposal = self.get_stored(id).await?;
        proposal.events = self.inner.store.events(id).await?;
        Ok(proposal)
    }

    async fn get_stored(&self, id: &str) -> Result<Proposal> {
        self.inner
            .store
            .get(id)
            .await?
            .ok_or_else(|| ApprovalError::NotFound(id.to_owned()))
    }

    /// A human decision (admin only). Approving re-checks the action against
    /// live data with the approver's context, then runs the effect once, waiting
    /// for it within `allowed` (the call's gRPC deadline).
    pub async fn decide(
        &self,
        caller: &CallerContext,
        signed: &SignedCallerContext,
        id: &str,
        approve: bool,
        reason: &str,
        allowed: Duration,
    ) -> Result<Proposal> {
        let done_by = kg_common::grpc::work_deadline(allowed);
        require_person(caller)?;
        let reason = sanitize_text(reason, 1000);
        let proposal = self.get_stored(id).await?;
        let by = caller.principal_id.as_str();
        // Whatever state the snapshot shows: one read while another admin's approval is
        // in flight (claimed, then released when the re-check cannot run) would otherwise
        // skip the rule and claim the proposal once it is pending again.
        if approve
            && self.inner.config.four_eyes
            && let Some(proposer) = own_proposal(caller, &proposal)
        {
            // Refused before any claim: the proposal stays pending for another admin.
            let note = Event::new(
                "approval_refused",
                by,
                format!("four_eyes: `{by}` may not approve a proposal made by `{proposer}`"),
            );
            self.inner.store.record(id, &note).await?;
            tracing::warn!(proposal = id, by, "four-eyes rule: self-approval refused");
            return Err(ApprovalError::FourEyes {
                id: id.to_owned(),
                proposer,
            });
        }
        let (to, event) = if approve {
            (
                ProposalState::Approved,
                Event::new("approved", by, reason.clone()),
            )
        } else {
            (
                ProposalState::Rejected,
                Event::new("rejected", by, reason.clone()),
            )
        };
        if !self
            .inner
            .store
            .claim_decision(id, to, by, &reason, &event)
            .await?
        {
            let current = self.get_stored(id).await?;
            return Err(ApprovalError::AlreadyDecided {
                id: id.to_owned(),
                state: state_name(current.state()),
            });
        }
        tracing::info!(proposal = id, by, approve, "proposal decided");
        if !approve {
            return self.get_stored(id).await;
        }
        // Held from the claim on (the claim took the lease): the re-check below runs while the
        // proposal is approved. Only the decision that won holds it: a losing one in this
        // process must not release the winner's hold.
        let hold = RunHold::new(&self.inner.runs, id);
        // On its own task from here: a caller that goes away mid-check (its deadline, a closed
        // connection) must not leave the proposal approved with nothing running it.
        let this = self.clone();
        let signed = signed.clone();
        tokio::spawn(async move { this.run_approved(proposal, &signed, hold, done_by).await })
            .await
            .map_err(|join| ApprovalError::Internal(format!("approval task: {join}")))?
    }

    /// After an approval was claimed: the re-check against live data, then the effect run.
    async fn run_approved(
        &self,
        proposal: Proposal,
        signed: &SignedCallerContext,
        hold: RunHold,
        done_by: Instant,
    ) -> Result<Proposal> {
        let id = proposal.id.clone();
        let id = id.as_str();
        let check = match self.check(&proposal, signed, done_by).await {
            Ok(check) => check,
            // The compiled ontology no longer has this action, or no longer takes these
            // arguments: only a change of the project does that, and approving again can
            // never succeed. The proposal ends, as a changed policy ends it, rather than
            // returning to pending with an "approved" event in its trail.
            Err(ApprovalError::Ontology {
                code: code @ (ErrorCode::NotFound | ErrorCode::InvalidArgument),
                message,
            }) => {
                let detail = match code {
                    ErrorCode::NotFound => format!(
                        "the compiled ontology no longer has this action ({message}): propose it again if it comes back"
                    ),
                    _ => format!(
                        "the action no longer takes these arguments ({message}): propose it again"
                    ),
                };
                let outcome = Outcome {
                    state: ProposalState::PreconditionFailed,
                    refusal: "policy_changed",
                    detail: &detail,
                };
                let note = Event::new(
                    "rechecked",
                    "",
                    format!("refused: policy_changed: {detail}"),
                );
                self.inner.store.finish(id, &outcome, &note).await?;
                return self.get_stored(id).await;
            }
            Err(err) => {
                // Nothing was sent: hand the proposal back to the humans.
                let note = Event::new("recheck_unavailable", "", err.to_string());
                self.inner.store.release_claim(id, &note).await?;
                return Err(err);
            }
        };
        if let Some((code, detail)) = refusal_of(&proposal, &check) {
            let outcome = Outcome {
                state: ProposalState::PreconditionFailed,
                refusal: &code,
                detail: &detail,
            };
            self.inner
                .store
                .finish(
                    id,
                    &outcome,
                    &Event::new("rechecked", "", format!("refused: {code}: {detail}")),
                )
                .await?;
            return self.get_stored(id).await;
        }
        let (method, template, host) = check
            .effect
            .as_ref()
            .map(|e| {
                (
                    e.method.to_ascii_uppercase(),
                    e.url_template.as_str(),
                    e.host.as_str(),
                )
            })
            .unwrap_or_default();
        self.inner
            .store
            .record_recheck(
                id,
                &method,
                template,
                host,
                &Event::new("rechecked", "", "precondition holds on live data"),
            )
            .await?;
        self.spawn_and_wait(proposal, check.effect, hold, done_by)
            .await?;
        self.get_stored(id).await
    }

    /// Ontology.CheckAction with the forwarded caller context.
    async fn check(
        &self,
        proposal: &Proposal,
        signed: &SignedCallerContext,
        done_by: Instant,
    ) -> Result<CheckActionResponse> {
        let Some(client) = &self.inner.ontology else {
            return Err(ApprovalError::OntologyUnavailable);
        };
        let mut request = tonic::Request::new(CheckActionRequest {
            object: proposal.object.clone(),
            action: proposal.action.clone(),
            arguments_json: proposal.arguments_json.clone(),
            role: proposal.role.clone(),
        });
        attach_caller(&mut request, signed);
        // Within the caller's own deadline, so a slow check fails here, where nothing ran yet.
        let left = done_by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ApprovalError::OntologyUnavailable);
        }
        request.set_timeout(CHECK_TIMEOUT.min(left));
        match client.clone().check_action(request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => {
                let code = kg_common::error::code_of(&status);
                tracing::warn!(proposal = %proposal.id, grpc = ?status.code(), message = status.message(), "CheckAction failed");
                if matches!(
                    code,
                    ErrorCode::Unavailable | ErrorCode::Timeout | ErrorCode::Busy
                ) {
                    Err(ApprovalError::OntologyUnavailable)
                } else if code.is_server_fault() {
                    Err(ApprovalError::Internal("CheckAction failed".to_owned()))
                } else {
                    Err(ApprovalError::Ontology {
                        code,
                        message: status.message().to_owned(),
                    })
                }
            }
        }
    }

    /// Runs the effect on its own task, so a caller that goes away (gateway
    /// deadline, closed connection) cannot cut a run in half; waits a while.
    /// Runs the effect in its own task and waits for it up to `decide_wait`, and never past
    /// `done_by`, the caller's deadline less room to answer: a run still going then goes on,
    /// and the caller reads the proposal APPROVED (sent, no answer yet) instead of a timeout
    /// that would invite a second proposal for the same thing.
    async fn spawn_and_wait(
        &self,
        proposal: Proposal,
        effect: Option<WebhookEffect>,
        hold: RunHold,
        done_by: Instant,
    ) -> Result<()> {
        let inner = self.inner.clone();
        let wait = inner
            .config
            .decide_wait
            .min(done_by.saturating_duration_since(Instant::now()));
        let handle = tokio::spawn(async move {
            let id = proposal.id.clone();
            if let Err(err) = run_effect(&inner, &proposal, effect).await {
                tracing::error!(proposal = %id, error = %err, code = %err.code(), "effect run failed to record");
            }
            drop(hold);
        });
        match tokio::time::timeout(wait, handle).await {
            // Elapsed: the run goes on; the proposal reads APPROVED until it ends.
            Ok(Ok(())) | Err(_) => Ok(()),
            Ok(Err(join)) => Err(ApprovalError::Internal(format!("effect task: {join}"))),
        }
    }
}

/// The proposer's identity when `caller` is (or acts for) the person behind the
/// proposal: its user (`on_behalf_of`) or, for a proposal made directly, the principal.
fn own_proposal(caller: &CallerContext, proposal: &Proposal) -> Option<String> {
    let proposer = if proposal.on_behalf_of.is_empty() {
        &proposal.proposer
    } else {
        &proposal.on_behalf_of
    };
    let approver = [&caller.principal_id, &caller.on_behalf_of];
    let proposed_by = [&proposal.proposer, &proposal.on_behalf_of];
    approver
        .iter()
        .any(|a| !a.is_empty() && proposed_by.contains(a))
        .then(|| proposer.clone())
}

fn set_effect_summary(proposal: &mut Proposal, effect: &WebhookEffect) {
    proposal.effect_method = effect.method.to_ascii_uppercase();
    proposal.effect_url_template = effect.url_template.clone();
    proposal.effect_host = effect.host.clone();
}

/// A re-check refusal as (code, model-safe detail), or `None` when the action may run.
fn refusal_of(proposal: &Proposal, check: &CheckActionResponse) -> Option<(String, String)> {
    if !check.refusal.is_empty() {
        return Some((check.refusal.clone(), check.detail.clone()));
    }
    // Strict: a proposal submitted without a version (0, which no compiled action has) is
    // not let through as "unknown"; it must be proposed again through the ontology.
    if proposal.policy_version != check.policy_version {
        return Some((
            "policy_changed".to_owned(),
            format!(
                "this action's policy (precondition, parameters, roles, approval rule or effect) changed since the proposal (version {} -> {}): propose it again",
                proposal.policy_version, check.policy_version
            ),
        ));
    }
    None
}

/// The effect run: prepare, attempts with backoff, outcome. Every step is recorded.
async fn run_effect(
    inner: &Inner,
    proposal: &Proposal,
    effect: Option<WebhookEffect>,
) -> Result<()> {
    let id = proposal.id.as_str();
    let store = &inner.store;
    let prepared = match effect
        .as_ref()
        .ok_or_else(|| "the ontology rendered no effect for this action".to_owned())
        .and_then(|e| effect::prepare(e, &inner.config.secrets, &inner.config.protected_env))
    {
        Ok(prepared) => prepared,
        Err(detail) => {
            let outcome = Outcome {
                state: ProposalState::EffectMisconfigured,
                refusal: "",
                detail: &detail,
            };
            store
                .finish(
                    id,
                    &outcome,
                    &Event::new("outcome", "", format!("effect_misconfigured: {detail}")),
                )
                .await?;
            return Ok(());
        }
    };
    let mut maybe_sent = false;
    let mut number = 0u32;
    loop {
        number += 1;
        if !store.begin_attempt(id, number).await? {
            // Someone settled it (a restart's recovery): never send then.
            return Ok(());
        }
        let attempt = effect::send_once(
            &inner.http,
            &prepared,
            &inner.config.webhook_signing_secret,
            &proposal.idempotency_key,
            id,
        )
        .await;
        if matches!(attempt, Attempt::NoResponse { .. }) {
            maybe_sent = true;
        }
        let step = effect::next_step(&attempt, number, prepared.max_attempts, maybe_sent);
        let mut event = Event::new("effect_attempt", "", attempt.describe(&prepared.host));
        event.attempt = number;
        if let Attempt::Status(status) = attempt {
            event.http_status = status;
        }
        store.record(id, &event).await?;
        match step {
            Step::Retry => {
                tokio::time::sleep(effect::backoff(inner.config.backoff_base, number)).await;
            }
            Step::Stop(result) => {
                let last = attempt.describe(&prepared.host);
                let (state, detail) = match result {
                    Final::Executed => (ProposalState::Executed, format!("executed: {last}")),
                    Final::Unknown => (
                        ProposalState::Unknown,
                        format!(
                            "unknown: a request was sent and no response came back ({last}); it may or may not have been applied: do not retry"
                        ),
                    ),
                    Final::EffectFailed => {
                        let why = match attempt {
                            Attempt::Status(s) if (300..400).contains(&s) => {
                                format!("{last}; redirects are not followed")
                            }
                            _ => last,
                        };
                        (
                            ProposalState::EffectFailed,
                            format!(
                                "effect_failed after {number} attempt(s): {why}; nothing was applied"
                            ),
                        )
                    }
                };
                let outcome = Outcome {
                    state,
                    refusal: "",
                    detail: &detail,
                };
                store
                    .finish(id, &outcome, &Event::new("outcome", "", detail.clone()))
                    .await?;
                tracing::info!(
                    proposal = id,
                    outcome = state_name(state),
                    attempts = number,
                    "effect finished"
                );
                return Ok(());
            }
        }
    }
}

/// Keeps the leading proposals whose encoded sizes add up to at most `budget` bytes (the
/// first always); true when some were dropped.
fn within_bytes(proposals: &mut Vec<Proposal>, budget: usize) -> bool {
    let mut used = 0usize;
    let keep = proposals
        .iter()
        .position(|p| {
            used += prost::Message::encoded_len(p);
            used > budget
        })
        .map_or(proposals.len(), |over| over.max(1));
    let truncated = keep < proposals.len();
    proposals.truncate(keep);
    truncated
}

/// The admin flag, held by no agent: auth never gives an agent the flag, and a context that
/// says otherwise (minted before that rule, or forged) is still not an admin's.
fn require_admin_not_agent(caller: &CallerContext) -> Result<()> {
    require_admin(caller)?;
    if caller.principal_kind() == PrincipalKind::Agent || !caller.on_behalf_of.is_empty() {
        return Err(ApprovalError::NotAPerson(format!(
            "the agent `{}`",
            caller.principal_id
        )));
    }
    Ok(())
}

/// A decision is a person's: an admin user, for no one else, through the admin API itself
/// (not the CLI's `admin:<operation>` contexts, and not a context minted for MCP and
/// relayed here, which is refused first, as what it is).
fn require_person(caller: &CallerContext) -> Result<()> {
    if caller.tool != kg_common::caller::ADMIN_API_TOOL {
        return Err(ApprovalError::NotAPerson(format!(
            "a context minted for `{}`",
            caller.tool
        )));
    }
    require_admin_not_agent(caller)?;
    if caller.principal_kind() != PrincipalKind::User {
        return Err(ApprovalError::NotAPerson(format!(
            "the {} principal `{}`",
            kind_name(caller.principal_kind()),
            caller.principal_id
        )));
    }
    Ok(())
}

/// How the proposer held its role, as approvers read it.
fn role_source(asserted: bool) -> &'static str {
    if asserted {
        "asserted by a stdio launcher"
    } else {
        "granted"
    }
}

fn kind_name(kind: PrincipalKind) -> &'static str {
    match kind {
        PrincipalKind::User => "user",
        PrincipalKind::Agent => "agent",
        PrincipalKind::Service => "service",
        PrincipalKind::Unspecified => "unspecified",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_list_stops_before_its_byte_budget_and_says_so() {
        let proposal = |n: usize| Proposal {
            id: format!("prp_{n}"),
            arguments_json: "x".repeat(1000),
            ..Default::default()
        };
        let size = prost::Message::encoded_len(&proposal(0));
        let mut all: Vec<Proposal> = (0..10).map(proposal).collect();
        assert!(within_bytes(&mut all, size * 3 + size / 2));
        assert_eq!(
            all.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
            ["prp_0", "prp_1", "prp_2"],
            "the newest that fit, in order"
        );
        let mut all: Vec<Proposal> = (0..10).map(proposal).collect();
        assert!(!within_bytes(&mut all, size * 10), "all fit exactly");
        assert_eq!(all.len(), 10);
        let mut one = vec![proposal(0), proposal(1)];
        assert!(within_bytes(&mut one, 10));
        assert_eq!(one.len(), 1, "the first always, however large");
    }
}
