//! Purging a deleted namespace from the registry, on SQLite and PostgreSQL: every row of the
//! namespace goes (files, versions, metadata, links, branches, releases, environments) and
//! another namespace's stay; the indexer is asked to remove the rest; writes are refused until
//! it reports that done; and a purge it never reported is asked for again after the stream was
//! lost.

use kg_common::caller::now_ms;
use kg_common::{ErrorCode, ErrorExt as _};
use kg_files::FilesService;
use kg_proto::v1::{
    CallerContext, FileIndexed, FileInfo, FileStatus, NamespacePurged, ReleaseTarget, VersionLink,
    VersionLinkKind, VersionMeta, release_target,
};
use kg_stores::events;
use kg_stores::sql::SqlStore;
use prost::Message as _;

use crate::common::{env, payloads_on, put_as};

const DOOMED: &str = "doomed";
const KEPT: &str = "kept";

fn deployment_admin() -> CallerContext {
    let mut caller = crate::common::admin(DOOMED);
    caller
        .access
        .push(crate::common::admin(KEPT).access.remove(0));
    CallerContext {
        is_admin: true,
        tool: kg_common::caller::ADMIN_API_TOOL.into(),
        ..caller
    }
}

/// Reports `file` indexed with a title and one link, as the indexer would.
async fn indexed(files: &FilesService, file: &FileInfo) {
    let event = FileIndexed {
        namespace: file.namespace.clone(),
        file_id: file.file_id.clone(),
        version_id: file.version_id.clone(),
        status: FileStatus::Indexed as i32,
        chunk_count: 1,
        indexed_at_ms: now_ms(),
        meta: Some(VersionMeta {
            source_path: file.path.clone(),
            title: "A title".into(),
            ..Default::default()
        }),
        links: vec![VersionLink {
            ordinal: 0,
            kind: VersionLinkKind::Internal as i32,
            target_path: "other.md".into(),
            raw_target: "other.md".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(files.apply_indexed(&event).await.unwrap());
}

/// Rows of every registry table, in a fixed order.
async fn row_counts(sql: &SqlStore) -> Vec<(&'static str, i64)> {
    let mut counts = Vec::new();
    for table in [
        "kg_files",
        "kg_file_versions",
        "kg_file_version_meta",
        "kg_file_version_links",
        "kg_branches",
        "kg_branch_files",
        "kg_releases",
        "kg_release_files",
        "kg_environments",
        "kg_environment_deploys",
    ] {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT COUNT(*) AS n FROM {table}"
        )))
        .fetch_one(sql.pool())
        .await
        .unwrap();
        counts.push((table, sqlx::Row::try_get::<i64, _>(&row, "n").unwrap()));
    }
    counts
}

/// The purge requests on `KG_FILES` for `namespace`.
async fn purge_requests(
    js: &async_nats::jetstream::Context,
    namespace: &str,
) -> Vec<NamespacePurged> {
    let subject = events::files_purged_subject(namespace).unwrap();
    payloads_on(js, &subject)
        .await
        .iter()
        .map(|payload| NamespacePurged::decode(payload.as_slice()).unwrap())
        .collect()
}

