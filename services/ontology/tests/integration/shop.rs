//! The generated tools of examples/shop over real SQLite and real PostgreSQL:
//! every read behaviour, every refusal, dry_run, redaction (proved on the
//! PostgreSQL statement log) and sanitising of hostile warehouse text.
use std::path::{Path, PathBuf};

use kg_ontology::{OntologyConfig, OntologyService, REDACTION_NOTE};
use kg_stores::embedded::{EmbeddedPostgres, find_venv};
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Executor as _};

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/shop")
}

/// A copy of examples/shop in `dir` (the tests edit it).
fn copy_project(dir: &Path) -> PathBuf {
    let project = dir.join("shop");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::copy(
        example_dir().join("ontology.yaml"),
        project.join("ontology.yaml"),
    )
    .unwrap();
    project
}

async fn seed(url: &str, file: &str) {
    let store = kg_stores::sql::SqlStore::connect(url).await.unwrap();
    let sql = std::fs::read_to_string(example_dir().join(file)).unwrap();
    store
        .pool()
        .execute(sqlx::raw_sql(AssertSqlSafe(sql)))
        .await
        .unwrap();
    // A duplicated order id, as imported tables without keys have.
    store
        .pool()
        .execute("INSERT INTO orders VALUES (106, 2, 10.0, '2026-11-02', NULL, NULL)")
        .await
        .unwrap();
    store
        .pool()
        .execute("INSERT INTO orders VALUES (106, 2, 11.0, '2026-11-03', NULL, NULL)")
        .await
        .unwrap();
    store.close().await;
}

async fn service(project: &Path, url: &str, auto: bool) -> OntologyService {
    OntologyService::new(
        OntologyConfig {
            project_dir: Some(project.to_path_buf()),
            warehouse_url: Some(url.to_owned()),
            approval_addr: None,
            allow_auto_effects: auto,
        },
        None,
    )
    .await
    .unwrap()
}

async fn call(svc: &OntologyService, name: &str, args: Value, roles: &[&str]) -> Value {
    let roles: Vec<String> = roles.iter().map(|r| (*r).to_owned()).collect();
    svc.call_tool_with(name, &args.to_string(), &roles, "test", None)
        .await
}

fn code(v: &Value) -> &str {
    v["error"].as_str().unwrap_or("")
}

