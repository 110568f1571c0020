//! SQLite has no server-side statement log, so this records every statement
//! the process runs from sqlx's own statement events (`sqlx::query`, TRACE;
//! kg_stores logs them there) while the service starts on examples/shop,
//! every generated read tool runs, and an action is proposed through the real
//! approval service and re-checked. No statement may name the sensitive
//! column; the SQLite counterpart of the PostgreSQL log_statement test in shop.rs.
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use kg_common::caller::{ContextSigner, ContextVerifier, now_ms};
use kg_ontology::{OntologyConfig, OntologyService};
use kg_proto::v1::CallerContext;
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Executor as _};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

const TARGET: &str = "sqlx::query";

/// A global subscriber that keeps the text of every sqlx statement event.
/// Global, because sqlx runs each SQLite connection on its own worker thread.
#[derive(Default)]
struct Statements(Mutex<Vec<String>>);

impl Statements {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// `summary` is the statement when it is short; otherwise `db.statement` holds all of it.
struct Text(String);

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        if matches!(field.name(), "summary" | "db.statement") {
            self.0.push_str(value);
            self.0.push('\n');
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if matches!(field.name(), "summary" | "db.statement") {
            self.0.push_str(&format!("{value:?}\n"));
        }
    }
}

struct Recorder(Arc<Statements>);

