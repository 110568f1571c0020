//! What several scenarios share.

use kg_common::caller::now_ms;
use kg_files::FilesService;
use kg_proto::v1::{AccessFilter, CallerContext, FileChanged, Permission};
use kg_stores::blobs::BlobStore;
use kg_stores::embedded::{EmbeddedNats, EmbeddedPostgres, find_venv};
use kg_stores::events;
use kg_stores::sql::SqlStore;
use prost::Message as _;

/// A caller who may write anywhere in `namespace`, valid for an hour.
pub fn writer(namespace: &str) -> CallerContext {
    let now = now_ms();
    CallerContext {
        principal_id: "files-test".into(),
        access: vec![AccessFilter {
            namespace: namespace.into(),
            allow_prefixes: vec![String::new()],
            write_prefixes: vec![String::new()],
            permission: Permission::Write as i32,
            ..Default::default()
        }],
        issued_at_ms: now,
        expires_at_ms: now + 3_600_000,
        ..Default::default()
    }
}

/// A caller who administers the whole of `namespace`.
pub fn admin(namespace: &str) -> CallerContext {
    let mut caller = writer(namespace);
    caller.access[0].permission = Permission::Admin as i32;
    caller.access[0].admin_prefixes = vec![String::new()];
    caller
}

/// Uploads `body` at `path` in `namespace` as `caller`; the file as registered.
pub async fn put_as(
    files: &FilesService,
    caller: &CallerContext,
    namespace: &str,
    path: &str,
    body: &str,
) -> kg_proto::v1::FileInfo {
    files
        .upload(caller, namespace, path, body.as_bytes(), "")
        .await
        .unwrap()
        .file
        .unwrap()
}

/// A files service on real NATS and SQLite, or PostgreSQL when `postgres`.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub nats: EmbeddedNats,
    pub pg: Option<EmbeddedPostgres>,
    pub files: FilesService,
}

/// [`env_with`] taking uploads of up to 1 MiB.
pub async fn env(postgres: bool) -> Env {
    env_with(postgres, 1 << 20).await
}

/// A files service on real NATS and SQLite (or PostgreSQL), taking uploads of up to
/// `max_upload` bytes.
pub async fn env_with(postgres: bool, max_upload: usize) -> Env {
    let venv = find_venv().expect("run deploy/scripts/dev-deps.sh first");
    let dir = tempfile::tempdir().unwrap();
    let nats = EmbeddedNats::start(&venv, &dir.path().join("nats"))
        .await
        .unwrap();
    let js = kg_stores::events::connect(&nats.url).await.unwrap();
    let (pg, url) = if postgres {
        let pg = EmbeddedPostgres::start(&venv, &dir.path().join("pg"))
            .await
            .unwrap();
        let url = pg.url.clone();
        (Some(pg), url)
    } else {
        (
            None,
            format!("sqlite://{}", dir.path().join("files.db").display()),
        )
    };
    let sql = SqlStore::connect(&url).await.unwrap();
    let blobs = BlobStore::new(dir.path().join("blobs"));
    let files = FilesService::new(sql, blobs, js, max_upload).await.unwrap();
    Env {
        dir,
        nats,
        pg,
        files,
    }
}

/// The change events of `file_id` in `namespace`, as the indexer reads them.
pub async fn changes(
    js: &async_nats::jetstream::Context,
    namespace: &str,
    file_id: &str,
) -> Vec<FileChanged> {
    let subject = events::files_changed_subject(namespace).unwrap();
    events_on(js, &subject, file_id).await
}

/// The events of `file_id` on `subject` (of `KG_FILES`).
pub async fn events_on(
    js: &async_nats::jetstream::Context,
    subject: &str,
    file_id: &str,
) -> Vec<FileChanged> {
    payloads_on(js, subject)
        .await
        .iter()
        .map(|payload| FileChanged::decode(payload.as_slice()).unwrap())
        .filter(|event| event.file_id == file_id)
        .collect()
}

/// The payloads on `subject` of `KG_FILES`, oldest first.
pub async fn payloads_on(js: &async_nats::jetstream::Context, subject: &str) -> Vec<Vec<u8>> {
    use futures::StreamExt as _;
    let stream = js.get_stream(events::FILES_STREAM).await.unwrap();
    let reader = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
            filter_subject: subject.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = reader.messages().await.unwrap();
    let mut found = Vec::new();
    while let Ok(Some(message)) =
        tokio::time::timeout(std::time::Duration::from_millis(500), messages.next()).await
    {
        found.push(message.unwrap().payload.to_vec());
    }
    found
}

/// The value of the metric series `name` (no labels) in this process's exposition.
pub fn metric(name: &str) -> Option<f64> {
    kg_common::metrics::encode_text().lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .parse::<f64>()
            .ok()
    })
}