/// Every read behaviour and refusal; the same body on both backends.
async fn exercise(svc: &OntologyService) {
    // Tool listing: no role = read tools only.
    let (read, _) = svc.tools_for(&[]);
    let names: Vec<_> = read.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "get_customer",
            "list_customer",
            "traverse_customer_orders",
            "get_order",
            "list_order"
        ]
    );
    let (support, version) = svc.tools_for(&["support".to_owned()]);
    assert!(version > 0);
    let names: Vec<_> = support.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"propose_order_cancel") && names.contains(&"propose_order_refund"));
    let (billing, _) = svc.tools_for(&["billing".to_owned()]);
    let names: Vec<_> = billing.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"propose_order_refund") && !names.contains(&"propose_order_cancel"));
    let cancel = support
        .iter()
        .find(|t| t.name == "propose_order_cancel")
        .unwrap();
    assert!(!cancel.read_only);
    for needle in [
        "state `pending`",
        "Allowed roles: support",
        "Approval: always required",
    ] {
        assert!(
            cancel.description.contains(needle),
            "{needle}: {}",
            cancel.description
        );
    }

    // get_
    let ada = call(svc, "get_customer", json!({"customer_id": 1}), &[]).await;
    assert_eq!(ada["count"], 1, "{ada}");
    assert_eq!(
        ada["rows"][0],
        json!({"customer_id": 1, "full_name": "Ada Lovelace", "created_at": ada["rows"][0]["created_at"], "state": "active"})
    );
    assert!(ada["rows"][0].get("email").is_none());
    assert_eq!(ada["redacted_properties"], json!(["email"]));
    assert_eq!(ada["note"], REDACTION_NOTE);
    let grace = call(svc, "get_customer", json!({"customer_id": "2"}), &[]).await;
    assert_eq!(grace["rows"][0]["state"], "churned");
    assert_eq!(
        code(&call(svc, "get_customer", json!({"customer_id": 99}), &[]).await),
        "not_found"
    );
    assert_eq!(
        code(&call(svc, "get_order", json!({"order_id": 106}), &[]).await),
        "ambiguous_identity"
    );
    assert_eq!(
        code(&call(svc, "get_customer", json!({}), &[]).await),
        "invalid_arguments"
    );
    assert_eq!(
        code(&call(svc, "get_customer", json!({"customer_id": "x"}), &[]).await),
        "invalid_arguments"
    );
    assert_eq!(
        code(
            &call(
                svc,
                "get_customer",
                json!({"customer_id": 1, "email": "x"}),
                &[]
            )
            .await
        ),
        "invalid_arguments"
    );
    // Values are bound, never spliced: an injection attempt is just a bad integer.
    assert_eq!(
        code(&call(svc, "get_customer", json!({"customer_id": "1 OR 1=1"}), &[]).await),
        "invalid_arguments"
    );
    assert_eq!(
        code(&call(svc, "get_nothing", json!({}), &[]).await),
        "unknown_tool"
    );

    // The hostile name comes back clean.
    let mallory = call(svc, "get_customer", json!({"customer_id": 3}), &[]).await;
    let name = mallory["rows"][0]["full_name"].as_str().unwrap();
    assert_eq!(name, "Mallory Redevil Jones");
    assert!(!name.chars().any(|c| c == '\u{1b}'
        || ('\u{E0000}'..='\u{E007F}').contains(&c)
        || ('\u{202A}'..='\u{202E}').contains(&c)));

    // list_: ordered by identity, filtered by declared state, clamped, truncated.
    let all = call(svc, "list_order", json!({}), &[]).await;
    let ids: Vec<i64> = all["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["order_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [101, 102, 103, 104, 105, 106, 106]);
    assert_eq!(all["truncated"], false);
    assert_eq!(all["rows"][1]["amount"], json!(250.0));
    let pending = call(svc, "list_order", json!({"state": "pending"}), &[]).await;
    let ids: Vec<i64> = pending["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["order_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [101, 105, 106, 106]);
    assert!(
        pending["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["state"] == "pending")
    );
    let two = call(svc, "list_order", json!({"limit": 2}), &[]).await;
    assert_eq!(
        (two["count"].clone(), two["truncated"].clone()),
        (json!(2), json!(true))
    );
    let clamped = call(svc, "list_order", json!({"limit": 0}), &[]).await;
    assert_eq!(clamped["count"], 1);
    let big = call(svc, "list_order", json!({"limit": 1_000_000}), &[]).await;
    assert_eq!(
        (big["count"].clone(), big["truncated"].clone()),
        (json!(7), json!(false))
    );
    assert_eq!(
        code(&call(svc, "list_order", json!({"state": "lost"}), &[]).await),
        "invalid_arguments"
    );
    assert_eq!(
        code(&call(svc, "list_order", json!({"state": "1=1) OR (1=1"}), &[]).await),
        "invalid_arguments"
    );
    assert_eq!(
        code(&call(svc, "list_order", json!({"limit": "ten"}), &[]).await),
        "invalid_arguments"
    );
    let customers = call(svc, "list_customer", json!({"state": "active"}), &[]).await;
    assert_eq!(customers["count"], 2);
    assert!(
        customers["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r.get("email").is_none())
    );

    // traverse_: only the target's rows; source not found is an error.
    let orders = call(
        svc,
        "traverse_customer_orders",
        json!({"customer_id": 1}),
        &[],
    )
    .await;
    assert_eq!(orders["object"], "order");
    let ids: Vec<i64> = orders["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["order_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [101, 102]);
    assert_eq!(orders["rows"][0]["state"], "pending");
    assert!(orders["rows"][0].get("full_name").is_none());
    let one = call(
        svc,
        "traverse_customer_orders",
        json!({"customer_id": 2, "limit": 1}),
        &[],
    )
    .await;
    assert_eq!(
        (one["count"].clone(), one["truncated"].clone()),
        (json!(1), json!(true))
    );
    assert_eq!(
        code(
            &call(
                svc,
                "traverse_customer_orders",
                json!({"customer_id": 42}),
                &[]
            )
            .await
        ),
        "not_found"
    );

    // propose_: refusals in order: role, identity, precondition, approval.
    let denied = call(
        svc,
        "propose_order_cancel",
        json!({"order_id": 101, "reason": "x"}),
        &[],
    )
    .await;
    assert_eq!(code(&denied), "denied_role", "{denied}");
    assert_eq!(
        code(
            &call(
                svc,
                "propose_order_cancel",
                json!({"order_id": 101, "reason": "x"}),
                &["billing"]
            )
            .await
        ),
        "denied_role"
    );
    assert_eq!(
        code(
            &call(
                svc,
                "propose_order_cancel",
                json!({"order_id": 999, "reason": "x"}),
                &["support"]
            )
            .await
        ),
        "not_found"
    );
    assert_eq!(
        code(
            &call(
                svc,
                "propose_order_cancel",
                json!({"order_id": 106, "reason": "x"}),
                &["support"]
            )
            .await
        ),
        "ambiguous_identity"
    );
    let shipped = call(
        svc,
        "propose_order_cancel",
        json!({"order_id": 102, "reason": "x"}),
        &["support"],
    )
    .await;
    assert_eq!(code(&shipped), "precondition_failed");
    assert!(
        shipped["message"]
            .as_str()
            .unwrap()
            .contains("state `shipped`"),
        "{shipped}"
    );
    assert_eq!(
        code(
            &call(
                svc,
                "propose_order_cancel",
                json!({"order_id": 101}),
                &["support"]
            )
            .await
        ),
        "invalid_arguments"
    );
    assert_eq!(
        code(
            &call(
                svc,
                "propose_order_cancel",
                json!({"order_id": 101, "reason": "x", "approved": true}),
                &["support"]
            )
            .await
        ),
        "invalid_arguments"
    );
    assert_eq!(
        code(
            &call(
                svc,
                "propose_order_cancel",
                json!({"order_id": 101, "reason": "x".repeat(501)}),
                &["support"]
            )
            .await
        ),
        "invalid_arguments"
    );
    let unevaluable = call(
        svc,
        "propose_order_refund",
        json!({"order_id": 102}),
        &["billing"],
    )
    .await;
    assert_eq!(code(&unevaluable), "approval_unevaluable", "{unevaluable}");
    assert!(unevaluable["message"].as_str().unwrap().contains("amount"));

    // dry_run: what would happen, effect as template and host only.
    let dry = call(
        svc,
        "propose_order_cancel",
        json!({"order_id": 101, "reason": "duplicate", "dry_run": true}),
        &["support"],
    )
    .await;
    assert_eq!(dry["outcome"], "dry_run", "{dry}");
    assert_eq!(dry["approval_required"], true);
    assert_eq!(dry["state"], "pending");
    assert_eq!(
        dry["effect"],
        json!({"method": "POST", "url_template": "http://127.0.0.1:8765/orders/{{ order_id }}/cancel", "host": "127.0.0.1"})
    );
    assert!(
        !dry.to_string().contains("/orders/101/"),
        "the resolved URL never leaves"
    );
    let dry = call(
        svc,
        "propose_order_refund",
        json!({"order_id": 102, "amount": 50, "dry_run": true}),
        &["billing"],
    )
    .await;
    assert_eq!(
        (dry["outcome"].clone(), dry["approval_required"].clone()),
        (json!("dry_run"), json!(false))
    );
    assert!(
        dry["would"]
            .as_str()
            .unwrap()
            .contains("auto_effects_disabled")
    );

    // CheckAction for the approval service re-checks live data.
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
    assert_eq!(check.approval_required, Some(true));
    let effect = check.effect.unwrap();
    assert_eq!(effect.url, "http://127.0.0.1:8765/orders/101/cancel");
    assert_eq!(
        effect
            .secret_headers
            .get("X-Shop-Token")
            .map(String::as_str),
        Some("SHOP_WEBHOOK_TOKEN")
    );
    assert_eq!(
        serde_json::from_str::<Value>(&effect.body).unwrap(),
        json!({"order_id": 101, "reason": "x"})
    );
    let check = svc
        .check_action(
            "order",
            "cancel",
            r#"{"order_id": 102, "reason": "x"}"#,
            "support",
        )
        .await
        .unwrap();
    assert_eq!(check.refusal, "precondition_failed");
    let check = svc
        .check_action(
            "order",
            "refund",
            r#"{"order_id": 102, "amount": 20}"#,
            "billing",
        )
        .await
        .unwrap();
    // No approval declared for 20, but this server does not run effects without a
    // decision (no --allow-auto-effects): the approval service must not run it at once.
    assert_eq!(check.approval_required, Some(true));
    let check = svc
        .check_action(
            "order",
            "cancel",
            r#"{"order_id": 101, "reason": "x"}"#,
            "viewer",
        )
        .await
        .unwrap();
    assert_eq!(check.refusal, "denied_role");
}

#[tokio::test]
async fn shop_tools_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let project = copy_project(dir.path());
    let url = format!("sqlite://{}", dir.path().join("shop.db").display());
    seed(&url, "seed.sqlite.sql").await;
    let svc = service(&project, &url, false).await;
    exercise(&svc).await;

    // No approval and no opt-in: refused, nothing stored or run.
    let r = call(
        &svc,
        "propose_order_refund",
        json!({"order_id": 102, "amount": 50}),
        &["billing"],
    )
    .await;
    assert_eq!(code(&r), "auto_effects_disabled", "{r}");
    // With the opt-in, an action that declares no approval for these arguments needs none.
    let auto = service(&project, &url, true).await;
    let check = auto
        .check_action(
            "order",
            "refund",
            r#"{"order_id": 102, "amount": 20}"#,
            "billing",
        )
        .await
        .unwrap();
    assert_eq!(check.approval_required, Some(false));
    // With the opt-in but no approval service reachable: a stable internal error.
    let r = call(
        &auto,
        "propose_order_refund",
        json!({"order_id": 102, "amount": 50}),
        &["billing"],
    )
    .await;
    assert_eq!(code(&r), "internal_error");
    let message = r["message"].as_str().unwrap();
    assert!(message.contains("no approval service configured"), "{r}");
    assert!(!message.contains("sqlite"));

    // An approval service that fails: the agent is told whether a retry is safe, and never
    // the service's own status text (here an address).
    for (status, amount, expected_code, says) in [
        (
            tonic::Code::Unavailable,
            500,
            "unavailable",
            "no proposal was stored; retry shortly",
        ),
        (
            tonic::Code::Unavailable,
            50,
            "internal_error",
            "its effect sent; do not retry",
        ),
        (
            tonic::Code::DeadlineExceeded,
            500,
            "internal_error",
            "waiting for a human; do not retry",
        ),
        (
            tonic::Code::InvalidArgument,
            500,
            "invalid_arguments",
            "role is too long; nothing was stored",
        ),
        (
            tonic::Code::Internal,
            500,
            "internal_error",
            "details are in the server log",
        ),
    ] {
        let sink = FailingApproval(status);
        let roles = ["billing".to_owned()];
        let args = json!({"order_id": 102, "amount": amount}).to_string();
        let r = auto
            .call_tool_with("propose_order_refund", &args, &roles, "test", Some(&sink))
            .await;
        assert_eq!(code(&r), expected_code, "{status:?}: {r}");
        let message = r["message"].as_str().unwrap();
        assert!(message.contains(says), "{status:?}: {r}");
        assert!(!message.contains("10.0.0.7"), "{status:?}: {r}");
    }
}