impl Subscriber for Recorder {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if meta.target() == TARGET {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        meta.target() == TARGET
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut text = Text(String::new());
        event.record(&mut text);
        if !text.0.is_empty() {
            self.0.0.lock().unwrap().push(text.0);
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

fn recorder() -> Arc<Statements> {
    static STATEMENTS: OnceLock<Arc<Statements>> = OnceLock::new();
    STATEMENTS
        .get_or_init(|| {
            let statements = Arc::new(Statements::default());
            tracing::subscriber::set_global_default(Recorder(statements.clone())).unwrap();
            statements
        })
        .clone()
}

#[tokio::test]
async fn sqlite_never_receives_a_statement_naming_a_sensitive_column() {
    let statements = recorder();
    let dir = tempfile::tempdir().unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/shop");
    let project = dir.path().join("shop");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::copy(example.join("ontology.yaml"), project.join("ontology.yaml")).unwrap();
    let url = format!("sqlite://{}", dir.path().join("shop.db").display());
    let seed = kg_stores::sql::SqlStore::connect(&url).await.unwrap();
    let sql = std::fs::read_to_string(example.join("seed.sqlite.sql")).unwrap();
    seed.pool()
        .execute(sqlx::raw_sql(AssertSqlSafe(sql)))
        .await
        .unwrap();
    seed.close().await;
    // The seed itself names `email`: that proves the recorder sees this connection's SQL.
    let seeded = statements.take();
    assert!(
        seeded.iter().any(|s| s.contains("email TEXT NOT NULL")),
        "the recorder saw no seed statement: {seeded:?}"
    );

    // The real approval service (its own SQLite store), calling back CheckAction.
    let signer = ContextSigner::generate();
    let verifier = ContextVerifier::new(vec![signer.public_key()]);
    let onto_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let appr_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let onto_addr = format!("http://{}", onto_listener.local_addr().unwrap());
    let approval_addr = format!("http://{}", appr_listener.local_addr().unwrap());
    let meta = kg_stores::sql::SqlStore::connect(&format!(
        "sqlite://{}",
        dir.path().join("meta.db").display()
    ))
    .await
    .unwrap();
    let config = kg_approval::ApprovalConfig::new(
        b"0123456789abcdef-signing".to_vec(),
        Some(onto_addr.clone()),
    );
    let approval = kg_approval::ApprovalService::new(meta, config)
        .await
        .unwrap();

    // From here on every statement counts, the service's start-up validation included.
    statements.take();
    let svc = OntologyService::new(
        OntologyConfig {
            project_dir: Some(project),
            warehouse_url: Some(url),
            approval_addr: Some(approval_addr),
            allow_auto_effects: false,
        },
        None,
    )
    .await
    .unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(kg_ontology::serve(
        svc.clone(),
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
    let now = now_ms();
    // As auth signs it for an agent granted `support`.
    let signed = signer.sign(&CallerContext {
        principal_id: "agent-1".into(),
        roles: vec!["support".into()],
        issued_at_ms: now,
        expires_at_ms: now + 600_000,
        ..Default::default()
    });
    let call = |name: &'static str, args: Value, role: &'static str| {
        let svc = svc.clone();
        let signed = signed.clone();
        async move {
            let roles: Vec<String> = [role]
                .into_iter()
                .filter(|r| !r.is_empty())
                .map(str::to_owned)
                .collect();
            svc.call_tool(
                name,
                &args.to_string(),
                &roles,
                "test",
                Some(kg_ontology::Forward {
                    signed,
                    allowed: std::time::Duration::from_secs(20),
                }),
            )
            .await
        }
    };

    // A role the policy does not know is refused before the warehouse is touched.
    statements.take();
    let denied = call(
        "propose_order_cancel",
        json!({"order_id": 101, "reason": "x"}),
        "intern",
    )
    .await;
    assert_eq!(denied["error"], "denied_role", "{denied}");
    let touched: Vec<String> = statements
        .take()
        .into_iter()
        .filter(|s| s.contains("\"orders\"") || s.contains("\"customers\""))
        .collect();
    assert!(
        touched.is_empty(),
        "a refused call read the warehouse: {touched:#?}"
    );

    // Every generated read tool, each shape of call.
    let ada = call("get_customer", json!({"customer_id": 1}), "").await;
    assert_eq!(ada["rows"][0]["full_name"], "Ada Lovelace", "{ada}");
    assert_eq!(ada["redacted_properties"], json!(["email"]));
    for args in [json!({}), json!({"state": "active"}), json!({"limit": 1})] {
        let listed = call("list_customer", args, "").await;
        assert!(listed["count"].as_i64().unwrap() >= 1, "{listed}");
    }
    let orders = call("traverse_customer_orders", json!({"customer_id": 1}), "").await;
    assert_eq!(orders["count"], 2, "{orders}");
    let order = call("get_order", json!({"order_id": 101}), "").await;
    assert_eq!(order["rows"][0]["state"], "pending", "{order}");
    let pending = call("list_order", json!({"state": "pending"}), "").await;
    assert_eq!(pending["count"], 2, "{pending}");
    assert_eq!(
        call("get_customer", json!({"customer_id": 99}), "").await["error"],
        "not_found"
    );

    // Propose: a dry run, a refusal on live state, and a real proposal stored for a human.
    let dry = call(
        "propose_order_cancel",
        json!({"order_id": 101, "reason": "x", "dry_run": true}),
        "support",
    )
    .await;
    assert_eq!(dry["outcome"], "dry_run", "{dry}");
    let shipped = call(
        "propose_order_cancel",
        json!({"order_id": 102, "reason": "x"}),
        "support",
    )
    .await;
    assert_eq!(shipped["error"], "precondition_failed", "{shipped}");
    let proposed = call(
        "propose_order_cancel",
        json!({"order_id": 101, "reason": "asked"}),
        "support",
    )
    .await;
    assert_eq!(proposed["outcome"], "pending_approval", "{proposed}");
    // What the approval service runs at decision time.
    let check = svc
        .check_action(
            "order",
            "cancel",
            r#"{"order_id": 101, "reason": "x"}"#,
            "support",
        )
        .await
        .unwrap();
    assert_eq!(check.refusal, "");
    shutdown.cancel();

    let seen = statements.take();
    assert!(
        seen.iter().any(|s| s.contains("\"full_name\"")),
        "the recorder saw the tools' SELECTs: {seen:#?}"
    );
    assert!(
        seen.iter().any(|s| s.contains("INSERT INTO")),
        "the recorder saw the approval store's writes: {seen:#?}"
    );
    for statement in &seen {
        assert!(
            !statement.to_ascii_lowercase().contains("email"),
            "a statement named a sensitive column: {statement}"
        );
    }
    // traverse reads only the join key of the source, never its properties.
    assert!(
        seen.iter()
            .any(|s| s.contains("SELECT CAST(\"customer_id\" AS BIGINT) FROM \"customers\"")),
        "{seen:#?}"
    );
}
