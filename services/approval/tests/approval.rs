//! The approval service end to end over real gRPC, on real SQLite and real
//! PostgreSQL, against a real local webhook receiver (axum) and a raw TCP
//! peer that drops connections after reading the request.
//!
//! CheckAction is answered by `TestOntology`: a tonic server implementing the
//! real `kg.v1.Ontology` contract from a small table, behind the real
//! caller-context layer. It stands in for the ontology service (built
//! separately); the mesh end-to-end tests run the real one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use kg_approval::{ApprovalConfig, ApprovalService, SecretSource};
use kg_common::caller::{
    CONTEXT_TTL_MS, CallerContextLayer, ContextSigner, ContextVerifier, attach_caller, now_ms,
    require_caller,
};
use kg_common::{ErrorCode, error::code_of};
use kg_proto::v1::approval_client::ApprovalClient;
use kg_proto::v1::{
    CallerContext, CheckActionRequest, CheckActionResponse, DecideRequest, GetProposalRequest,
    ListProposalsRequest, PrincipalKind, Proposal, ProposalState, SubmitProposalRequest,
    WebhookEffect,
};
use kg_stores::sql::SqlStore;
use serde_json::json;
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::codegen::{BoxFuture, Context, Poll, Service, http};
use tonic::transport::Channel;

const SIGNING_SECRET: &[u8] = b"whsec_test_0123456789abcdef";
const SECRET_NAME: &str = "SHOP_WEBHOOK_TOKEN";
const SECRET_VALUE: &str = "Bearer tok_SUPERSECRET_42";

// ---------------------------------------------------------------- receiver

#[derive(Clone, Debug)]
struct Hit {
    kind: String,
    tag: String,
    headers: HashMap<String, String>,
    body: String,
}

#[derive(Clone, Default)]
struct Receiver {
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Receiver {
    fn hits(&self, tag: &str) -> Vec<Hit> {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.tag == tag)
            .cloned()
            .collect()
    }
    fn total(&self) -> usize {
        self.hits.lock().unwrap().len()
    }
}

async fn webhook(
    State(receiver): State<Receiver>,
    Path((kind, tag)): Path<(String, String)>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let headers = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let seen = {
        let mut hits = receiver.hits.lock().unwrap();
        hits.push(Hit {
            kind: kind.clone(),
            tag: tag.clone(),
            headers,
            body,
        });
        hits.iter().filter(|h| h.tag == tag).count()
    };
    match kind.as_str() {
        "ok" => StatusCode::OK.into_response(),
        "reject" => StatusCode::UNPROCESSABLE_ENTITY.into_response(),
        "flaky" if seen <= 2 => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        "flaky" => StatusCode::CREATED.into_response(),
        "down" => StatusCode::BAD_GATEWAY.into_response(),
        "redirect" => (
            StatusCode::FOUND,
            [("location", format!("/ok/{tag}-redirected"))],
        )
            .into_response(),
        "hang" => {
            tokio::time::sleep(Duration::from_secs(120)).await;
            StatusCode::OK.into_response()
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn start_receiver() -> (Receiver, String) {
    let receiver = Receiver::default();
    let app = axum::Router::new()
        .route("/{kind}/{tag}", axum::routing::any(webhook))
        .with_state(receiver.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (receiver, addr.to_string())
}

/// A peer that reads the request and closes the connection without answering.
async fn start_dropper() -> (Arc<Mutex<usize>>, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(Mutex::new(0usize));
    let seen = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            if socket.read(&mut buf).await.unwrap_or(0) > 0 {
                *seen.lock().unwrap() += 1;
            }
            drop(socket);
        }
    });
    (count, addr.to_string())
}

// ---------------------------------------------------------------- ontology

/// How the test ontology answers CheckAction for one (object, action).
#[derive(Clone, Debug)]
struct Rule {
    refusal: String,
    detail: String,
    /// `<scheme>://<host>` the effect points at.
    base: String,
    host: String,
    /// First path segment at the receiver (ok, reject, flaky, ...).
    kind: String,
    approval_required: Option<bool>,
    policy_version: i64,
    max_attempts: u32,
    timeout_ms: u32,
    secret: Option<&'static str>,
    unavailable: bool,
}

#[derive(Clone, Default)]
struct TestOntology {
    rules: Arc<Mutex<HashMap<(String, String), Rule>>>,
    /// (object, action, principal of the forwarded context)
    calls: Arc<Mutex<Vec<(String, String, String)>>>,
}

impl TestOntology {
    fn set(&self, object: &str, action: &str, rule: Rule) {
        self.rules
            .lock()
            .unwrap()
            .insert((object.to_owned(), action.to_owned()), rule);
    }
    fn update(&self, object: &str, action: &str, f: impl FnOnce(&mut Rule)) {
        let mut rules = self.rules.lock().unwrap();
        f(rules
            .get_mut(&(object.to_owned(), action.to_owned()))
            .unwrap());
    }
    fn calls(&self, object: &str) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.0 == object)
            .map(|c| c.2.clone())
            .collect()
    }
}

impl TestOntology {
    async fn check_action(
        &self,
        request: tonic::Request<CheckActionRequest>,
    ) -> Result<tonic::Response<CheckActionResponse>, tonic::Status> {
        let caller = require_caller(&request)?;
        let req = request.into_inner();
        self.calls.lock().unwrap().push((
            req.object.clone(),
            req.action.clone(),
            caller.principal_id.clone(),
        ));
        let rule = self
            .rules
            .lock()
            .unwrap()
            .get(&(req.object.clone(), req.action.clone()))
            .cloned()
            .ok_or_else(|| tonic::Status::not_found("unknown action"))?;
        if rule.unavailable {
            return Err(tonic::Status::unavailable("warehouse down"));
        }
        let args: serde_json::Value = serde_json::from_str(&req.arguments_json).unwrap();
        let tag = args["tag"].as_str().unwrap().to_owned();
        let body = json!({"order_id": args["order_id"], "reason": args["reason"]}).to_string();
        let effect = WebhookEffect {
            method: "POST".into(),
            // The token in the query is the secret part of the URL.
            url: format!("{}/{}/{tag}?token=PATHSECRET", rule.base, rule.kind),
            url_template: format!("{}/{}/{{tag}}?token=...", rule.base, rule.kind),
            host: rule.host.clone(),
            body,
            headers: HashMap::from([("X-Shop".to_owned(), "orders".to_owned())]),
            secret_headers: rule
                .secret
                .map(|s| HashMap::from([("Authorization".to_owned(), s.to_owned())]))
                .unwrap_or_default(),
            timeout_ms: rule.timeout_ms,
            max_attempts: rule.max_attempts,
        };
        Ok(tonic::Response::new(CheckActionResponse {
            refusal: rule.refusal.clone(),
            detail: rule.detail.clone(),
            effect: Some(effect),
            policy_version: rule.policy_version,
            approval_required: rule.approval_required,
        }))
    }
}

