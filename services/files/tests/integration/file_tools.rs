//! kg_files (`FindFiles`) and kg_file (`QueryFile`) against a real SQLite
//! registry, a real blob directory and a real NATS (uploads publish events).
use std::collections::BTreeSet;
use std::time::Duration;

use kg_common::caller::now_ms;
use kg_common::{ErrorCode, ErrorExt as _};
use kg_files::{FilesError, FilesService, QueryLimits};
use kg_proto::v1::query_file_request::Selector;
use kg_proto::v1::{
    AccessFilter, CallerContext, FindFilesRequest, FindFilesResponse, Permission, QueryFileRequest,
    QueryFileResponse,
};
use serde_json::{Value, json};

use crate::common::{Env, env_with};

const NS: &str = "tools";

const HOLDINGS: &str = "\u{feff}Ticker,\"Market Value (AUD)\",Shares,Trade Date,Sector,Note\n\
BHP,15234.50,120,2024-01-15,Materials,\"core, long-term\"\n\
CBA,30210.00,250,2024-02-01,Financials,\n\
CSL,9800.25,40,2024-03-10,Health Care,\"multi\nline note\"\n\
WES,7200.00,150,2024-03-11,Consumer\n\
FMG,4100.75,300,2024-04-02,Materials,ok,EXTRA\n\
NAB,12000.00,400,2024-04-20,Financials,\n\
TLS,3000.10,1000,2024-05-05,Telecom,\"said \"\"hi\"\"\"\n";

const PEOPLE: &str = "name\tage\tjoined\tteam\nAda\t36\t2023-05-01\tplatform\nGrace\t45\t2021-11-20\tdata\nLinus\t29\t2024-02-29\tplatform\n";

const APP_JSON: &str = r#"{
  "service": "billing",
  "owners": [{"name": "Ada", "role": "lead"}, {"name": "Grace", "role": "dev"}],
  "limits": {"rps": 250, "burst": {"size": 40, "window": "10s"}},
  "regions": [
    {"id": "eu-west", "replicas": 3, "tags": ["primary"]},
    {"id": "us-east", "replicas": 2, "tags": []},
    {"id": "ap-south", "replicas": 1, "tags": ["edge", "beta"]}
  ]
}"#;

const RUNBOOK: &str = "# Database runbook\n\n## Failover\n\nPromote the replica with `pg_ctl promote`.\nThen update DNS.\n\n## Backups\n\nNightly at 02:00 UTC. Restore drills monthly.\nFailover drills quarterly.\n";

async fn env() -> Env {
    env_with(false, 64 << 20).await
}

fn caller(filter: AccessFilter) -> CallerContext {
    let now = now_ms();
    CallerContext {
        principal_id: "tester".into(),
        access: vec![AccessFilter {
            namespace: NS.into(),
            ..filter
        }],
        issued_at_ms: now,
        expires_at_ms: now + 3_600_000,
        ..Default::default()
    }
}

fn admin() -> CallerContext {
    let mut c = caller(AccessFilter {
        allow_prefixes: vec![String::new()],
        permission: Permission::Admin as i32,
        write_prefixes: vec![String::new()],
        admin_prefixes: vec![String::new()],
        enabled_only: true,
        ..Default::default()
    });
    c.is_admin = true;
    c
}

/// A reader of everything except `handbook/private/`, as auth would mint it.
fn reader() -> CallerContext {
    caller(AccessFilter {
        allow_prefixes: vec![String::new()],
        deny_prefixes: vec!["handbook/private/".into()],
        permission: Permission::Read as i32,
        enabled_only: true,
        visible_only: true,
        ..Default::default()
    })
}

async fn put(files: &FilesService, path: &str, content: &[u8]) -> String {
    let up = files.upload(&admin(), NS, path, content, "").await.unwrap();
    up.file.unwrap().file_id
}

fn by_path(path: &str, format: &str, query: &str) -> QueryFileRequest {
    QueryFileRequest {
        namespace: NS.into(),
        selector: Some(Selector::Path(path.into())),
        format: format.into(),
        query: query.into(),
        ..Default::default()
    }
}

async fn query(
    files: &FilesService,
    who: &CallerContext,
    request: QueryFileRequest,
) -> (QueryFileResponse, Value) {
    let response = files
        .query_file(who, &request)
        .await
        .unwrap_or_else(|e| panic!("{request:?}: {e}"));
    let value: Value = serde_json::from_str(&response.result_json).unwrap();
    (response, value)
}