async fn purges_a_namespace(postgres: bool) {
    let env = env(postgres).await;
    let files = &env.files;
    let url = match &env.pg {
        Some(pg) => pg.url.clone(),
        None => format!("sqlite://{}", env.dir.path().join("files.db").display()),
    };
    let sql = SqlStore::connect(&url).await.unwrap();
    let js = events::connect(&env.nats.url).await.unwrap();
    let admin = deployment_admin();
    assert_eq!(files.replay_if_stream_renewed().await.unwrap(), None);

    // The doomed namespace: two files (one replaced), metadata and links, a branch with an
    // upload, a release and an environment. The kept one: one indexed file.
    let a = put_as(files, &admin, DOOMED, "a.md", "# A\n\nfirst\n").await;
    indexed(files, &a).await;
    put_as(files, &admin, DOOMED, "b.md", "# B\n\none\n").await;
    put_as(files, &admin, DOOMED, "b.md", "# B\n\ntwo\n").await;
    files
        .create_release(&admin, DOOMED, "1.0", "", "")
        .await
        .unwrap();
    let release = ReleaseTarget {
        selector: Some(release_target::Selector::ReleaseVersion("1.0".into())),
    };
    files
        .deploy_environment(&admin, DOOMED, "prod", &release)
        .await
        .unwrap();
    files
        .create_branch(&admin, DOOMED, "preview")
        .await
        .unwrap();
    files
        .upload_to_branch(&admin, DOOMED, "preview", "c.md", b"# C\n", "")
        .await
        .unwrap();
    let k = put_as(files, &admin, KEPT, "k.md", "# K\n\nkept\n").await;
    indexed(files, &k).await;

    // Only the deployment's admins purge, and a namespace never purged has no purge to show.
    let refused = files
        .purge_namespace(&crate::common::admin(DOOMED), DOOMED)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::PermissionDenied, "{refused}");
    let none = files.namespace_purge(&admin, DOOMED).await.unwrap_err();
    assert_eq!(none.code(), ErrorCode::NotFound, "{none}");

    let purge = files.purge_namespace(&admin, DOOMED).await.unwrap();
    assert_eq!(
        (
            purge.files_removed,
            purge.versions_removed,
            purge.branches_removed,
            purge.releases_removed,
            purge.environments_removed,
            purge.purged_at_ms,
        ),
        (2, 3, 1, 1, 1, 0)
    );
    assert_eq!(
        row_counts(&sql).await,
        vec![
            ("kg_files", 1),
            ("kg_file_versions", 1),
            ("kg_file_version_meta", 1),
            ("kg_file_version_links", 1),
            ("kg_branches", 0),
            ("kg_branch_files", 0),
            ("kg_releases", 0),
            ("kg_release_files", 0),
            ("kg_environments", 0),
            ("kg_environment_deploys", 0),
        ],
        "only the kept namespace's rows are left"
    );
    let asked = purge_requests(&js, DOOMED).await;
    assert_eq!(
        asked,
        vec![NamespacePurged {
            namespace: DOOMED.into(),
            requested_at_ms: purge.requested_at_ms,
        }]
    );

    // Until the indexer reports its part done, nothing is written to the namespace.
    let upload = files
        .upload(&admin, DOOMED, "late.md", b"# Late\n", "")
        .await
        .unwrap_err();
    assert_eq!(upload.code(), ErrorCode::FailedPrecondition, "{upload}");
    assert!(upload.to_string().contains("being deleted"), "{upload}");
    let branch = files
        .create_branch(&admin, DOOMED, "again")
        .await
        .unwrap_err();
    assert_eq!(branch.code(), ErrorCode::FailedPrecondition, "{branch}");
    put_as(files, &admin, KEPT, "k2.md", "# K2\n").await;
    let status = files.namespace_purge(&admin, DOOMED).await.unwrap();
    assert_eq!(
        (status.requested_at_ms, status.purged_at_ms),
        (purge.requested_at_ms, 0)
    );

    // A report of an earlier request confirms nothing; the request's own does.
    let report = |requested_at_ms| NamespacePurged {
        namespace: DOOMED.into(),
        requested_at_ms,
    };
    assert!(
        !files
            .apply_purged(&report(purge.requested_at_ms - 1))
            .await
            .unwrap()
    );
    assert!(
        files
            .apply_purged(&report(purge.requested_at_ms))
            .await
            .unwrap()
    );
    assert!(
        !files
            .apply_purged(&report(purge.requested_at_ms))
            .await
            .unwrap(),
        "a redelivered report changes nothing"
    );
    let done = files.namespace_purge(&admin, DOOMED).await.unwrap();
    assert!(done.purged_at_ms >= done.requested_at_ms, "{done:?}");
    let fresh = put_as(files, &admin, DOOMED, "a.md", "# A\n\nfirst\n").await;
    assert_ne!(
        fresh.file_id, a.file_id,
        "a namespace made again starts anew"
    );

    // A purge asked for again and never reported is asked for again when the stream is lost.
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    let second = files.purge_namespace(&admin, DOOMED).await.unwrap();
    assert_eq!(second.files_removed, 1);
    assert!(second.requested_at_ms > purge.requested_at_ms);
    js.delete_stream(events::FILES_STREAM).await.unwrap();
    let replay = files.replay_if_stream_renewed().await.unwrap().unwrap();
    assert_eq!(replay.purges, 1, "{replay:?}");
    assert_eq!(
        purge_requests(&js, DOOMED).await,
        vec![report(second.requested_at_ms)]
    );
}

#[tokio::test]
async fn purges_a_namespace_on_sqlite() {
    purges_a_namespace(false).await;
}

#[tokio::test]
async fn purges_a_namespace_on_postgres() {
    purges_a_namespace(true).await;
}

/// The advisory lock key of a namespace, as the files service computes it.
fn namespace_lock_key(namespace: &str) -> i64 {
    use sha2::{Digest as _, Sha256};
    let digest = Sha256::digest(format!("kg_namespace\u{0}{namespace}").as_bytes());
    i64::from_be_bytes(digest[..8].try_into().unwrap())
}

/// On PostgreSQL an upload, or a new branch, already past every check when a purge starts must
/// not leave a row behind: it waits for the purge's transaction and then finds the purge.
#[tokio::test]
async fn an_upload_racing_a_purge_waits_for_it_and_is_refused_on_postgres() {
    let env = env(true).await;
    let sql = SqlStore::connect(&env.pg.as_ref().unwrap().url)
        .await
        .unwrap();
    let admin = deployment_admin();

    // A purge mid-transaction: the namespace held, its record written, not committed yet.
    let mut purge = sql.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(namespace_lock_key(DOOMED))
        .execute(&mut *purge)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO kg_namespace_purges (namespace, requested_at_ms, purged_at_ms) VALUES ($1, $2, 0)",
    )
    .bind(DOOMED)
    .bind(now_ms())
    .execute(&mut *purge)
    .await
    .unwrap();

    let files = env.files.clone();
    let caller = admin.clone();
    let upload = tokio::spawn(async move {
        files
            .upload(&caller, DOOMED, "late.md", b"# Late\n", "")
            .await
    });
    let (files, caller) = (env.files.clone(), admin.clone());
    let branch = tokio::spawn(async move { files.create_branch(&caller, DOOMED, "late").await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        !upload.is_finished(),
        "the upload must wait for the purge's transaction"
    );
    assert!(
        !branch.is_finished(),
        "the new branch must wait for the purge's transaction"
    );
    purge.commit().await.unwrap();
    let refused = upload.await.unwrap().unwrap_err();
    assert_eq!(refused.code(), ErrorCode::FailedPrecondition, "{refused}");
    let refused = branch.await.unwrap().unwrap_err();
    assert_eq!(refused.code(), ErrorCode::FailedPrecondition, "{refused}");
    let counts = row_counts(&sql).await;
    assert!(counts.contains(&("kg_files", 0)), "{counts:?}");
    assert!(counts.contains(&("kg_branches", 0)), "{counts:?}");
}