/// An approval service that answers every submit with one status.
struct FailingApproval(tonic::Code);

#[async_trait::async_trait]
impl kg_ontology::ProposalSink for FailingApproval {
    async fn submit(
        &self,
        _request: kg_proto::v1::SubmitProposalRequest,
    ) -> Result<kg_proto::v1::Proposal, tonic::Status> {
        let message = match self.0 {
            tonic::Code::InvalidArgument => "role is too long",
            _ => "transport error: connecting to 10.0.0.7:50061 refused",
        };
        Err(tonic::Status::new(self.0, message))
    }
}

/// Makes the server log every statement; the log's path and its length before the test's own.
async fn log_every_statement(url: &str, pg_dir: &Path) -> (PathBuf, usize) {
    let admin = kg_stores::sql::SqlStore::connect(url).await.unwrap();
    admin
        .pool()
        .execute("ALTER SYSTEM SET log_statement = 'all'")
        .await
        .unwrap();
    admin
        .pool()
        .execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    admin.close().await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let log_path = pg_dir.join("postgres.log");
    let before = std::fs::read_to_string(&log_path).unwrap_or_default().len();
    (log_path, before)
}

#[tokio::test]
async fn shop_tools_on_postgres_never_select_sensitive_columns() {
    let venv = find_venv().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pg_dir = dir.path().join("pg");
    let pg = EmbeddedPostgres::start(&venv, &pg_dir).await.unwrap();
    seed(&pg.url, "seed.postgres.sql").await;
    let (log_path, before) = log_every_statement(&pg.url, &pg_dir).await;

    let project = copy_project(dir.path());
    let svc = service(&project, &pg.url, false).await;
    exercise(&svc).await;

    let log = std::fs::read_to_string(&log_path).unwrap();
    let log = &log[before..];
    let statements: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("statement:") || l.contains("execute"))
        .collect();
    assert!(
        statements.iter().any(|l| l.contains("\"full_name\"")),
        "the log records our SELECTs:\n{log}"
    );
    for line in &statements {
        assert!(
            !line.to_ascii_lowercase().contains("email"),
            "a query named a sensitive column: {line}"
        );
    }
    // The source's properties are never read by traverse: its only SELECT on customers reads the key.
    assert!(
        statements
            .iter()
            .any(|l| l.contains("SELECT CAST(\"customer_id\" AS BIGINT) FROM \"customers\""))
    );
}