/// `kg.v1.Ontology` serving CheckAction only (the other RPCs answer
/// UNIMPLEMENTED), routed and decoded the way tonic's generated server does,
/// so this test does not depend on the rest of the ontology contract.
#[derive(Clone)]
struct CheckActionServer(TestOntology);

impl tonic::server::NamedService for CheckActionServer {
    const NAME: &'static str = "kg.v1.Ontology";
}

struct CheckActionUnary(TestOntology);

impl tonic::server::UnaryService<CheckActionRequest> for CheckActionUnary {
    type Response = CheckActionResponse;
    type Future = BoxFuture<tonic::Response<CheckActionResponse>, tonic::Status>;
    fn call(&mut self, request: tonic::Request<CheckActionRequest>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.check_action(request).await })
    }
}

impl Service<http::Request<tonic::body::Body>> for CheckActionServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move {
            if request.uri().path() != "/kg.v1.Ontology/CheckAction" {
                return Ok(tonic::Status::unimplemented(
                    "the test ontology answers CheckAction only",
                )
                .into_http());
            }
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(CheckActionUnary(inner), request).await)
        })
    }
}

// ---------------------------------------------------------------- harness

struct Harness {
    signer: Arc<ContextSigner>,
    client: ApprovalClient<Channel>,
    ontology: TestOntology,
    receiver: Receiver,
    receiver_addr: String,
    dropper: (Arc<Mutex<usize>>, String),
    _shutdown: tokio_util::sync::DropGuard,
}

fn context(principal: &str, admin: bool) -> CallerContext {
    let now = now_ms();
    CallerContext {
        principal_id: principal.to_owned(),
        on_behalf_of: if admin {
            String::new()
        } else {
            "user-ada".to_owned()
        },
        is_admin: admin,
        // An admin decides as a person through the admin API; the proposer is an agent.
        principal_kind: if admin {
            PrincipalKind::User as i32
        } else {
            PrincipalKind::Agent as i32
        },
        tool: if admin { "admin" } else { "mcp" }.to_owned(),
        // As auth signs them: the agent was granted `support`; admins hold `admin`.
        roles: vec![if admin { "admin" } else { "support" }.to_owned()],
        issued_at_ms: now,
        expires_at_ms: now + CONTEXT_TTL_MS,
        ..Default::default()
    }
}

impl Harness {
    async fn start(sql: SqlStore) -> Harness {
        Self::start_with(sql, |_| {}).await
    }

    async fn start_with(sql: SqlStore, configure: impl FnOnce(&mut ApprovalConfig)) -> Harness {
        let signer = Arc::new(ContextSigner::generate());
        let verifier = ContextVerifier::new(vec![signer.public_key()]);
        let shutdown = CancellationToken::new();
        let (receiver, receiver_addr) = start_receiver().await;
        let dropper = start_dropper().await;

        let ontology = TestOntology::default();
        let onto_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let onto_addr = format!("http://{}", onto_listener.local_addr().unwrap());
        {
            let routes = tonic::service::Routes::new(CheckActionServer(ontology.clone()));
            let layer = CallerContextLayer::new(verifier.clone(), &[]);
            let token = shutdown.clone();
            tokio::spawn(async move {
                kg_common::grpc::serve(onto_listener, layer, routes, &["kg.v1.Ontology"], token)
                    .await
                    .unwrap();
            });
        }

        let mut config = ApprovalConfig::new(SIGNING_SECRET.to_vec(), Some(onto_addr));
        config.secrets = SecretSource::Fixed(Arc::new(HashMap::from([(
            SECRET_NAME.to_owned(),
            SECRET_VALUE.to_owned(),
        )])));
        config.decide_wait = Duration::from_secs(30);
        config.backoff_base = Duration::from_millis(20);
        configure(&mut config);
        let service = ApprovalService::new(sql, config).await.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        {
            let token = shutdown.clone();
            tokio::spawn(async move {
                kg_approval::serve(service, verifier, listener, token)
                    .await
                    .unwrap();
            });
        }
        let client = ApprovalClient::new(kg_common::grpc::channel(&addr).unwrap());
        Harness {
            signer,
            client,
            ontology,
            receiver,
            receiver_addr,
            dropper,
            _shutdown: shutdown.drop_guard(),
        }
    }

