//! propose_ through the real approval service (kg-approval over gRPC, which
//! calls back Ontology.CheckAction) to a real local webhook receiver that
//! answers 2xx, 4xx, 5xx, a redirect, or never. Proves every outcome, and that
//! no call sequence makes an effect run for an action that needs approval.
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kg_common::caller::{ContextSigner, ContextVerifier, now_ms};
use kg_ontology::{Forward, OntologyConfig, OntologyService};
use kg_proto::v1::{CallerContext, SignedCallerContext, SubmitProposalRequest};
use prost::Message as _;
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Executor as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Ok,
    Client4xx,
    Server5xx,
    Redirect,
    Never,
}

#[derive(Clone, Debug)]
struct Received {
    request_line: String,
    headers: String,
    body: String,
}

#[derive(Clone)]
struct Receiver {
    addr: String,
    mode: Arc<Mutex<Mode>>,
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let receiver = Receiver {
            addr,
            mode: Arc::new(Mutex::new(Mode::Ok)),
            got: Arc::default(),
        };
        let r = receiver.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let r = r.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let n = sock.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            break;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        if let Some((head, body)) = text.split_once("\r\n\r\n") {
                            let len = head
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase()
                                        .strip_prefix("content-length:")
                                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                                })
                                .unwrap_or(0);
                            if body.len() >= len {
                                let (line, headers) = head.split_once("\r\n").unwrap_or((head, ""));
                                r.got.lock().unwrap().push(Received {
                                    request_line: line.to_owned(),
                                    headers: headers.to_owned(),
                                    body: body.to_owned(),
                                });
                                break;
                            }
                        }
                    }
                    let mode = *r.mode.lock().unwrap();
                    let response = match mode {
                        Mode::Ok => {
                            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        }
                        Mode::Client4xx => {
                            "HTTP/1.1 422 Unprocessable Entity\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        }
                        Mode::Server5xx => {
                            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        }
                        Mode::Redirect => {
                            "HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:9/\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        }
                        Mode::Never => {
                            tokio::time::sleep(Duration::from_secs(600)).await;
                            return;
                        }
                    };
                    let _ = sock.write_all(response.as_bytes()).await;
                });
            }
        });
        receiver
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
        self.got.lock().unwrap().clear();
    }

    fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
}

struct Mesh {
    ontology: OntologyService,
    ontology_addr: String,
    approval_addr: String,
    signer: ContextSigner,
    shutdown: CancellationToken,
}

async fn start(dir: &Path, receiver: &Receiver, auto: bool) -> Mesh {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/shop");
    let project = dir.join("shop");
    std::fs::create_dir_all(&project).unwrap();
    let yaml = std::fs::read_to_string(example.join("ontology.yaml"))
        .unwrap()
        .replace("127.0.0.1:8765", &receiver.addr)
        .replace("timeout_ms: 3000", "timeout_ms: 400");
    std::fs::write(project.join("ontology.yaml"), yaml).unwrap();
    let url = format!("sqlite://{}", dir.join("shop.db").display());
    let wh = kg_stores::sql::SqlStore::connect(&url).await.unwrap();
    let seed = std::fs::read_to_string(example.join("seed.sqlite.sql")).unwrap();
    wh.pool()
        .execute(sqlx::raw_sql(AssertSqlSafe(seed)))
        .await
        .unwrap();
    wh.close().await;

    let signer = ContextSigner::generate();
    let verifier = ContextVerifier::new(vec![signer.public_key()]);
    let onto_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let appr_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let onto_addr = format!("http://{}", onto_listener.local_addr().unwrap());
    let approval_addr = format!("http://{}", appr_listener.local_addr().unwrap());

    let ontology = OntologyService::new(
        OntologyConfig {
            project_dir: Some(project),
            warehouse_url: Some(url),
            approval_addr: Some(approval_addr.clone()),
            allow_auto_effects: auto,
        },
        None,
    )
    .await
    .unwrap();
    let meta =
        kg_stores::sql::SqlStore::connect(&format!("sqlite://{}", dir.join("meta.db").display()))
            .await
            .unwrap();
    let mut config = kg_approval::ApprovalConfig::new(
        b"0123456789abcdef-signing".to_vec(),
        Some(onto_addr.clone()),
    );
    config.secrets = kg_approval::SecretSource::Fixed(Arc::new(HashMap::from([(
        "SHOP_WEBHOOK_TOKEN".to_owned(),
        "s3cret-token".to_owned(),
    )])));
    config.backoff_base = Duration::from_millis(20);
    let approval = kg_approval::ApprovalService::new(meta, config)
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(kg_ontology::serve(
        ontology.clone(),
        verifier.clone(),
        onto_listener,
        shutdown.clone(),
    ));
    tokio::spawn(kg_approval::serve(
        approval,
        verifier,
        appr_listener,
        shutdown.clone(),
    ));

    Mesh {
        ontology,
        ontology_addr: onto_addr,
        approval_addr,
        signer,
        shutdown,
    }
}