#[tokio::test]
async fn validate_reports_every_problem_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let project = copy_project(dir.path());
    let url = format!("sqlite://{}", dir.path().join("shop.db").display());
    seed(&url, "seed.sqlite.sql").await;
    let yaml = std::fs::read_to_string(project.join("ontology.yaml")).unwrap();
    let broken = yaml
        .replace("table: customers", "table: customerz")
        .replace("created_at: {type: string}\n    states:\n      cancelled", "created_at: {type: string}\n      discount: {type: number}\n    states:\n      cancelled")
        .replace("\"shipped_at IS NOT NULL\"", "\"shiped_at IS NOT NULL\"")
        .replace("policy: {roles: [support]}", "policy: {roles: [support, intern]}")
        .replace("approval: {when: \"amount > 100\"}", "approval: {when: \"total > 100\"}")
        .replace("/cancel\"", "/cancel/{{ note }}\"")
        .replace("    relations:\n      orders:\n", "    relations:\n      orders_x:\n")
        .replace("  order:\n", "  customer_orders:\n    table: orders\n    identity: [order_id]\n    properties: {order_id: {type: integer}}\n    relations: {x: {target: order, from: order_id}}\n  order:\n");
    std::fs::write(project.join("ontology.yaml"), broken).unwrap();
    let problems = kg_ontology::load_project(&project, Some(&url))
        .await
        .unwrap_err();
    let all = problems.join("\n");
    for needle in [
        "both generate the tool `traverse_customer_orders_x`",
        "unknown role `intern`",
        "`total` is not a declared parameter",
        "uses [\"note\"]",
        "table `customerz` does not exist",
        "has no column `discount`",
        "states.shipped",
    ] {
        assert!(all.contains(needle), "missing `{needle}` in:\n{all}");
    }
    assert!(problems.len() >= 7, "{all}");

    // The service refuses to start on a broken project and says why.
    let err = OntologyService::new(
        OntologyConfig {
            project_dir: Some(project.clone()),
            warehouse_url: Some(url.clone()),
            ..Default::default()
        },
        None,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("unknown role `intern`"));
}