    fn request<T>(&self, message: T, principal: &str, admin: bool) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        attach_caller(&mut request, &self.signer.sign(&context(principal, admin)));
        request
    }

    /// Submits `request` as the agent, as written (what a caller that goes round the
    /// generated tool can send).
    async fn submit_as_agent(&self, request: SubmitProposalRequest) -> Proposal {
        self.client
            .clone()
            .submit(self.request(request, "agent-1", false))
            .await
            .unwrap()
            .into_inner()
    }

    /// Decide as an arbitrary (signed) admin context.
    async fn decide_as(
        &self,
        id: &str,
        approve: bool,
        ctx: CallerContext,
    ) -> Result<Proposal, tonic::Status> {
        let mut request = tonic::Request::new(DecideRequest {
            id: id.to_owned(),
            approve,
            reason: String::new(),
        });
        attach_caller(&mut request, &self.signer.sign(&ctx));
        self.client
            .clone()
            .decide(request)
            .await
            .map(|r| r.into_inner())
    }

    fn rule(&self, kind: &str) -> Rule {
        Rule {
            refusal: String::new(),
            detail: String::new(),
            base: format!("http://{}", self.receiver_addr),
            host: self.receiver_addr.clone(),
            kind: kind.to_owned(),
            approval_required: Some(true),
            policy_version: 7,
            max_attempts: 3,
            timeout_ms: 2_000,
            secret: Some(SECRET_NAME),
            unavailable: false,
        }
    }

    async fn submit(
        &self,
        object: &str,
        tag: &str,
        execute_now: bool,
    ) -> Result<Proposal, tonic::Status> {
        let arguments = json!({"tag": tag, "order_id": 42, "reason": "customer asked"});
        self.client
            .clone()
            .submit(self.request(
                SubmitProposalRequest {
                    object: object.to_owned(),
                    action: "cancel".to_owned(),
                    arguments_json: arguments.to_string(),
                    role: "support".to_owned(),
                    policy_version: 7,
                    agent: "claude-desktop\u{1b}[31m".to_owned(),
                    execute_now,
                    effect: Some(WebhookEffect {
                        method: "POST".into(),
                        url: format!("http://{}/ok/{tag}?token=PATHSECRET", self.receiver_addr),
                        url_template: format!("http://{}/ok/{{tag}}?token=...", self.receiver_addr),
                        host: self.receiver_addr.clone(),
                        ..Default::default()
                    }),
                },
                "agent-1",
                false,
            ))
            .await
            .map(|r| r.into_inner())
    }

    async fn decide(&self, id: &str, approve: bool) -> Result<Proposal, tonic::Status> {
        self.client
            .clone()
            .decide(self.request(
                DecideRequest {
                    id: id.to_owned(),
                    approve,
                    reason: "checked with the customer".to_owned(),
                },
                "admin-1",
                true,
            ))
            .await
            .map(|r| r.into_inner())
    }

    async fn get(&self, id: &str) -> Proposal {
        self.client
            .clone()
            .get_proposal(self.request(GetProposalRequest { id: id.to_owned() }, "admin-1", true))
            .await
            .unwrap()
            .into_inner()
    }

    /// `object`'s cancel sends one request to a receiver that never answers (within a minute):
    /// an effect still running for as long as a test needs.
    fn never_answered(&self, object: &str) {
        let mut hang = self.rule("hang");
        hang.timeout_ms = 60_000;
        hang.max_attempts = 1;
        self.ontology.set(object, "cancel", hang);
    }

    /// Submits a pending proposal for `object` and approves it.
    async fn propose_and_approve(&self, object: &str, tag: &str) -> Proposal {
        let p = self.submit(object, tag, false).await.unwrap();
        assert_eq!(p.state(), ProposalState::Pending);
        self.decide(&p.id, true).await.unwrap()
    }
}

fn kinds(p: &Proposal) -> Vec<&str> {
    p.events.iter().map(|e| e.kind.as_str()).collect()
}

/// Nothing returned to a caller carries the resolved URL's secret or a secret header value.
fn assert_no_secrets(p: &Proposal) {
    let text = format!("{p:?}");
    assert!(!text.contains("PATHSECRET"), "{text}");
    assert!(!text.contains("SUPERSECRET"), "{text}");
}

// ---------------------------------------------------------------- scenarios