async fn query_err(
    files: &FilesService,
    who: &CallerContext,
    request: QueryFileRequest,
) -> FilesError {
    match files.query_file(who, &request).await {
        Ok(r) => panic!("{request:?} should fail, got {}", r.result_json),
        Err(e) => e,
    }
}

async fn seed(files: &FilesService) {
    put(files, "data/holdings.csv", HOLDINGS.as_bytes()).await;
    put(files, "data/people.tsv", PEOPLE.as_bytes()).await;
    put(files, "config/app.json", APP_JSON.as_bytes()).await;
    put(files, "config/broken.json", b"{\n  \"a\": 1,\n  \"b\": \n}").await;
    put(files, "handbook/ops/runbook.md", RUNBOOK.as_bytes()).await;
    put(
        files,
        "handbook/intro.md",
        b"# Intro\n\nWelcome. See the runbook for failover.\n",
    )
    .await;
    put(
        files,
        "handbook/private/salaries.csv",
        b"name,salary\nAda,100\n",
    )
    .await;
    put(
        files,
        "assets/logo.png",
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR failover",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_and_tsv_metadata_and_sql() {
    let env = env().await;
    let files = &env.files;
    seed(files).await;
    let who = reader();

    // Metadata: size, mime, status, header names and the inferred types.
    let (r, v) = query(files, &who, by_path("data/holdings.csv", "", "")).await;
    assert_eq!(v["size"], HOLDINGS.len());
    assert_eq!(v["mime"], "text/csv");
    assert_eq!(v["status"], "pending");
    assert_eq!(v["tooLarge"], false);
    let columns = json!([
        "Ticker",
        "Market Value (AUD)",
        "Shares",
        "Trade Date",
        "Sector",
        "Note"
    ]);
    assert_eq!(v["columns"], columns);
    assert_eq!(
        v["columnTypes"],
        json!(["VARCHAR", "DOUBLE", "BIGINT", "DATE", "VARCHAR", "VARCHAR"])
    );
    // The rows SQL will leave out are told before any query.
    assert_eq!(v["malformedRows"], 2);
    assert_eq!(json!(r.columns), columns);

    // A grouped aggregate over a quoted header; malformed rows skipped and counted.
    let (r, v) = query(
        files,
        &who,
        by_path(
            "data/holdings.csv",
            "sql",
            "SELECT Sector, SUM(\"Market Value (AUD)\") AS total, COUNT(*) AS n FROM data GROUP BY Sector ORDER BY total DESC",
        ),
    )
    .await;
    assert_eq!(r.format, "sql");
    assert_eq!(v["columns"], json!(["Sector", "total", "n"]));
    assert_eq!(v["types"], json!(["VARCHAR", "DOUBLE", "BIGINT"]));
    assert_eq!(v["malformedRows"], 2);
    assert_eq!(v["rowCount"], 4);
    assert!(v.get("cellsCut").is_none());
    assert_eq!(v["truncated"], false);
    assert_eq!(v["rows"][0], json!(["Financials", 42210.0, 2]));
    assert_eq!(v["rows"][1], json!(["Materials", 15234.5, 1]));
    // A text cell past 65,536 characters is cut (ending in …) and counted, so a cut value
    // is not taken for a whole one.
    let (_, v) = query(
        files,
        &who,
        by_path(
            "data/holdings.csv",
            "sql",
            "SELECT repeat('x', 70000) AS long, 'short' AS short FROM data LIMIT 2",
        ),
    )
    .await;
    assert_eq!(v["cellsCut"], 2);
    assert_eq!(v["truncated"], false);
    let long = v["rows"][0][0].as_str().unwrap();
    assert!(
        long.ends_with('…') && long.chars().count() == 65_537,
        "{}",
        long.len()
    );
    assert_eq!(json!(r.columns), columns);

    // Dates compare as dates and come back as ISO strings; quoted newlines survive.
    let (_, v) = query(
        files,
        &who,
        by_path(
            "data/holdings.csv",
            "sql",
            "WITH recent AS (SELECT * FROM data WHERE \"Trade Date\" >= DATE '2024-03-01') \
             SELECT Ticker, \"Trade Date\", Note, Shares * 2 AS doubled FROM recent ORDER BY \"Trade Date\"",
        ),
    )
    .await;
    assert_eq!(
        v["rows"],
        json!([
            ["CSL", "2024-03-10", "multi\nline note", 80],
            ["NAB", "2024-04-20", null, 800],
            ["TLS", "2024-05-05", "said \"hi\"", 2000]
        ])
    );

    // Row cap.
    let mut capped = by_path(
        "data/holdings.csv",
        "sql",
        "SELECT Ticker FROM data ORDER BY Ticker",
    );
    capped.max_rows = 2;
    let (r, v) = query(files, &who, capped).await;
    assert_eq!(v["rowCount"], 2);
    assert_eq!(v["truncated"], true);
    assert!(r.truncated);
    assert_eq!(v["rows"], json!([["BHP"], ["CBA"]]));
    let mut over = by_path("data/holdings.csv", "sql", "SELECT 1");
    over.max_rows = 1001;
    assert_eq!(
        query_err(files, &who, over).await.code(),
        ErrorCode::InvalidArgument
    );

    // TSV: columns, types and a query.
    let (_, v) = query(files, &who, by_path("data/people.tsv", "", "")).await;
    assert_eq!(v["columns"], json!(["name", "age", "joined", "team"]));
    assert_eq!(
        v["columnTypes"],
        json!(["VARCHAR", "BIGINT", "DATE", "VARCHAR"])
    );
    let (_, v) = query(
        files,
        &who,
        by_path(
            "data/people.tsv",
            "sql",
            "SELECT team, AVG(age) AS avg_age FROM data GROUP BY team ORDER BY team",
        ),
    )
    .await;
    assert_eq!(v["rows"], json!([["data", 45.0], ["platform", 32.5]]));
    assert!(v.get("malformedRows").is_none());

    // Errors, each with a stable code and a clear message.
    let err = query_err(
        files,
        &who,
        by_path("data/holdings.csv", "sql", "SELECT Ticker FROM data WHERE"),
    )
    .await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().starts_with("invalid SQL:"), "{err}");
    assert!(err.to_string().contains("Line: 1, Column:"), "{err}");
    let err = query_err(
        files,
        &who,
        by_path("data/holdings.csv", "sql", "SELECT Ticker FORM data"),
    )
    .await;
    assert!(err.to_string().contains("Line: 1, Column: 20"), "{err}");
    for (sql, needle) in [
        ("SELECT 1; SELECT 2", "exactly one"),
        ("DROP TABLE data", "DROP TABLE"),
        ("CREATE TABLE t AS SELECT * FROM data", "CREATE TABLE"),
        ("COPY data TO '/tmp/out.csv'", "COPY"),
        ("INSERT INTO data VALUES ('x')", "INSERT"),
        ("SET datafusion.execution.batch_size = 1", "SET"),
        ("EXPLAIN ANALYZE SELECT * FROM data", "EXPLAIN"),
        (
            "CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '/etc/passwd'",
            "CREATE EXTERNAL TABLE",
        ),
        ("SELECT * FROM read_csv('/etc/passwd')", "table functions"),
        ("SELECT * FROM '/etc/passwd'", "only the table"),
        ("SELECT * FROM information_schema.tables", "only the table"),
    ] {
        let err = query_err(files, &who, by_path("data/holdings.csv", "sql", sql)).await;
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{sql}");
        assert!(err.to_string().contains(needle), "{sql}: {err}");
    }
    let err = query_err(
        files,
        &who,
        by_path("data/holdings.csv", "sql", "SELECT nope FROM data"),
    )
    .await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("nope"), "{err}");
    // A header in other case: the engine's hint to quote it stays, its advice to change an
    // engine setting (which the caller cannot) goes.
    let err = query_err(
        files,
        &who,
        by_path("data/holdings.csv", "sql", "SELECT ticker FROM data"),
    )
    .await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(!err.to_string().contains("datafusion."), "{err}");
    let err = query_err(files, &who, by_path("handbook/intro.md", "sql", "SELECT 1")).await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert_eq!(
        err.to_string(),
        "format sql needs a CSV or TSV file; this file is text/markdown"
    );
    let err = query_err(files, &who, by_path("data/holdings.csv", "sql", "")).await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_time_limit_stops_a_runaway_statement() {
    let env = env().await;
    put(&env.files, "data/small.csv", b"k,v\n1,10\n2,20\n").await;
    let tight = env
        .files
        .clone()
        .with_query_limits(QueryLimits {
            sql_timeout: Duration::from_millis(500),
            ..QueryLimits::default()
        })
        .unwrap();
    // A recursive CTE that never ends: the time limit stops and cancels it.
    let started = std::time::Instant::now();
    let err = query_err(
        &tight,
        &admin(),
        by_path(
            "data/small.csv",
            "sql",
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r",
        ),
    )
    .await;
    assert_eq!(err.code(), ErrorCode::Timeout, "{err}");
    assert_eq!(
        err.to_string(),
        "the SQL statement ran past its time limit of 500ms; filter or aggregate more"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // The cancelled statement no longer holds the engine.
    let (_, v) = query(
        &tight,
        &admin(),
        by_path("data/small.csv", "sql", "SELECT SUM(v) AS s FROM data"),
    )
    .await;
    assert_eq!(v["rows"], json!([[30]]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_joins_that_multiply_rows_are_stopped_or_refused_and_free_the_engine() {
    let env = env().await;
    let mut csv = String::from("k,g\n");
    for i in 0..3000 {
        csv.push_str(&format!("{i},1\n"));
    }
    put(&env.files, "data/wide.csv", csv.as_bytes()).await;
    let tight = env
        .files
        .clone()
        .with_query_limits(QueryLimits {
            sql_timeout: Duration::from_millis(500),
            ..QueryLimits::default()
        })
        .unwrap();
    let run = |sql: &'static str| {
        let tight = tight.clone();
        async move { query_err(&tight, &admin(), by_path("data/wide.csv", "sql", sql)).await }
    };
    // Without an equality condition a self-join is a cross or nested-loop join: billions of
    // rows from a few thousand, which no time limit could stop (the engine's join loop does
    // not yield), so it is refused before it runs.
    for sql in [
        "SELECT count(*) FROM data a, data b, data c",
        "SELECT count(*) FROM data a JOIN data b ON a.k <> b.k",
        "SELECT count(*) FROM data a CROSS JOIN data b",
    ] {
        let err = run(sql).await;
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{sql}: {err}");
        assert!(
            err.to_string().contains("without an equality condition"),
            "{sql}: {err}"
        );
    }
    // A join with a one-row side (a scalar subquery) is no product: it runs.
    let (_, v) = query(
        &tight,
        &admin(),
        by_path(
            "data/wide.csv",
            "sql",
            "SELECT COUNT(*) AS n FROM data WHERE k > (SELECT AVG(k) FROM data)",
        ),
    )
    .await;
    assert_eq!(v["rows"], json!([[1500]]));
    let (_, v) = query(
        &tight,
        &admin(),
        by_path(
            "data/wide.csv",
            "sql",
            "SELECT a.k, m.top FROM data a, (SELECT MAX(k) AS top FROM data) m WHERE a.k = 7",
        ),
    )
    .await;
    assert_eq!(v["rows"], json!([[7, 2999]]));
    // An equi-join that multiplies rows runs until the time limit, and stops there.
    for _ in 0..3 {
        let err =
            run("SELECT count(*) FROM data a JOIN data b ON a.g = b.g JOIN data c ON b.g = c.g")
                .await;
        assert_eq!(err.code(), ErrorCode::Timeout, "{err}");
    }
    // Every slot comes free again: a small statement runs. A stopped statement holds its slot
    // until the engine's work on it has ended, and meanwhile a statement is answered "busy,
    // retry shortly"; a slot never given back would answer that for ever. No timing is
    // asserted beyond that: a loaded CI machine may be slow.
    let small = by_path("data/wide.csv", "sql", "SELECT COUNT(*) AS n FROM data");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let response = loop {
        match tight.query_file(&admin(), &small).await {
            Err(err) if err.code() == ErrorCode::Busy && std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answered => break answered.unwrap_or_else(|e| panic!("{small:?}: {e}")),
        }
    };
    let v: Value = serde_json::from_str(&response.result_json).unwrap();
    assert_eq!(v["rows"], json!([[3000]]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_json_and_large_files() {
    let env = env().await;
    let files = &env.files;
    seed(files).await;
    let who = reader();

    // Regex over a Markdown file: line numbers, cap, total.
    let (_, v) = query(
        files,
        &who,
        by_path("handbook/ops/runbook.md", "text", "(?i)failover"),
    )
    .await;
    assert_eq!(v["totalMatches"], 2);
    assert_eq!(v["truncated"], false);
    assert_eq!(
        v["matches"][0],
        json!({"lineNumber": 3, "line": "## Failover"})
    );
    assert_eq!(
        v["matches"][1],
        json!({"lineNumber": 11, "line": "Failover drills quarterly."})
    );
    let mut one = by_path("handbook/ops/runbook.md", "text", "(?i)failover");
    one.max_rows = 1;
    let (r, v) = query(files, &who, one).await;
    assert_eq!(v["matches"].as_array().unwrap().len(), 1);
    assert_eq!(v["truncated"], true);
    assert!(r.truncated);
    // Text works on CSV and JSON too.
    let (_, v) = query(files, &who, by_path("data/holdings.csv", "text", "^NAB,")).await;
    assert_eq!(v["matches"][0]["lineNumber"], 8);
    let (_, v) = query(files, &who, by_path("config/app.json", "text", "replicas")).await;
    assert_eq!(v["totalMatches"], 3);

    // Line windows (1-based, inclusive; the end clamps at EOF).
    let mut window = by_path("handbook/ops/runbook.md", "text", "");
    window.start_line = Some(3);
    window.end_line = Some(5);
    let (_, v) = query(files, &who, window.clone()).await;
    assert_eq!(
        v,
        json!({"startLine": 3, "endLine": 5, "totalLines": 11, "lines": [
            {"lineNumber": 3, "line": "## Failover"},
            {"lineNumber": 4, "line": ""},
            {"lineNumber": 5, "line": "Promote the replica with `pg_ctl promote`."}
        ]})
    );
    window.start_line = Some(10);
    window.end_line = Some(500);
    let (_, v) = query(files, &who, window.clone()).await;
    assert_eq!(v["endLine"], 11);
    window.start_line = Some(1);
    window.end_line = Some(2001);
    assert_eq!(
        query_err(files, &who, window.clone()).await.code(),
        ErrorCode::InvalidArgument
    );
    window.query = "x".into();
    window.end_line = Some(2);
    assert_eq!(
        query_err(files, &who, window).await.code(),
        ErrorCode::InvalidArgument
    );

    // Regex errors: invalid is invalid_argument, too costly is resource_exhausted.
    let err = query_err(files, &who, by_path("handbook/intro.md", "text", "a(b")).await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = query_err(
        files,
        &who,
        by_path("handbook/intro.md", "text", r"(\w{200}){200}"),
    )
    .await;
    assert_eq!(err.code(), ErrorCode::ResourceExhausted);
    assert!(err.to_string().contains("too costly"), "{err}");
    let err = query_err(files, &who, by_path("assets/logo.png", "text", "IHDR")).await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("binary"), "{err}");

    // JSONPath (RFC 9535 filter), JSONata and Jinja over nested JSON.
    let (r, v) = query(
        files,
        &who,
        by_path(
            "config/app.json",
            "jsonpath",
            "$.regions[?@.replicas >= 2].id",
        ),
    )
    .await;
    assert_eq!(v, json!({"result": ["eu-west", "us-east"]}));
    assert_eq!(r.format, "jsonpath");
    let (_, v) = query(
        files,
        &who,
        by_path("config/app.json", "jsonpath", "$..tags[*]"),
    )
    .await;
    assert_eq!(v, json!({"result": ["primary", "edge", "beta"]}));
    let (_, v) = query(
        files,
        &who,
        by_path(
            "config/app.json",
            "jsonata",
            "{\"total\": $sum(regions.replicas), \"lead\": owners[role='lead'].name}",
        ),
    )
    .await;
    assert_eq!(v, json!({"result": {"total": 6, "lead": "Ada"}}));
    let (_, v) = query(
        files,
        &who,
        by_path(
            "config/app.json",
            "jinja",
            "{{ data.service }}:{% for r in data.regions %} {{ r.id }}={{ r.replicas }}{% endfor %} <{{ data.limits.burst.window }}>",
        ),
    )
    .await;
    assert_eq!(
        v,
        json!({"result": "billing: eu-west=3 us-east=2 ap-south=1 <10s>"})
    );
    let err = query_err(
        files,
        &who,
        by_path("config/app.json", "jsonpath", "$.regions["),
    )
    .await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = query_err(files, &who, by_path("config/app.json", "jinja", "{% for x in range(1000) %}{% for y in range(1000) %}{% for z in range(10) %}{% endfor %}{% endfor %}{% endfor %}")).await;
    assert_eq!(err.code(), ErrorCode::ResourceExhausted, "{err}");
    let err = query_err(files, &who, by_path("config/broken.json", "jsonata", "a")).await;
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    assert!(
        err.to_string().starts_with("the file is not valid JSON:"),
        "{err}"
    );
    assert!(err.to_string().contains("line 4"), "{err}");
    let err = query_err(files, &who, by_path("data/holdings.csv", "jsonpath", "$")).await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("needs a JSON file"), "{err}");
    let err = query_err(files, &who, by_path("config/app.json", "yaml", "x")).await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);

    // A 12 MiB text file: metadata says tooLarge; only a text line window reads it.
    let mut big = String::with_capacity(12 << 20);
    let mut lines = 0u64;
    while big.len() < (12 << 20) {
        lines += 1;
        big.push_str(&format!("line {lines:07} of the large log, status=ok\n"));
    }
    let big_id = put(files, "logs/big.txt", big.as_bytes()).await;
    let (_, v) = query(files, &who, by_path("logs/big.txt", "", "")).await;
    assert_eq!(v["tooLarge"], true);
    assert_eq!(v["size"], big.len());
    let err = query_err(files, &who, by_path("logs/big.txt", "text", "status")).await;
    assert_eq!(err.code(), ErrorCode::PayloadTooLarge);
    assert!(err.to_string().contains("startLine/endLine"), "{err}");
    assert!(err.to_string().contains(&big.len().to_string()), "{err}");
    let mut window = by_path("logs/big.txt", "text", "");
    window.selector = Some(Selector::FileId(big_id));
    window.start_line = Some(lines as i64 - 1);
    window.end_line = Some(lines as i64 + 5);
    let (_, v) = query(files, &who, window).await;
    assert_eq!(v["totalLines"], lines);
    assert_eq!(v["endLine"], lines);
    assert_eq!(
        v["lines"][1]["line"],
        format!("line {lines:07} of the large log, status=ok")
    );
    // Large CSV and JSON refuse their formats the same way.
    let mut big_csv = String::from("a,b\n");
    while big_csv.len() < (11 << 20) {
        big_csv.push_str("12345678,abcdefgh\n");
    }
    put(files, "data/huge.csv", big_csv.as_bytes()).await;
    let (r, v) = query(files, &who, by_path("data/huge.csv", "", "")).await;
    assert_eq!(v["tooLarge"], true);
    assert_eq!(v["columns"], json!(["a", "b"]));
    assert!(v.get("columnTypes").is_none());
    assert_eq!(r.columns, vec!["a", "b"]);
    let err = query_err(
        files,
        &who,
        by_path("data/huge.csv", "sql", "SELECT COUNT(*) FROM data"),
    )
    .await;
    assert_eq!(err.code(), ErrorCode::PayloadTooLarge);

    // A chat reference maps to namespace and path.
    let (_, v) = query(
        files,
        &who,
        by_path(&format!("@kg:{NS}/data/people.tsv"), "", ""),
    )
    .await;
    assert_eq!(v["columns"][0], "name");
    let err = query_err(
        files,
        &who,
        by_path("@kg:elsewhere/data/people.tsv", "", ""),
    )
    .await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_files_behave_like_missing_ones() {
    let env = env().await;
    let files = &env.files;
    seed(files).await;
    let who = reader();
    let private_id = files
        .get_file(&admin(), NS, Some("handbook/private/salaries.csv"), None)
        .await
        .unwrap()
        .file_id;
    let disabled_id = put(files, "handbook/old.md", b"# Old\nfailover notes\n").await;
    files
        .set_flags(&admin(), NS, &disabled_id, Some(false), None)
        .await
        .unwrap();

    for format in ["", "sql", "text", "jsonpath"] {
        let query_text = if format.is_empty() { "" } else { "x" };
        for (unreadable, missing) in [
            (
                "handbook/private/salaries.csv",
                "handbook/private/nothing.csv",
            ),
            ("handbook/old.md", "handbook/never.md"),
        ] {
            let denied = query_err(files, &who, by_path(unreadable, format, query_text)).await;
            let absent = query_err(files, &who, by_path(missing, format, query_text)).await;
            assert_eq!(denied.code(), ErrorCode::NotFound, "{format} {unreadable}");
            assert_eq!(absent.code(), ErrorCode::NotFound);
            assert_eq!(
                denied.to_string(),
                format!("file not found: {NS}/{unreadable}")
            );
            assert_eq!(
                absent.to_string(),
                format!("file not found: {NS}/{missing}")
            );
        }
        for (unreadable, missing) in [
            (&private_id, "0190aaaa-0000-7000-8000-000000000000"),
            (&disabled_id, "nope"),
        ] {
            let mut request = by_path("", format, query_text);
            request.selector = Some(Selector::FileId(unreadable.clone()));
            let denied = query_err(files, &who, request.clone()).await;
            request.selector = Some(Selector::FileId(missing.into()));
            let absent = query_err(files, &who, request).await;
            assert_eq!(denied.code(), absent.code());
            assert_eq!(
                denied.to_string(),
                format!("file not found: {NS}/{unreadable}")
            );
            assert_eq!(
                absent.to_string(),
                format!("file not found: {NS}/{missing}")
            );
        }
    }
    // The admin reads the private file.
    let (_, v) = query(
        files,
        &admin(),
        by_path("handbook/private/salaries.csv", "", ""),
    )
    .await;
    assert_eq!(v["columns"], json!(["name", "salary"]));

    // FindFiles: never listed, never counted, never scanned.
    let find = |pattern: &str, name: &str| FindFilesRequest {
        namespace: NS.into(),
        folder_prefix: "handbook/".into(),
        name: name.into(),
        pattern: pattern.into(),
        ..Default::default()
    };
    let page = files.find_files(&who, &find("", "")).await.unwrap();
    assert_eq!(
        paths(&page),
        ["handbook/intro.md", "handbook/ops/runbook.md"]
    );
    assert_eq!(page.total, 2);
    let page = files
        .find_files(&who, &find("", "*salaries*"))
        .await
        .unwrap();
    assert!(page.files.is_empty());
    assert_eq!(page.total, 0);
    let page = files
        .find_files(&who, &find("(?i)failover|salary|Ada", ""))
        .await
        .unwrap();
    assert_eq!(
        paths(&page),
        ["handbook/intro.md", "handbook/ops/runbook.md"]
    );
    let page = files.find_files(&admin(), &find("", "")).await.unwrap();
    assert_eq!(page.total, 3, "{:?}", paths(&page));

    // No access to the namespace at all: permission_denied, for both RPCs.
    let stranger = CallerContext {
        access: vec![],
        ..reader()
    };
    let err = files
        .find_files(&stranger, &find("", ""))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    let err = query_err(files, &stranger, by_path("handbook/intro.md", "", "")).await;
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
}

fn paths(page: &FindFilesResponse) -> Vec<String> {
    page.files
        .iter()
        .map(|f| f.file.as_ref().unwrap().path.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_files_pages_globs_hidden_and_budgets() {
    let env = env().await;
    let files = &env.files;
    seed(files).await;
    for i in 0..12 {
        let body = if i % 2 == 0 {
            format!("# Note {i}\n\nnothing here\nthe deploy token is tok{i:02}\n")
        } else {
            format!("# Note {i}\n\nplain text only\n")
        };
        put(files, &format!("notes/n{i:02}.md"), body.as_bytes()).await;
    }
    put(files, "notes/n99.txt", b"tok99 in a txt file\n").await;
    let hidden_id = put(files, "notes/hidden.md", b"tok77 hidden\n").await;
    files
        .set_flags(&admin(), NS, &hidden_id, None, Some(true))
        .await
        .unwrap();
    let who = admin(); // writers see hidden files elsewhere, but never here

    let request = |name: &str, pattern: &str, limit: u32, cursor: &str| FindFilesRequest {
        namespace: NS.into(),
        folder_prefix: "notes".into(),
        name: name.into(),
        pattern: pattern.into(),
        limit,
        cursor: cursor.into(),
    };

    // Listing pages to the end: every file once, total constant, hidden absent.
    let mut seen = Vec::new();
    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let page = files
            .find_files(&who, &request("*.md", "", 5, &cursor))
            .await
            .unwrap();
        assert_eq!(page.total, 12);
        assert!(!page.stopped_early);
        assert!(page.files.iter().all(|f| f.matches.is_empty()));
        seen.extend(paths(&page));
        pages += 1;
        if page.next_cursor.is_empty() {
            break;
        }
        cursor = page.next_cursor;
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..12).map(|i| format!("notes/n{i:02}.md")).collect();
    assert_eq!(seen, expected);
    let all = files
        .find_files(&who, &request("", "", 0, ""))
        .await
        .unwrap();
    assert_eq!(all.total, 13);
    assert!(!paths(&all).contains(&"notes/hidden.md".to_owned()));
    let word = files
        .find_files(&who, &request("N99", "", 0, ""))
        .await
        .unwrap();
    assert_eq!(paths(&word), ["notes/n99.txt"]);
    let under = files
        .find_files(
            &who,
            &FindFilesRequest {
                namespace: NS.into(),
                name: "ops/*.md".into(),
                folder_prefix: "handbook/".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(paths(&under), ["handbook/ops/runbook.md"]);
    assert_eq!(
        files
            .find_files(&who, &request("", "", 201, ""))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        files
            .find_files(&who, &request("", "", 0, "zz"))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::InvalidArgument
    );

    // Content scan with paging: matching lines with numbers, glob applied first.
    let mut found = Vec::new();
    let mut cursor = String::new();
    let mut totals = Vec::new();
    loop {
        let page = files
            .find_files(&who, &request("*.md", r"tok\d\d", 2, &cursor))
            .await
            .unwrap();
        assert!(!page.stopped_early, "{}", page.stop_reason);
        for f in &page.files {
            assert_eq!(f.matches.len(), 1);
            assert_eq!(f.matches[0].line_number, 4);
            assert!(f.matches[0].line.starts_with("the deploy token is tok"));
        }
        found.extend(paths(&page));
        totals.push(page.total);
        if page.next_cursor.is_empty() {
            break;
        }
        cursor = page.next_cursor;
    }
    let expected: Vec<String> = (0..12)
        .step_by(2)
        .map(|i| format!("notes/n{i:02}.md"))
        .collect();
    assert_eq!(found, expected);
    assert_eq!(totals.last(), Some(&6));

    // Byte budget: one file per call, resumable, same answer in the end.
    let tiny_bytes = files
        .clone()
        .with_query_limits(QueryLimits {
            scan_bytes: 1,
            ..QueryLimits::default()
        })
        .unwrap();
    let (found, calls) = scan_all(&tiny_bytes, &who, request("", "tok", 50, "")).await;
    assert_eq!(found.len(), 7, "{found:?}");
    assert!(calls >= 13, "{calls}");
    let first = tiny_bytes
        .find_files(&who, &request("", "tok", 50, ""))
        .await
        .unwrap();
    assert!(first.stopped_early);
    assert_eq!(first.files_scanned, 1);
    assert_eq!(
        first.stop_reason,
        "byte budget of 1 bytes reached; pass nextCursor to continue"
    );

    // Time budget: an exhausted budget still scans one file per call.
    let no_time = files
        .clone()
        .with_query_limits(QueryLimits {
            scan_time: Duration::ZERO,
            ..QueryLimits::default()
        })
        .unwrap();
    let first = no_time
        .find_files(&who, &request("", "tok", 50, ""))
        .await
        .unwrap();
    assert!(first.stopped_early);
    assert_eq!(
        first.stop_reason,
        "time budget of 0ms reached; pass nextCursor to continue"
    );
    let (found_slow, _) = scan_all(&no_time, &who, request("", "tok", 50, "")).await;
    assert_eq!(found_slow, found);

    // Large files are skipped and said so; regex cost is refused up front.
    let mut big = Vec::with_capacity(11 << 20);
    while big.len() < (11 << 20) {
        big.extend_from_slice(b"tok00 filler line for the scan budget\n");
    }
    put(files, "notes/zz-big.md", &big).await;
    let page = files
        .find_files(&who, &request("", "tok", 50, ""))
        .await
        .unwrap();
    assert_eq!(page.files.len(), 7);
    assert!(!page.stopped_early);
    assert!(
        page.stop_reason
            .starts_with("skipped_large: 1 file(s) over 10 MiB"),
        "{}",
        page.stop_reason
    );
    let err = files
        .find_files(&who, &request("", r"(\w{200}){200}", 0, ""))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::ResourceExhausted);
    // Binary files are never reported.
    let page = files
        .find_files(
            &who,
            &FindFilesRequest {
                namespace: NS.into(),
                pattern: "failover|IHDR".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let got: BTreeSet<String> = paths(&page).into_iter().collect();
    assert!(!got.contains("assets/logo.png"), "{got:?}");
    assert!(got.contains("handbook/intro.md"), "{got:?}");
}

/// Follows a content scan to its end; returns the matched paths and the call count.
async fn scan_all(
    files: &FilesService,
    who: &CallerContext,
    mut request: FindFilesRequest,
) -> (Vec<String>, usize) {
    let mut found = Vec::new();
    let mut calls = 0;
    loop {
        let page = files.find_files(who, &request).await.unwrap();
        calls += 1;
        assert!(calls < 100, "scan does not end");
        found.extend(paths(&page));
        if page.next_cursor.is_empty() {
            return (found, calls);
        }
        request.cursor = page.next_cursor;
    }
}