#[tokio::test]
async fn reload_swaps_the_tool_set_and_bumps_the_version() {
    let dir = tempfile::tempdir().unwrap();
    let project = copy_project(dir.path());
    let url = format!("sqlite://{}", dir.path().join("shop.db").display());
    seed(&url, "seed.sqlite.sql").await;
    let svc = service(&project, &url, false).await;
    let mut rx = svc.subscribe();
    let v1 = *rx.borrow_and_update();
    let yaml = std::fs::read_to_string(project.join("ontology.yaml")).unwrap();
    std::fs::write(
        project.join("ontology.yaml"),
        yaml.replace("roles: [support, billing]", "roles: [billing]"),
    )
    .unwrap();
    svc.reload().await.unwrap();
    assert!(rx.has_changed().unwrap());
    assert_ne!(*rx.borrow_and_update(), v1);
    let (tools, _) = svc.tools_for(&["support".to_owned()]);
    assert!(!tools.iter().any(|t| t.name == "propose_order_refund"));

    // A broken edit keeps the previous tool set in service.
    std::fs::write(project.join("ontology.yaml"), "name: x\nobjects: {}\n").unwrap();
    assert!(svc.reload().await.is_err());
    assert!(
        svc.tools_for(&[])
            .0
            .iter()
            .any(|t| t.name == "get_customer")
    );
}