async fn suite(sql: SqlStore) {
    let h = Harness::start(sql).await;

    // Pending proposal: proposer from the context, hash of the canonical args,
    // template and host only (rendered by the ontology, asked once as the proposer),
    // nothing sent.
    h.ontology.set("order", "cancel", h.rule("ok"));
    let p = h.submit("order", "pending1", false).await.unwrap();
    assert_eq!(p.state(), ProposalState::Pending);
    assert_eq!(p.proposer, "agent-1");
    assert_eq!(p.on_behalf_of, "user-ada");
    assert_eq!(p.agent, "claude-desktop", "control sequences are stripped");
    assert_eq!(p.role, "support");
    assert_eq!(p.policy_version, 7);
    let canonical = kg_approval::canonical_json(&serde_json::from_str(&p.arguments_json).unwrap());
    assert_eq!(
        p.arguments_sha256,
        kg_approval::sha256_hex(canonical.as_bytes())
    );
    assert_eq!(p.effect_host, h.receiver_addr);
    assert!(p.effect_url_template.contains("{tag}"));
    assert_eq!(
        p.idempotency_key,
        kg_approval::idempotency_key(&p.id, &p.arguments_sha256)
    );
    assert_no_secrets(&p);
    assert_eq!(h.receiver.total(), 0);
    assert_eq!(h.ontology.calls("order"), ["agent-1"]);
    let stored = h.get(&p.id).await;
    assert_eq!(kinds(&stored), ["submitted"]);
    assert_no_secrets(&stored);
    assert!(!stored.role_asserted);
    assert!(
        stored.events[0].detail.contains("role `support`, granted"),
        "{stored:?}"
    );

    // A role a stdio launcher asserted is stored as such, so the approver can weigh it.
    h.ontology.set("oasserted", "cancel", h.rule("ok"));
    let mut launcher = context("agent-1", false);
    launcher.roles_asserted = true;
    let mut request = tonic::Request::new(SubmitProposalRequest {
        object: "oasserted".into(),
        action: "cancel".into(),
        arguments_json: json!({"tag": "asserted1", "order_id": 42}).to_string(),
        role: "support".into(),
        ..Default::default()
    });
    attach_caller(&mut request, &h.signer.sign(&launcher));
    let asserted = h.client.clone().submit(request).await.unwrap().into_inner();
    let asserted = h.get(&asserted.id).await;
    assert!(asserted.role_asserted, "{asserted:?}");
    assert!(
        asserted.events[0]
            .detail
            .contains("role `support`, asserted by a stdio launcher"),
        "{asserted:?}"
    );

    // The agent (no admin) can neither decide nor read proposals.
    for status in [
        h.client
            .clone()
            .decide(h.request(
                DecideRequest {
                    id: p.id.clone(),
                    approve: true,
                    reason: String::new(),
                },
                "agent-1",
                false,
            ))
            .await
            .unwrap_err(),
        h.client
            .clone()
            .list_proposals(h.request(ListProposalsRequest::default(), "agent-1", false))
            .await
            .unwrap_err(),
        h.client
            .clone()
            .get_proposal(h.request(GetProposalRequest { id: p.id.clone() }, "agent-1", false))
            .await
            .unwrap_err(),
    ] {
        assert_eq!(code_of(&status), ErrorCode::PermissionDenied, "{status:?}");
    }
    // And without a context nothing answers at all.
    let status = h
        .client
        .clone()
        .submit(SubmitProposalRequest::default())
        .await
        .unwrap_err();
    assert_eq!(code_of(&status), ErrorCode::Unauthenticated);

    // Approve -> 2xx: executed once, key, signature, secret header.
    let done = h.decide(&p.id, true).await.unwrap();
    assert_eq!(done.state(), ProposalState::Executed, "{done:?}");
    assert_eq!(done.attempts, 1);
    assert_eq!(done.decided_by, "admin-1");
    assert_eq!(done.decision_reason, "checked with the customer");
    assert_no_secrets(&done);
    let hits = h.receiver.hits("pending1");
    assert_eq!(hits.len(), 1);
    let hit = &hits[0];
    assert_eq!(hit.kind, "ok");
    assert_eq!(hit.headers["idempotency-key"], p.idempotency_key);
    assert_eq!(hit.headers["authorization"], SECRET_VALUE);
    assert_eq!(hit.headers["x-shop"], "orders");
    assert_eq!(hit.headers["x-kgmesh-proposal"], p.id);
    kg_approval::verify(
        SIGNING_SECRET,
        &hit.headers["x-kgmesh-signature"],
        hit.body.as_bytes(),
        now_ms() / 1000,
        300,
    )
    .unwrap();
    assert!(
        kg_approval::verify(
            b"wrong-secret-000000",
            &hit.headers["x-kgmesh-signature"],
            hit.body.as_bytes(),
            now_ms() / 1000,
            300
        )
        .is_err()
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&hit.body).unwrap()["order_id"],
        42
    );
    // The re-check ran with the approver's forwarded context (after the proposer's
    // summary check at submit).
    assert_eq!(h.ontology.calls("order"), ["agent-1", "admin-1"]);
    let full = h.get(&p.id).await;
    assert_eq!(
        kinds(&full),
        [
            "submitted",
            "approved",
            "rechecked",
            "effect_attempt",
            "outcome"
        ]
    );
    assert_eq!(full.events[3].http_status, 200);
    assert_eq!(full.events[1].actor, "admin-1");
    assert_no_secrets(&full);
    // A second decision is refused and sends nothing.
    let again = h.decide(&p.id, true).await.unwrap_err();
    assert_eq!(code_of(&again), ErrorCode::FailedPrecondition);
    assert!(h.decide(&p.id, false).await.is_err());
    assert_eq!(h.receiver.hits("pending1").len(), 1);

    // 4xx: effect_failed, no retry.
    h.ontology.set("o4xx", "cancel", h.rule("reject"));
    let r = h.propose_and_approve("o4xx", "t4xx").await;
    assert_eq!(r.state(), ProposalState::EffectFailed, "{r:?}");
    assert_eq!(r.attempts, 1);
    assert!(
        r.outcome_detail.contains("422") && r.outcome_detail.contains("nothing was applied"),
        "{}",
        r.outcome_detail
    );
    assert_eq!(h.receiver.hits("t4xx").len(), 1);

    // The summary an approver reads is the ontology's, whatever the submitter sends (a
    // caller that went round the generated tool could send any method and host).
    h.ontology.set("onoeffect", "cancel", h.rule("ok"));
    let claimed = h
        .submit_as_agent(SubmitProposalRequest {
            object: "onoeffect".into(),
            action: "cancel".into(),
            arguments_json: json!({"tag": "tnoeffect", "order_id": 7}).to_string(),
            role: "support".into(),
            policy_version: 7,
            effect: Some(WebhookEffect {
                method: "GET".into(),
                url: "https://harmless.example/ping".into(),
                url_template: "https://harmless.example/ping".into(),
                host: "harmless.example".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await;
    assert_eq!(claimed.effect_host, h.receiver_addr);
    assert_eq!(claimed.effect_method, "POST");
    assert!(claimed.effect_url_template.contains("{tag}"));
    let r = h.decide(&claimed.id, true).await.unwrap();
    assert_eq!(r.state(), ProposalState::Executed, "{r:?}");
    assert_eq!(r.effect_host, h.receiver_addr);
    assert_no_secrets(&r);

    // With the ontology down at submit, the proposal is stored without a summary and the
    // re-check at decision time fills in method, template and host, never the URL.
    let mut down_then_up = h.rule("ok");
    down_then_up.unavailable = true;
    h.ontology.set("obare", "cancel", down_then_up);
    let bare = h.submit("obare", "tbare", false).await.unwrap();
    assert!(bare.effect_host.is_empty(), "{bare:?}");
    h.ontology
        .update("obare", "cancel", |rule| rule.unavailable = false);
    let r = h.decide(&bare.id, true).await.unwrap();
    assert_eq!(r.state(), ProposalState::Executed, "{r:?}");
    assert_eq!(r.effect_host, h.receiver_addr);
    assert_eq!(r.effect_method, "POST");
    assert!(r.effect_url_template.contains("{tag}"));
    assert_no_secrets(&r);

    // 5xx twice then 2xx: executed on attempt 3, same key every time, each signed.
    h.ontology.set("oflaky", "cancel", h.rule("flaky"));
    let r = h.propose_and_approve("oflaky", "tflaky").await;
    assert_eq!(r.state(), ProposalState::Executed, "{r:?}");
    assert_eq!(r.attempts, 3);
    let hits = h.receiver.hits("tflaky");
    assert_eq!(hits.len(), 3);
    for hit in &hits {
        assert_eq!(hit.headers["idempotency-key"], r.idempotency_key);
        kg_approval::verify(
            SIGNING_SECRET,
            &hit.headers["x-kgmesh-signature"],
            hit.body.as_bytes(),
            now_ms() / 1000,
            300,
        )
        .unwrap();
    }
    let full = h.get(&r.id).await;
    let statuses: Vec<u32> = full
        .events
        .iter()
        .filter(|e| e.kind == "effect_attempt")
        .map(|e| e.http_status)
        .collect();
    assert_eq!(statuses, [503, 503, 201]);

    // Always 5xx: effect_failed after max_attempts.
    h.ontology.set("odown", "cancel", h.rule("down"));
    let r = h.propose_and_approve("odown", "tdown").await;
    assert_eq!(r.state(), ProposalState::EffectFailed, "{r:?}");
    assert_eq!(r.attempts, 3);
    assert_eq!(h.receiver.hits("tdown").len(), 3);

    // A redirect is not followed.
    h.ontology.set("oredir", "cancel", h.rule("redirect"));
    let r = h.propose_and_approve("oredir", "tredir").await;
    assert_eq!(r.state(), ProposalState::EffectFailed, "{r:?}");
    assert_eq!(r.attempts, 1);
    assert!(
        r.outcome_detail.contains("redirects are not followed"),
        "{}",
        r.outcome_detail
    );
    assert!(h.receiver.hits("tredir-redirected").is_empty());

    // Never answers: unknown after the last timeout, "do not retry".
    let mut hang = h.rule("hang");
    hang.timeout_ms = 300;
    hang.max_attempts = 2;
    h.ontology.set("ohang", "cancel", hang);
    let r = h.propose_and_approve("ohang", "thang").await;
    assert_eq!(r.state(), ProposalState::Unknown, "{r:?}");
    assert_eq!(r.attempts, 2);
    assert!(
        r.outcome_detail.contains("do not retry"),
        "{}",
        r.outcome_detail
    );
    let hits = h.receiver.hits("thang");
    assert_eq!(hits.len(), 2);
    assert_eq!(
        hits[0].headers["idempotency-key"],
        hits[1].headers["idempotency-key"]
    );

    // Connection closed after the request was sent: unknown.
    let mut dropped = h.rule("x");
    dropped.base = format!("http://{}", h.dropper.1);
    dropped.host = h.dropper.1.clone();
    dropped.max_attempts = 2;
    h.ontology.set("odrop", "cancel", dropped);
    let r = h.propose_and_approve("odrop", "tdrop").await;
    assert_eq!(r.state(), ProposalState::Unknown, "{r:?}");
    assert_eq!(r.attempts, 2);
    assert_eq!(*h.dropper.0.lock().unwrap(), 2);

    // Nothing listening: nothing was sent, so effect_failed (not unknown).
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let mut refused = h.rule("ok");
    refused.base = format!("http://{closed_addr}");
    refused.host = closed_addr;
    refused.max_attempts = 2;
    h.ontology.set("orefused", "cancel", refused);
    let r = h.propose_and_approve("orefused", "trefused").await;
    assert_eq!(r.state(), ProposalState::EffectFailed, "{r:?}");
    assert!(
        r.outcome_detail.contains("nothing was sent"),
        "{}",
        r.outcome_detail
    );

    // A missing secret: effect_misconfigured, nothing sent.
    let mut missing = h.rule("ok");
    missing.secret = Some("NOT_CONFIGURED_SECRET");
    h.ontology.set("osecret", "cancel", missing);
    let r = h.propose_and_approve("osecret", "tsecret").await;
    assert_eq!(r.state(), ProposalState::EffectMisconfigured, "{r:?}");
    assert_eq!(r.attempts, 0);
    assert!(r.outcome_detail.contains("NOT_CONFIGURED_SECRET"));
    assert!(h.receiver.hits("tsecret").is_empty());

    // A rendered URL pointing at another host than the declared one: misconfigured.
    let mut other_host = h.rule("ok");
    other_host.host = "hooks.example.com".into();
    h.ontology.set("ohost", "cancel", other_host);
    let r = h.propose_and_approve("ohost", "thost").await;
    assert_eq!(r.state(), ProposalState::EffectMisconfigured, "{r:?}");
    assert!(h.receiver.hits("thost").is_empty());
    assert_no_secrets(&r);

    // Reject: nothing runs, and it cannot be approved afterwards.
    h.ontology.set("oreject", "cancel", h.rule("ok"));
    let p = h.submit("oreject", "treject", false).await.unwrap();
    let r = h.decide(&p.id, false).await.unwrap();
    assert_eq!(r.state(), ProposalState::Rejected);
    assert!(r.finished_at_ms.is_some());
    let err = h.decide(&p.id, true).await.unwrap_err();
    assert_eq!(code_of(&err), ErrorCode::FailedPrecondition);
    assert!(h.receiver.hits("treject").is_empty());
    assert_eq!(h.ontology.calls("oreject"), ["agent-1"], "no re-check");
    assert_eq!(kinds(&h.get(&p.id).await), ["submitted", "rejected"]);

    // The precondition held at proposal time and fails at approval time.
    h.ontology.set("oship", "cancel", h.rule("ok"));
    let p = h.submit("oship", "tship", false).await.unwrap();
    h.ontology.update("oship", "cancel", |rule| {
        rule.refusal = "precondition_failed".into();
        rule.detail = "order 42 is `shipped`; cancel requires state `open`".into();
    });
    let r = h.decide(&p.id, true).await.unwrap();
    assert_eq!(r.state(), ProposalState::PreconditionFailed, "{r:?}");
    assert_eq!(r.refusal, "precondition_failed");
    assert!(r.outcome_detail.contains("shipped"));
    assert!(h.receiver.hits("tship").is_empty());
    assert_eq!(
        kinds(&h.get(&p.id).await),
        ["submitted", "approved", "rechecked"]
    );

    // The policy changed between proposal and approval.
    let mut changed = h.rule("ok");
    changed.policy_version = 8;
    h.ontology.set("opolicy", "cancel", changed);
    let r = h.propose_and_approve("opolicy", "tpolicy").await;
    assert_eq!(r.state(), ProposalState::PreconditionFailed);
    assert_eq!(r.refusal, "policy_changed");
    assert!(h.receiver.hits("tpolicy").is_empty());

    // A proposal without a policy version (0: sent round the ontology) is never taken for
    // the current policy.
    h.ontology.set("ounversioned", "cancel", h.rule("ok"));
    let unversioned = h
        .submit_as_agent(SubmitProposalRequest {
            object: "ounversioned".into(),
            action: "cancel".into(),
            arguments_json: json!({"tag": "tunversioned", "order_id": 7}).to_string(),
            role: "support".into(),
            ..Default::default()
        })
        .await;
    let r = h.decide(&unversioned.id, true).await.unwrap();
    assert_eq!(r.refusal, "policy_changed", "{r:?}");
    assert!(h.receiver.hits("tunversioned").is_empty());

    // The action left the project after the proposal: approving can never succeed, so the
    // proposal ends (it went back to pending, its trail saying "approved", for good).
    h.ontology.set("oremoved", "cancel", h.rule("ok"));
    let p = h.submit("oremoved", "tremoved", false).await.unwrap();
    h.ontology
        .rules
        .lock()
        .unwrap()
        .remove(&("oremoved".to_owned(), "cancel".to_owned()));
    let r = h.decide(&p.id, true).await.unwrap();
    assert_eq!(r.state(), ProposalState::PreconditionFailed, "{r:?}");
    assert_eq!(r.refusal, "policy_changed");
    assert!(
        r.outcome_detail.contains("no longer has this action"),
        "{r:?}"
    );
    assert!(h.receiver.hits("tremoved").is_empty());
    assert_eq!(
        kinds(&h.get(&p.id).await),
        ["submitted", "approved", "rechecked"]
    );
    assert!(h.decide(&p.id, true).await.is_err(), "decided once");

    // The ontology is down: nothing runs and the proposal goes back to pending.
    let mut down = h.rule("ok");
    down.unavailable = true;
    h.ontology.set("oonto", "cancel", down);
    let p = h.submit("oonto", "tonto", false).await.unwrap();
    let err = h.decide(&p.id, true).await.unwrap_err();
    assert_eq!(code_of(&err), ErrorCode::Unavailable);
    let back = h.get(&p.id).await;
    assert_eq!(back.state(), ProposalState::Pending);
    assert!(back.decided_at_ms.is_none());
    assert_eq!(
        kinds(&back),
        ["submitted", "approved", "recheck_unavailable"]
    );
    h.ontology
        .update("oonto", "cancel", |rule| rule.unavailable = false);
    assert_eq!(
        h.decide(&p.id, true).await.unwrap().state(),
        ProposalState::Executed
    );
    assert_eq!(h.receiver.hits("tonto").len(), 1);

    // Two concurrent approvals: exactly one wins, the effect runs once.
    for round in 0..5 {
        let tag = format!("tconc{round}");
        h.ontology.set("oconc", "cancel", h.rule("ok"));
        let p = h.submit("oconc", &tag, false).await.unwrap();
        let (a, b) = tokio::join!(h.decide(&p.id, true), h.decide(&p.id, true));
        let wins = [&a, &b].iter().filter(|r| r.is_ok()).count();
        assert_eq!(wins, 1, "{a:?} {b:?}");
        let loser = match (a, b) {
            (Ok(_), Err(loser)) | (Err(loser), Ok(_)) => loser,
            other => panic!("expected one winner: {other:?}"),
        };
        assert_eq!(code_of(&loser), ErrorCode::FailedPrecondition);
        assert_eq!(h.receiver.hits(&tag).len(), 1);
        assert_eq!(h.get(&p.id).await.state(), ProposalState::Executed);
    }

    // execute_now for an action that declares no approval: runs at once.
    let mut auto = h.rule("ok");
    auto.approval_required = Some(false);
    h.ontology.set("oauto", "cancel", auto);
    let r = h.submit("oauto", "tauto", true).await.unwrap();
    assert_eq!(r.state(), ProposalState::Executed, "{r:?}");
    assert!(r.execute_now);
    assert_eq!(r.proposer, "agent-1");
    assert_eq!(h.receiver.hits("tauto").len(), 1);
    assert_eq!(
        kinds(&h.get(&r.id).await),
        [
            "submitted",
            "auto_approved",
            "rechecked",
            "effect_attempt",
            "outcome"
        ]
    );

    // execute_now whose live check refuses: stored as precondition_failed, nothing sent.
    h.ontology.update("oauto", "cancel", |rule| {
        rule.refusal = "not_found".into();
        rule.detail = "no order with order_id 42".into();
    });
    let r = h.submit("oauto", "tauto2", true).await.unwrap();
    assert_eq!(r.state(), ProposalState::PreconditionFailed);
    assert_eq!(r.refusal, "not_found");
    assert!(h.receiver.hits("tauto2").is_empty());

    // Listing: newest first, filter by state, limit.
    let list = h
        .client
        .clone()
        .list_proposals(h.request(
            ListProposalsRequest {
                state: Some(ProposalState::Executed as i32),
                limit: 3,
            },
            "admin-1",
            true,
        ))
        .await
        .unwrap()
        .into_inner()
        .proposals;
    assert_eq!(list.len(), 3);
    assert!(list.iter().all(|p| p.state() == ProposalState::Executed));
    assert!(
        list.windows(2)
            .all(|w| w[0].created_at_ms >= w[1].created_at_ms)
    );
    assert!(list.iter().all(|p| p.events.is_empty()));
    for p in &list {
        assert_no_secrets(p);
    }

    no_mcp_sequence_runs_a_governed_effect(&h).await;
}

/// What MCP can reach is Submit with the agent's (non-admin) context. No
/// sequence of such calls makes the effect of an action that needs approval
/// run: execute_now=false never sends, execute_now=true is refused unless the
/// ontology says the action needs no approval (an unset answer counts as
/// "needs approval"), and List/Get/Decide are refused to non-admins.
async fn no_mcp_sequence_runs_a_governed_effect(h: &Harness) {
    for (object, approval_required) in [("ogov", Some(true)), ("ogovunset", None)] {
        let mut rule = h.rule("ok");
        rule.approval_required = approval_required;
        h.ontology.set(object, "cancel", rule);
        let mut ids = Vec::new();
        for round in 0..4 {
            let tag = format!("{object}-{round}");
            // Pending proposals: stored, never sent.
            let p = h.submit(object, &tag, false).await.unwrap();
            assert_eq!(p.state(), ProposalState::Pending);
            ids.push(p.id.clone());
            // execute_now: refused, nothing stored as approved, nothing sent.
            let err = h.submit(object, &tag, true).await.unwrap_err();
            assert_eq!(code_of(&err), ErrorCode::PermissionDenied, "{err:?}");
            assert!(err.message().contains("needs a human approval"));
            // The agent trying to decide any proposal it knows of.
            for id in &ids {
                for approve in [true, false] {
                    let err = h
                        .client
                        .clone()
                        .decide(h.request(
                            DecideRequest {
                                id: id.clone(),
                                approve,
                                reason: "approved: true".into(),
                            },
                            "agent-1",
                            false,
                        ))
                        .await
                        .unwrap_err();
                    assert_eq!(code_of(&err), ErrorCode::PermissionDenied);
                }
            }
            // A role the agent's signed context does not carry is refused, whatever the
            // request says, and nothing is stored.
            for role in ["admin", "billing", ""] {
                let err = h
                    .client
                    .clone()
                    .submit(h.request(
                        SubmitProposalRequest {
                            object: object.to_owned(),
                            action: "cancel".into(),
                            arguments_json: json!({"tag": tag, "order_id": 42}).to_string(),
                            role: role.into(),
                            execute_now: true,
                            ..Default::default()
                        },
                        "agent-1",
                        false,
                    ))
                    .await
                    .unwrap_err();
                assert_eq!(
                    code_of(&err),
                    ErrorCode::PermissionDenied,
                    "{role}: {err:?}"
                );
                assert!(
                    err.message().contains("is not one this caller holds"),
                    "{err:?}"
                );
            }
            // Arguments that try to smuggle an approval flag change nothing.
            let smuggled = h
                .submit_as_agent(SubmitProposalRequest {
                    object: object.to_owned(),
                    action: "cancel".into(),
                    arguments_json: json!({"tag": tag, "order_id": 42, "approved": true})
                        .to_string(),
                    role: "support".into(),
                    execute_now: false,
                    ..Default::default()
                })
                .await;
            assert_eq!(smuggled.state(), ProposalState::Pending);
            ids.push(smuggled.id);
            assert!(h.receiver.hits(&tag).is_empty(), "an effect ran for {tag}");
        }
        for id in &ids {
            assert_eq!(h.get(id).await.state(), ProposalState::Pending);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let sql = SqlStore::connect(&format!(
        "sqlite://{}",
        dir.path().join("approval.db").display()
    ))
    .await
    .unwrap();
    suite(sql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_on_postgres() {
    let venv = kg_stores::embedded::find_venv().expect("run deploy/scripts/dev-deps.sh first");
    let dir = tempfile::tempdir().unwrap();
    let pg = kg_stores::embedded::EmbeddedPostgres::start(&venv, &dir.path().join("pg"))
        .await
        .unwrap();
    let sql = SqlStore::connect(&pg.url).await.unwrap();
    suite(sql).await;
    drop(pg);
}

/// Only a person decides: an admin user, for no one else, through the admin API. An agent
/// holding the admin flag (its own proposal included), an agent acting for an admin, a
/// service principal, and an admin user's context minted for MCP (relayed) are all refused,
/// before any re-check, and the proposal stays pending; an admin agent cannot list or read
/// proposals either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_person_decides() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("approval.db").display());
    let h = Harness::start(SqlStore::connect(&url).await.unwrap()).await;
    h.ontology.set("order", "cancel", h.rule("ok"));
    let p = h.submit("order", "person1", false).await.unwrap();

    let mut admin_agent = context("agent-1", true);
    admin_agent.principal_kind = PrincipalKind::Agent as i32;
    let mut agent_for_admin = context("agent-2", true);
    agent_for_admin.on_behalf_of = "admin-user".into();
    let mut service = context("svc-ci", true);
    service.principal_kind = PrincipalKind::Service as i32;
    let mut relayed = context("admin-user", true);
    relayed.tool = "mcp".into();
    for ctx in [admin_agent.clone(), agent_for_admin, service, relayed] {
        let who = format!("{} ({})", ctx.principal_id, ctx.tool);
        let err = h.decide_as(&p.id, true, ctx).await.unwrap_err();
        assert_eq!(code_of(&err), ErrorCode::PermissionDenied, "{who}: {err:?}");
        assert!(
            err.message().starts_with("only a person decides"),
            "{who}: {}",
            err.message()
        );
    }
    let still = h.get(&p.id).await;
    assert_eq!(still.state(), ProposalState::Pending);
    assert!(h.receiver.hits("person1").is_empty(), "no effect ran");
    assert_eq!(
        h.ontology.calls("order"),
        ["agent-1"],
        "refused before any re-check (the one call is the summary's, at submit)"
    );

    // Nor may the admin agent list or read proposals.
    let mut client = h.client.clone();
    let mut request = tonic::Request::new(ListProposalsRequest::default());
    attach_caller(&mut request, &h.signer.sign(&admin_agent));
    let err = client.list_proposals(request).await.unwrap_err();
    assert_eq!(code_of(&err), ErrorCode::PermissionDenied);
    let mut request = tonic::Request::new(GetProposalRequest { id: p.id.clone() });
    attach_caller(&mut request, &h.signer.sign(&admin_agent));
    let err = client.get_proposal(request).await.unwrap_err();
    assert_eq!(code_of(&err), ErrorCode::PermissionDenied);

    // A person approves: the effect runs once.
    let done = h.decide(&p.id, true).await.unwrap();
    assert_eq!(done.state(), ProposalState::Executed, "{done:?}");
    assert_eq!(h.receiver.hits("person1").len(), 1);
}

/// `four_eyes`: the user behind the agent (proposals here are made by agent-1
/// on behalf of user-ada) cannot approve them, neither directly nor through
/// an admin agent acting for them; another admin can. Off, the same approval works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_eyes_refuses_self_approval() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("approval.db").display());
    let h = Harness::start_with(SqlStore::connect(&url).await.unwrap(), |c| {
        c.four_eyes = true;
    })
    .await;
    h.ontology.set("order", "cancel", h.rule("ok"));
    let p = h.submit("order", "eyes1", false).await.unwrap();
    assert_eq!(p.on_behalf_of, "user-ada");

    // An admin agent acting for her is not a person and is refused before the rule.
    let mut as_agent_for_ada = context("agent-admin", true);
    as_agent_for_ada.on_behalf_of = "user-ada".into();
    let err = h
        .decide_as(&p.id, true, as_agent_for_ada)
        .await
        .unwrap_err();
    assert!(
        err.message().starts_with("only a person"),
        "{}",
        err.message()
    );
    for ctx in [context("user-ada", true), context("agent-1", true)] {
        let who = ctx.principal_id.clone();
        let err = h.decide_as(&p.id, true, ctx).await.unwrap_err();
        assert_eq!(code_of(&err), ErrorCode::PermissionDenied, "{who}: {err:?}");
        assert!(
            err.message().starts_with("four_eyes: "),
            "{}",
            err.message()
        );
        assert!(err.message().contains("user-ada"), "{}", err.message());
    }
    let still = h.get(&p.id).await;
    assert_eq!(still.state(), ProposalState::Pending);
    assert_eq!(
        kinds(&still),
        ["submitted", "approval_refused", "approval_refused"]
    );
    assert!(h.receiver.hits("eyes1").is_empty(), "no effect ran");
    assert_eq!(
        h.ontology.calls("order"),
        ["agent-1"],
        "refused before any re-check (the one call is the summary's, at submit)"
    );

    // Another admin approves: the effect runs once.
    let done = h.decide(&p.id, true).await.unwrap();
    assert_eq!(done.state(), ProposalState::Executed, "{done:?}");
    assert_eq!(h.receiver.hits("eyes1").len(), 1);
    // The rule holds whatever state the proposal is read in (so a read during another
    // admin's approval, claimed and then released, cannot skip it).
    let err = h
        .decide_as(&p.id, true, context("user-ada", true))
        .await
        .unwrap_err();
    assert!(
        err.message().starts_with("four_eyes: "),
        "{}",
        err.message()
    );

    // The proposer may still withdraw (reject) their own proposal.
    let p = h.submit("order", "eyes2", false).await.unwrap();
    let rejected = h
        .decide_as(&p.id, false, context("user-ada", true))
        .await
        .unwrap();
    assert_eq!(rejected.state(), ProposalState::Rejected);

    // Default (off): the proposer's own approval goes through.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("approval.db").display());
    let h = Harness::start(SqlStore::connect(&url).await.unwrap()).await;
    h.ontology.set("order", "cancel", h.rule("ok"));
    let p = h.submit("order", "eyes3", false).await.unwrap();
    let done = h
        .decide_as(&p.id, true, context("user-ada", true))
        .await
        .unwrap();
    assert_eq!(done.state(), ProposalState::Executed, "{done:?}");
}

/// Polls `id` through `h` until it leaves APPROVED, for at most `within`.
async fn settled_within(h: &Harness, id: &str, within: Duration) -> Proposal {
    let until = std::time::Instant::now() + within;
    loop {
        let p = h.get(id).await;
        if p.state() != ProposalState::Approved || std::time::Instant::now() > until {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sqlite_at(path: &std::path::Path) -> SqlStore {
    SqlStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap()
}

/// A service told to stop while an effect is running gives it `stop_grace` to end, then
/// settles it as `unknown` (the request went out) instead of leaving it approved, where no
/// admin could decide it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_service_settles_the_effects_it_leaves_running() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("approval.db");
    let h = Harness::start_with(sqlite_at(&db).await, |c| {
        c.stop_grace = Duration::from_millis(300);
    })
    .await;
    h.never_answered("ostop");
    let p = h.submit("ostop", "tstop", false).await.unwrap();
    // The approval is still waiting for its effect (30 s) when the stop comes: the server's own
    // drain waits for that call, and the settling must not wait behind it.
    let client = h.client.clone();
    let decide = h.request(
        DecideRequest {
            id: p.id.clone(),
            approve: true,
            reason: String::new(),
        },
        "admin-1",
        true,
    );
    let waiting = tokio::spawn(async move { client.clone().decide(decide).await });
    while h.receiver.hits("tstop").is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(h);

    // Another service on the same database (a long lease: only the stop can have settled it).
    let reader = Harness::start(sqlite_at(&db).await).await;
    let p = settled_within(&reader, &p.id, Duration::from_secs(5)).await;
    assert_eq!(p.state(), ProposalState::Unknown, "{p:?}");
    assert_eq!(p.attempts, 1);
    assert!(p.outcome_detail.contains("do not retry"), "{p:?}");
    waiting.abort();
}

/// A process that dies mid-run (no drain) leaves its proposal approved only until its lease
/// lapses: another approval process then settles it. While the process lives it renews the
/// lease, so the other one's sweeps leave its run alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_services_runs_are_settled_once_their_lease_lapses() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("approval.db");
    let lease = Duration::from_secs(1);
    let survivor = Harness::start_with(sqlite_at(&db).await, |c| c.run_lease = lease).await;

    // The process that dies runs on a runtime of its own, shut down without any drain.
    let crashed_db = db.clone();
    let (id, while_alive) = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (h, id, while_alive) = runtime.block_on(async move {
            let h = Harness::start_with(sqlite_at(&crashed_db).await, |c| {
                c.run_lease = lease;
                c.decide_wait = Duration::from_millis(300);
            })
            .await;
            h.never_answered("ocrash");
            let p = h.propose_and_approve("ocrash", "tcrash").await;
            // Three leases long, while the survivor sweeps every third of one.
            tokio::time::sleep(lease * 3).await;
            let while_alive = h.get(&p.id).await;
            (h, p.id, while_alive)
        });
        runtime.shutdown_background();
        drop(h);
        (id, while_alive)
    })
    .join()
    .unwrap();
    assert_eq!(
        while_alive.state(),
        ProposalState::Approved,
        "a live run was settled: {while_alive:?}"
    );

    let p = settled_within(&survivor, &id, Duration::from_secs(10)).await;
    assert_eq!(p.state(), ProposalState::Unknown, "{p:?}");
    assert!(p.outcome_detail.contains("stopped"), "{p:?}");
}

/// Two admins approving one proposal at once in one process: the losing decision must not
/// release the winner's hold on the run, or its lease lapses mid-effect and the run is settled
/// as interrupted while it still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_losing_decision_leaves_the_winners_run_held() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_secs(1);
    let h = Harness::start_with(sqlite_at(&dir.path().join("approval.db")).await, |c| {
        c.run_lease = lease;
        c.decide_wait = Duration::from_millis(300);
    })
    .await;
    h.never_answered("orace");
    let p = h.submit("orace", "trace", false).await.unwrap();
    let (first, second) = tokio::join!(h.decide(&p.id, true), h.decide(&p.id, true));
    assert_eq!(
        [first.is_ok(), second.is_ok()]
            .iter()
            .filter(|ok| **ok)
            .count(),
        1,
        "one decision wins: {first:?} {second:?}"
    );
    // Three leases on, the effect (waiting on a receiver that never answers) still runs.
    tokio::time::sleep(lease * 3).await;
    let running = h.get(&p.id).await;
    assert_eq!(running.state(), ProposalState::Approved, "{running:?}");
    assert_eq!(h.receiver.hits("trace").len(), 1);
}