/// The roles of a context holding `role` (none when empty).
fn held(role: &str) -> Vec<String> {
    if role.is_empty() {
        Vec::new()
    } else {
        vec![role.to_owned()]
    }
}

impl Mesh {
    /// The agent's context as auth signs it, holding `role` (none when empty).
    fn signed_as(&self, role: &str) -> SignedCallerContext {
        let now = now_ms();
        self.signer.sign(&CallerContext {
            principal_id: "agent-1".into(),
            roles: held(role),
            issued_at_ms: now,
            expires_at_ms: now + 600_000,
            ..Default::default()
        })
    }
}

async fn call(m: &Mesh, name: &str, args: Value, role: &str) -> Value {
    m.ontology
        .call_tool(
            name,
            &args.to_string(),
            &held(role),
            "test-agent",
            // The gateway's deadline on a backend call.
            Some(Forward {
                signed: m.signed_as(role),
                allowed: Duration::from_secs(20),
            }),
        )
        .await
}

#[tokio::test]
async fn every_outcome_through_the_approval_service() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let m = start(dir.path(), &receiver, true).await;

    // Approval always: stored, nothing sent.
    let r = call(
        &m,
        "propose_order_cancel",
        json!({"order_id": 101, "reason": "customer asked"}),
        "support",
    )
    .await;
    assert_eq!(r["outcome"], "pending_approval", "{r}");
    assert!(r["proposal_id"].as_str().unwrap().starts_with("prp_"));
    // approval.when true: stored, nothing sent, even with auto effects on.
    let r = call(
        &m,
        "propose_order_refund",
        json!({"order_id": 102, "amount": 180}),
        "billing",
    )
    .await;
    assert_eq!(
        (r["outcome"].clone(), r["approval_required"].clone()),
        (json!("pending_approval"), json!(true)),
        "{r}"
    );
    assert!(receiver.received().is_empty());

    // No approval needed, auto effects allowed: executed once, with the secret header.
    receiver.set(Mode::Ok);
    let r = call(
        &m,
        "propose_order_refund",
        json!({"order_id": 102, "amount": 50, "reason": "late"}),
        "billing",
    )
    .await;
    assert_eq!(r["outcome"], "executed", "{r}");
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    assert!(
        got[0].request_line.starts_with("POST /orders/102/refund "),
        "{:?}",
        got[0]
    );
    assert!(
        got[0]
            .headers
            .to_ascii_lowercase()
            .contains("x-shop-token: s3cret-token")
    );
    assert_eq!(
        serde_json::from_str::<Value>(&got[0].body).unwrap(),
        json!({"order_id": 102, "amount": 50.0, "reason": "late"})
    );
    assert!(
        !r.to_string().contains("/orders/102/refund"),
        "the resolved URL never reaches the model"
    );

    receiver.set(Mode::Client4xx);
    let r = call(
        &m,
        "propose_order_refund",
        json!({"order_id": 102, "amount": 50}),
        "billing",
    )
    .await;
    assert_eq!(r["outcome"], "effect_failed", "{r}");
    assert_eq!(receiver.received().len(), 1, "a 4xx is not retried");

    receiver.set(Mode::Redirect);
    let r = call(
        &m,
        "propose_order_refund",
        json!({"order_id": 102, "amount": 50}),
        "billing",
    )
    .await;
    assert_eq!(r["outcome"], "effect_failed", "{r}");
    assert_eq!(receiver.received().len(), 1, "a redirect is not followed");

    receiver.set(Mode::Server5xx);
    let r = call(
        &m,
        "propose_order_refund",
        json!({"order_id": 102, "amount": 50}),
        "billing",
    )
    .await;
    assert_eq!(r["outcome"], "effect_failed", "{r}");
    assert_eq!(
        receiver.received().len(),
        3,
        "5xx retried up to max_attempts"
    );

    receiver.set(Mode::Never);
    let r = call(
        &m,
        "propose_order_refund",
        json!({"order_id": 102, "amount": 50}),
        "billing",
    )
    .await;
    assert_eq!(r["outcome"], "unknown", "{r}");
    assert!(r["would"].as_str().unwrap().contains("do not retry"));

    // The precondition is re-checked on live data by the approval service too.
    let r = call(
        &m,
        "propose_order_refund",
        json!({"order_id": 101, "amount": 5}),
        "billing",
    )
    .await;
    assert_eq!(r["error"], "precondition_failed", "{r}");
    m.shutdown.cancel();
}