/// Keys that PostgreSQL does not compare with text as they are: a uuid identity, and an
/// enum that is both an identity and a relation's key, in a schema of their own.
const FLEET_PROJECT: &str = r#"
name: fleet
warehouse: {url: "sqlite://unused.db"}
roles: [ops]
objects:
  device:
    table: fleet.devices
    identity: [device_id]
    properties:
      device_id: {type: string}
      region: {type: string}
      label: {type: string}
    relations:
      home: {target: region, from: region, to: region}
  region:
    table: fleet.regions
    identity: [region]
    properties:
      region: {type: string}
      name: {type: string}
"#;

const FLEET_SQL: &str = "
CREATE SCHEMA fleet;
CREATE TYPE fleet.region_code AS ENUM ('eu', 'us');
CREATE TABLE fleet.regions (region fleet.region_code PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE fleet.devices (
  device_id UUID PRIMARY KEY,
  region fleet.region_code NOT NULL REFERENCES fleet.regions,
  label TEXT NOT NULL
);
INSERT INTO fleet.regions VALUES ('eu', 'Europe'), ('us', 'United States');
INSERT INTO fleet.devices VALUES ('0b8f6c1e-4a7d-4f0e-9a55-3c2d1e0f9a11', 'eu', 'press 4');
";

#[tokio::test]
async fn uuid_and_enum_keys_on_postgres_are_looked_up_by_their_own_type() {
    let venv = find_venv().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pg_dir = dir.path().join("pg");
    let pg = EmbeddedPostgres::start(&venv, &pg_dir).await.unwrap();
    let admin = kg_stores::sql::SqlStore::connect(&pg.url).await.unwrap();
    admin
        .pool()
        .execute(sqlx::raw_sql(FLEET_SQL))
        .await
        .unwrap();
    admin.close().await;
    let (log_path, before) = log_every_statement(&pg.url, &pg_dir).await;
    let project = dir.path().join("fleet");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("ontology.yaml"), FLEET_PROJECT).unwrap();
    let svc = service(&project, &pg.url, false).await;
    let device = "0b8f6c1e-4a7d-4f0e-9a55-3c2d1e0f9a11";

    let r = call(&svc, "get_device", json!({"device_id": device}), &[]).await;
    assert_eq!(r["rows"][0]["device_id"], device, "{r}");
    assert_eq!(r["rows"][0]["region"], "eu", "{r}");
    // What a tool showed is what it takes back: the uuid in upper case is the same uuid.
    let r = call(
        &svc,
        "get_device",
        json!({"device_id": device.to_uppercase()}),
        &[],
    )
    .await;
    assert_eq!(r["rows"][0]["label"], "press 4", "{r}");
    let r = call(
        &svc,
        "get_device",
        json!({"device_id": "0b8f6c1e-4a7d-4f0e-9a55-3c2d1e0f9a12"}),
        &[],
    )
    .await;
    assert_eq!(code(&r), "not_found", "{r}");
    let r = call(&svc, "get_device", json!({"device_id": "press-4"}), &[]).await;
    assert_eq!(code(&r), "invalid_arguments", "{r}");
    assert!(r["message"].as_str().unwrap().contains("uuid"), "{r}");
    assert!(!r["message"].as_str().unwrap().contains("press-4"), "{r}");

    let r = call(
        &svc,
        "traverse_device_home",
        json!({"device_id": device}),
        &[],
    )
    .await;
    assert_eq!(r["rows"][0]["name"], "Europe", "{r}");
    let r = call(&svc, "get_region", json!({"region": "us"}), &[]).await;
    assert_eq!(r["rows"][0]["name"], "United States", "{r}");
    let r = call(&svc, "get_region", json!({"region": "mars"}), &[]).await;
    assert_eq!(code(&r), "invalid_arguments", "{r}");

    // The value takes the column's type, so the primary keys' indexes serve the lookups.
    let log = std::fs::read_to_string(&log_path).unwrap();
    let log = &log[before..];
    assert!(
        log.contains("WHERE \"device_id\" = CAST($1 AS uuid)"),
        "the uuid lookup casts the value, not the column:\n{log}"
    );
    assert!(
        log.contains("WHERE \"region\" = CAST($1 AS fleet.region_code)"),
        "the enum lookup casts the value to the enum:\n{log}"
    );
}

/// Descriptions in the project file reach the model as tool descriptions: hidden characters
/// are stripped from them and from the schemas, as from stored text.
#[tokio::test]
async fn tool_descriptions_are_sanitised() {
    let dir = tempfile::tempdir().unwrap();
    let project = copy_project(dir.path());
    let url = format!("sqlite://{}", dir.path().join("shop.db").display());
    seed(&url, "seed.sqlite.sql").await;
    let yaml = std::fs::read_to_string(project.join("ontology.yaml")).unwrap();
    let hidden = yaml
        .replace(
            "description: A person who has ordered from the shop.",
            "description: \"A person\\u202E who has\\U000E0041 ordered\\u200B from the shop.\"",
        )
        .replace(
            "description: Amount to refund in EUR.",
            "description: \"Amount\\uFE0F to refund\\u2066 in EUR.\"",
        );
    assert_ne!(hidden, yaml);
    std::fs::write(project.join("ontology.yaml"), hidden).unwrap();
    let svc = service(&project, &url, false).await;
    let (tools, _) = svc.tools_for(&["billing".to_owned()]);
    let get = tools.iter().find(|t| t.name == "get_customer").unwrap();
    assert!(
        get.description
            .contains("A person who has ordered from the shop."),
        "{}",
        get.description
    );
    let refund = tools
        .iter()
        .find(|t| t.name == "propose_order_refund")
        .unwrap();
    assert!(
        refund
            .input_schema_json
            .contains("Amount to refund in EUR."),
        "{}",
        refund.input_schema_json
    );
    for t in &tools {
        for text in [&t.description, &t.input_schema_json, &t.output_schema_json] {
            assert!(
                !text.chars().any(|c| matches!(
                    c,
                    '\u{202E}' | '\u{E0041}' | '\u{200B}' | '\u{FE0F}' | '\u{2066}'
                )),
                "{}: {text}",
                t.name
            );
        }
    }
}

/// A warehouse that fails mid-service (here a table dropped under it) answers every tool
/// with one stable message: no SQL, no driver text, no path reaches the model.
#[tokio::test]
async fn a_failing_warehouse_tells_the_model_nothing_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let project = copy_project(dir.path());
    let db = dir.path().join("shop.db");
    let url = format!("sqlite://{}", db.display());
    seed(&url, "seed.sqlite.sql").await;
    let svc = service(&project, &url, false).await;
    assert_eq!(
        call(&svc, "get_order", json!({"order_id": 101}), &[]).await["rows"][0]["state"],
        "pending"
    );

    // A long value comes back capped at the warehouse field cap (2000 characters, then "…").
    let store = kg_stores::sql::SqlStore::connect(&url).await.unwrap();
    store
        .pool()
        .execute(AssertSqlSafe(format!(
            "UPDATE customers SET full_name = '{}' WHERE customer_id = 1",
            "n".repeat(5_000)
        )))
        .await
        .unwrap();
    let ada = call(&svc, "get_customer", json!({"customer_id": 1}), &[]).await;
    let name = ada["rows"][0]["full_name"].as_str().unwrap();
    assert_eq!(name.chars().count(), 2_001, "{}", &name[..40]);
    assert!(name.ends_with('…'));

    store.pool().execute("DROP TABLE orders").await.unwrap();
    store.close().await;
    for (tool, args, roles) in [
        ("get_order", json!({"order_id": 101}), &[][..]),
        ("list_order", json!({"state": "pending"}), &[][..]),
        (
            "traverse_customer_orders",
            json!({"customer_id": 1}),
            &[][..],
        ),
        (
            "propose_order_cancel",
            json!({"order_id": 101, "reason": "x"}),
            &["support"][..],
        ),
    ] {
        let r = call(&svc, tool, args, roles).await;
        assert_eq!(code(&r), "internal_error", "{tool}: {r}");
        assert_eq!(
            r["message"], "internal error; the details are in the server log",
            "{tool}: {r}"
        );
        let text = r.to_string().to_ascii_lowercase();
        for leak in ["no such table", "select", "sqlite", "shop.db", "orders"] {
            assert!(!text.contains(leak), "{tool} said {leak:?}: {r}");
        }
    }
}