#[tokio::test]
async fn no_call_sequence_runs_an_effect_that_needs_approval() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let m = start(dir.path(), &receiver, true).await;
    receiver.set(Mode::Ok);
    // Everything an agent can send: dry runs, approved flags, repeated calls, other roles.
    for args in [
        json!({"order_id": 101, "reason": "x"}),
        json!({"order_id": 101, "reason": "x", "dry_run": true}),
        json!({"order_id": 101, "reason": "x", "approved": true}),
        json!({"order_id": 101, "reason": "x", "dry_run": false}),
    ] {
        for role in ["support", "billing", "viewer", ""] {
            let _ = call(&m, "propose_order_cancel", args.clone(), role).await;
        }
    }
    for amount in [101, 500, 1000] {
        let r = call(
            &m,
            "propose_order_refund",
            json!({"order_id": 102, "amount": amount}),
            "billing",
        )
        .await;
        assert_eq!(r["outcome"], "pending_approval");
    }
    // Even straight to the approval service, execute_now for an action that needs approval is refused.
    let mut client = kg_proto::v1::approval_client::ApprovalClient::new(
        kg_common::grpc::channel(&m.approval_addr).unwrap(),
    );
    let mut request = tonic::Request::new(SubmitProposalRequest {
        object: "order".into(),
        action: "cancel".into(),
        arguments_json: json!({"order_id": 101, "reason": "x"}).to_string(),
        role: "support".into(),
        execute_now: true,
        ..Default::default()
    });
    kg_common::caller::attach_caller(&mut request, &m.signed_as("support"));
    assert!(client.submit(request).await.is_err());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        receiver.received().is_empty(),
        "no effect ran: {:?}",
        receiver.received()
    );
    m.shutdown.cancel();
}

/// Each value within its max_length, but the arguments together over what a proposal holds:
/// refused as invalid arguments, saying what to change, and nothing is stored. Before, the
/// approval service refused the submit and the agent got an internal error.
#[tokio::test]
async fn arguments_larger_than_a_proposal_holds_are_refused_with_what_to_change() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let m = start(dir.path(), &receiver, false).await;
    edit_project(&m, dir.path(), "max_length: 500}", "max_length: 12000}").await;
    // 12,000 control characters are 72,000 bytes as JSON (\u0001 each).
    let reason = "\u{1}".repeat(12_000);
    let r = call(
        &m,
        "propose_order_cancel",
        json!({"order_id": 101, "reason": reason}),
        "support",
    )
    .await;
    assert_eq!(r["error"], "invalid_arguments", "{r}");
    let message = r["message"].as_str().unwrap();
    assert!(
        message.contains("at most 65536") && message.contains("nothing was stored"),
        "{message}"
    );
    // The same call within the limit is stored for approval.
    let r = call(
        &m,
        "propose_order_cancel",
        json!({"order_id": 101, "reason": "x".repeat(12_000)}),
        "support",
    )
    .await;
    assert_eq!(r["outcome"], "pending_approval", "{r}");
    assert!(receiver.received().is_empty());
    m.shutdown.cancel();
}

/// An effect that runs on past the caller's deadline (a webhook that never answers, 10 s per
/// attempt): the tool call still answers inside the deadline the gateway sent, as `unknown`
/// (sent, no answer yet), while the run goes on. Before, the approval service waited 15 s
/// and the gateway's call failed at its deadline, inviting the agent to propose again.
#[tokio::test]
async fn an_effect_outlasting_the_callers_deadline_answers_unknown_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let m = start(dir.path(), &receiver, true).await;
    edit_project(&m, dir.path(), "timeout_ms: 400", "timeout_ms: 10000").await;
    receiver.set(Mode::Never);
    let mut client = kg_proto::v1::ontology_client::OntologyClient::new(
        kg_common::grpc::channel(&m.ontology_addr).unwrap(),
    );
    let mut request = tonic::Request::new(kg_proto::v1::CallGeneratedToolRequest {
        name: "propose_order_refund".into(),
        arguments_json: json!({"order_id": 102, "amount": 50}).to_string(),
        agent: "test-agent".into(),
    });
    kg_common::caller::attach_caller(&mut request, &m.signed_as("billing"));
    request.set_timeout(Duration::from_secs(3));
    let answer = client.call_generated_tool(request).await.unwrap();
    let r: Value = serde_json::from_str(&answer.into_inner().result_json).unwrap();
    assert_eq!(r["outcome"], "unknown", "{r}");
    let id = r["proposal_id"].as_str().unwrap();
    // The run went on: the webhook got the request.
    for _ in 0..100 {
        if !receiver.received().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(receiver.received().len(), 1, "sent once");
    assert!(!id.is_empty());
    m.shutdown.cancel();
}

#[tokio::test]
async fn auto_effects_off_refuses_without_contacting_anyone() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let m = start(dir.path(), &receiver, false).await;
    let r = call(
        &m,
        "propose_order_refund",
        json!({"order_id": 102, "amount": 50}),
        "billing",
    )
    .await;
    assert_eq!(r["error"], "auto_effects_disabled", "{r}");

    // A caller that goes round the generated tool, straight to Approval.Submit with
    // execute_now and its own signed context, is refused too: the ontology tells approval
    // that this server runs no effect without a decision.
    let err = submit_refund_at_once(&m, "billing").await;
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("needs a human approval"), "{err:?}");
    assert!(receiver.received().is_empty());
    m.shutdown.cancel();
}

/// Roles come from the signed caller context on every hop, never from a request: the
/// ontology lists and runs tools as the context's roles, the approval service refuses a
/// proposal made as a role the context does not carry (with automatic effects on, that
/// would have sent a refund for an agent holding no role), and CheckAction answers a
/// non-admin only for its own roles.
#[tokio::test]
async fn roles_come_from_the_signed_context_never_from_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let m = start(dir.path(), &receiver, true).await;
    let channel = kg_common::grpc::channel(&m.ontology_addr).unwrap();
    let mut ontology = kg_proto::v1::ontology_client::OntologyClient::new(channel);

    // Cancel is for support only, refund for support and billing.
    for (role, proposals) in [
        ("", vec![]),
        ("billing", vec!["propose_order_refund"]),
        (
            "support",
            vec!["propose_order_cancel", "propose_order_refund"],
        ),
    ] {
        let mut request = tonic::Request::new(kg_proto::v1::ListGeneratedToolsRequest {});
        kg_common::caller::attach_caller(&mut request, &m.signed_as(role));
        let tools = ontology
            .list_generated_tools(request)
            .await
            .unwrap()
            .into_inner()
            .tools;
        let mut listed: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert!(listed.contains(&"get_order"), "{role}: {listed:?}");
        listed.retain(|name| name.starts_with("propose_"));
        listed.sort_unstable();
        assert_eq!(listed, proposals, "{role}");
    }

    let mut request = tonic::Request::new(kg_proto::v1::CallGeneratedToolRequest {
        name: "propose_order_cancel".into(),
        arguments_json: json!({"order_id": 101, "reason": "x"}).to_string(),
        agent: "test-agent".into(),
    });
    kg_common::caller::attach_caller(&mut request, &m.signed_as("billing"));
    let answer = ontology
        .call_generated_tool(request)
        .await
        .unwrap()
        .into_inner();
    let r: Value = serde_json::from_str(&answer.result_json).unwrap();
    assert_eq!(r["error"], "denied_role", "{r}");

    let refund = json!({"order_id": 102, "amount": 50}).to_string();
    let err = submit_refund_at_once(&m, "").await;
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(
        err.message()
            .contains("role `billing` is not one this caller holds"),
        "{err:?}"
    );

    let check = |role: &str, signed: SignedCallerContext| {
        let mut request = tonic::Request::new(kg_proto::v1::CheckActionRequest {
            object: "order".into(),
            action: "refund".into(),
            arguments_json: refund.clone(),
            role: role.into(),
        });
        kg_common::caller::attach_caller(&mut request, &signed);
        let mut ontology = ontology.clone();
        async move { ontology.check_action(request).await }
    };
    let err = check("billing", m.signed_as("")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    let own = check("billing", m.signed_as("billing"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(own.refusal, "", "{own:?}");
    // An admin's context minted for MCP is held to its own roles like any other.
    let mut relayed = CallerContext::decode(admin_context(&m).context.as_slice()).unwrap();
    relayed.tool = kg_common::caller::MCP_TOOL.into();
    let err = check("billing", m.signer.sign(&relayed)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    let by_admin = check("billing", admin_context(&m))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_admin.refusal, "", "{by_admin:?}");

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(receiver.received().is_empty(), "no effect ran");
    m.shutdown.cancel();
}

/// Approval.Submit straight from a caller that goes round the generated tool: a refund
/// of 50 (no approval needed) as role `billing`, to run at once, signed with a context
/// holding `holding`; the refusal.
async fn submit_refund_at_once(m: &Mesh, holding: &str) -> tonic::Status {
    let mut client = kg_proto::v1::approval_client::ApprovalClient::new(
        kg_common::grpc::channel(&m.approval_addr).unwrap(),
    );
    let policy_version = m
        .ontology
        .active()
        .unwrap()
        .compiled
        .action_version("order", "refund");
    let mut request = tonic::Request::new(SubmitProposalRequest {
        object: "order".into(),
        action: "refund".into(),
        arguments_json: json!({"order_id": 102, "amount": 50}).to_string(),
        role: "billing".into(),
        policy_version,
        agent: "shell".into(),
        execute_now: true,
        effect: None,
    });
    kg_common::caller::attach_caller(&mut request, &m.signed_as(holding));
    client.submit(request).await.unwrap_err()
}

/// An admin person's context, as the admin API's calls carry it.
fn admin_context(m: &Mesh) -> SignedCallerContext {
    let now = now_ms();
    m.signer.sign(&CallerContext {
        principal_id: "admin-1".into(),
        principal_kind: kg_proto::v1::PrincipalKind::User as i32,
        tool: "admin".into(),
        is_admin: true,
        issued_at_ms: now,
        expires_at_ms: now + 600_000,
        ..Default::default()
    })
}

/// Approves (as an admin) through the real approval service.
async fn approve(m: &Mesh, id: &str) -> kg_proto::v1::Proposal {
    let admin = admin_context(m);
    let mut client = kg_proto::v1::approval_client::ApprovalClient::new(
        kg_common::grpc::channel(&m.approval_addr).unwrap(),
    );
    let mut request = tonic::Request::new(kg_proto::v1::DecideRequest {
        id: id.to_owned(),
        approve: true,
        reason: "ok".into(),
    });
    kg_common::caller::attach_caller(&mut request, &admin);
    client.decide(request).await.unwrap().into_inner()
}

/// Rewrites the project file and recompiles the running service.
async fn edit_project(m: &Mesh, dir: &Path, from: &str, to: &str) {
    let path = dir.join("shop").join("ontology.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    assert!(yaml.contains(from), "{from} not in the project");
    std::fs::write(&path, yaml.replace(from, to)).unwrap();
    m.ontology.reload().await.unwrap();
}

/// The policy version is per action: recompiling after a change to `refund`
/// leaves pending `cancel` proposals approvable (the effect runs); a change to
/// `cancel`'s own effect turns its pending proposals into policy_changed.
#[tokio::test]
async fn policy_version_is_per_action() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let m = start(dir.path(), &receiver, true).await;
    receiver.set(Mode::Ok);
    let mut ids = Vec::new();
    let mut versions = Vec::new();
    for reason in ["first", "second"] {
        let r = call(
            &m,
            "propose_order_cancel",
            json!({"order_id": 101, "reason": reason}),
            "support",
        )
        .await;
        assert_eq!(r["outcome"], "pending_approval", "{r}");
        ids.push(r["proposal_id"].as_str().unwrap().to_owned());
        versions.push(r["policy_version"].as_i64().unwrap());
    }
    let compiled = m.ontology.active().unwrap().compiled.policy_version;

    // Another action's effect changes: a new project version, the same cancel version.
    edit_project(&m, dir.path(), "/refund\"", "/refund-v2\"").await;
    assert_ne!(
        m.ontology.active().unwrap().compiled.policy_version,
        compiled
    );
    let dry = call(
        &m,
        "propose_order_cancel",
        json!({"order_id": 101, "reason": "x", "dry_run": true}),
        "support",
    )
    .await;
    assert_eq!(dry["policy_version"].as_i64(), Some(versions[0]), "{dry}");
    let done = approve(&m, &ids[0]).await;
    assert_eq!(
        done.state(),
        kg_proto::v1::ProposalState::Executed,
        "{done:?}"
    );
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    assert!(
        got[0].request_line.starts_with("POST /orders/101/cancel "),
        "{:?}",
        got[0]
    );

    // This action's own effect changes: its pending proposal is refused, nothing sent.
    receiver.set(Mode::Ok);
    edit_project(&m, dir.path(), "/cancel\"", "/cancel-v2\"").await;
    let refused = approve(&m, &ids[1]).await;
    assert_eq!(
        refused.state(),
        kg_proto::v1::ProposalState::PreconditionFailed,
        "{refused:?}"
    );
    assert_eq!(refused.refusal, "policy_changed", "{refused:?}");
    assert!(receiver.received().is_empty(), "no effect ran");
    m.shutdown.cancel();
}
