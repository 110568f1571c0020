//! The prune of versions nothing names, on SQLite and PostgreSQL: a replaced version's row,
//! title and links go, and so do a deleted file's title and links; a live file's version, a
//! release's, a preview branch's and a deleted file's own row stay. Content uploaded again
//! after its version went is registered and described again.

use kg_common::caller::now_ms;
use kg_files::{FilesService, PrunedVersions};
use kg_proto::v1::{CallerContext, FileIndexed, FileInfo, FileStatus, VersionLink, VersionMeta};
use kg_stores::sql::SqlStore;
use sqlx::Row as _;

use crate::common::{Env, env, metric, put_as};

const NS: &str = "pruned";
const OTHER_NS: &str = "pruned-too";

fn admin(namespace: &str) -> CallerContext {
    crate::common::admin(namespace)
}

/// The indexer's report on `version_id` of `file_id`: its title and `links` internal links.
fn indexed(
    namespace: &str,
    file_id: &str,
    version_id: &str,
    title: &str,
    links: u32,
) -> FileIndexed {
    FileIndexed {
        namespace: namespace.into(),
        file_id: file_id.into(),
        version_id: version_id.into(),
        status: FileStatus::Indexed as i32,
        indexed_at_ms: now_ms(),
        meta: Some(VersionMeta {
            source_path: format!("{title}.md"),
            title: title.into(),
            ..Default::default()
        }),
        links: (0..links)
            .map(|ordinal| VersionLink {
                ordinal,
                target_path: format!("target-{ordinal}.md"),
                raw_target: format!("target-{ordinal}.md"),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Uploads `body` at `path` and records the indexer's report on it, with `links` links.
async fn put_indexed(
    files: &FilesService,
    namespace: &str,
    path: &str,
    body: &str,
    links: u32,
) -> FileInfo {
    let file = put_as(files, &admin(namespace), namespace, path, body).await;
    let event = indexed(namespace, &file.file_id, &file.version_id, path, links);
    assert!(files.apply_indexed(&event).await.unwrap());
    file
}

/// The registry's own reading, through a second connection.
struct Registry(SqlStore);

impl Registry {
    async fn open(env: &Env) -> Self {
        let url = match &env.pg {
            Some(pg) => pg.url.clone(),
            None => format!("sqlite://{}", env.dir.path().join("files.db").display()),
        };
        Registry(SqlStore::connect(&url).await.unwrap())
    }

    async fn count(&self, table: &str, version_id: &str) -> i64 {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {table} WHERE version_id = $1"
        )))
        .bind(version_id)
        .fetch_one(self.0.pool())
        .await
        .unwrap()
        .try_get(0)
        .unwrap()
    }

    /// (version rows, metadata rows, link rows) of `version_id`.
    async fn rows(&self, version_id: &str) -> (i64, i64, i64) {
        (
            self.count("kg_file_versions", version_id).await,
            self.count("kg_file_version_meta", version_id).await,
            self.count("kg_file_version_links", version_id).await,
        )
    }
}

async fn prunes_what_nothing_names(postgres: bool) {
    let env = env(postgres).await;
    let files = &env.files;
    let registry = Registry::open(&env).await;

    let first = put_indexed(files, NS, "a.md", "# A\n\nfirst draft\n", 3).await;
    let second = put_indexed(files, NS, "a.md", "# A\n\nsecond draft\n", 1).await;
    let elsewhere = put_indexed(files, OTHER_NS, "a.md", "# A\n\nfirst draft\n", 2).await;
    put_indexed(files, OTHER_NS, "a.md", "# A\n\nnewer elsewhere\n", 0).await;
    let released = put_indexed(files, NS, "c.md", "# C\n\nas released\n", 2).await;
    files
        .create_release(&admin(NS), NS, "1.0", "", "before c changed")
        .await
        .unwrap();
    let after_release = put_indexed(files, NS, "c.md", "# C\n\nafter the release\n", 1).await;
    let gone = put_indexed(files, NS, "gone.md", "# Gone\n\nnever meant\n", 2).await;
    assert!(
        files
            .delete_file(&admin(NS), NS, &gone.file_id)
            .await
            .unwrap()
    );
    files
        .create_branch(&admin(NS), NS, "preview")
        .await
        .unwrap();
    let on_branch = files
        .upload_to_branch(
            &admin(NS),
            NS,
            "preview",
            "d.md",
            b"# D\n\non the branch\n",
            "",
        )
        .await
        .unwrap();
    let mut branch_event = indexed(NS, &on_branch.file_id, &on_branch.version_id, "d.md", 2);
    branch_event.branch_only = true;
    assert!(files.apply_indexed(&branch_event).await.unwrap());
    assert_eq!(registry.rows(&first.version_id).await, (1, 1, 3));

    let pruned = files.prune_versions().await.unwrap();
    assert_eq!(
        pruned,
        PrunedVersions {
            versions: 2,
            metadata: 3,
            links: 3 + 2 + 2,
        },
        "a.md's first version here and in the other namespace (row, title, links), and the \
         deleted file's title and links"
    );
    assert_eq!(
        registry.rows(&first.version_id).await,
        (0, 0, 0),
        "replaced"
    );
    assert_eq!(
        registry.rows(&elsewhere.version_id).await,
        (0, 0, 0),
        "replaced, in another namespace"
    );
    assert_eq!(
        registry.rows(&gone.version_id).await,
        (1, 0, 0),
        "a deleted file keeps its version's row, not its title and links"
    );
    assert_eq!(registry.rows(&second.version_id).await, (1, 1, 1), "live");
    assert_eq!(
        registry.rows(&released.version_id).await,
        (1, 1, 2),
        "release 1.0 names it"
    );
    assert_eq!(
        registry.rows(&after_release.version_id).await,
        (1, 1, 1),
        "live"
    );
    assert_eq!(
        registry.rows(&on_branch.version_id).await,
        (0, 1, 2),
        "the preview branch names it (a branch version has no row of its own)"
    );
    assert_eq!(
        files.prune_versions().await.unwrap(),
        PrunedVersions::default(),
        "nothing left to prune"
    );

    // The deleted file is still found as deleted: its row reads the blob key through its version.
    assert!(
        files
            .delete_file(&admin(NS), NS, &gone.file_id)
            .await
            .unwrap()
    );
    // The release's link graph still has the version it names.
    let release_links = files
        .version_links(std::slice::from_ref(&released.version_id))
        .await
        .unwrap();
    assert_eq!(release_links.len(), 1);
    assert_eq!(release_links[0].links.len(), 2);

    // Content uploaded again after its version went is registered again, under the same id.
    let again = put_indexed(files, NS, "a.md", "# A\n\nfirst draft\n", 3).await;
    assert_eq!(again.version_id, first.version_id);
    assert_eq!(registry.rows(&first.version_id).await, (1, 1, 3));
    assert_eq!(
        files.prune_versions().await.unwrap(),
        PrunedVersions::default(),
        "the second draft is replaced in turn, but release 1.0 names it"
    );

    // An admin's sweep prunes too, and says so; so do the metrics.
    put(files, "c.md", "# C\n\nthird\n").await;
    let deployment_admin = CallerContext {
        is_admin: true,
        tool: kg_common::caller::ADMIN_API_TOOL.into(),
        ..admin(NS)
    };
    let swept = files.sweep_blobs_for(&deployment_admin, 0).await.unwrap();
    assert_eq!(
        (
            swept.versions_removed,
            swept.version_metadata_removed,
            swept.version_links_removed
        ),
        (1, 1, 1),
        "c.md's version after the release"
    );
    assert_eq!(metric("kgmesh_registry_versions_pruned_total"), Some(3.0));
    assert_eq!(
        metric("kgmesh_registry_version_links_pruned_total"),
        Some(8.0)
    );
}

async fn put(files: &FilesService, path: &str, body: &str) -> FileInfo {
    put_as(files, &admin(NS), NS, path, body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_what_nothing_names_on_sqlite() {
    prunes_what_nothing_names(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_what_nothing_names_on_postgres() {
    prunes_what_nothing_names(true).await;
}

/// More versions than one batch holds: the prune pages through them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_past_a_batch() {
    let env = env(false).await;
    let files = &env.files;
    // Two full batches of 500 and one more.
    let edits = 1_002;
    for edit in 0..edits {
        put(files, "busy.md", &format!("# Busy\n\nedit {edit}\n")).await;
    }
    let pruned = files.prune_versions().await.unwrap();
    assert_eq!(pruned.versions, edits - 1, "every version but the last");
    let live = files
        .get_file(&admin(NS), NS, Some("busy.md"), None)
        .await
        .unwrap();
    assert_eq!(live.size, "# Busy\n\nedit 1001\n".len() as i64);
}

/// The advisory lock key of `namespace`'s registry rows, as `purge.rs` derives it.
fn namespace_lock_key(namespace: &str) -> i64 {
    use sha2::{Digest as _, Sha256};
    let digest = Sha256::digest(format!("kg_namespace\u{0}{namespace}").as_bytes());
    i64::from_be_bytes(digest[..8].try_into().unwrap())
}

/// A version a writer names again while the prune runs stays: the prune waits for the writers
/// holding the namespace and checks its rows again once they committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_named_again_meanwhile_stays_on_postgres() {
    let env = env(true).await;
    let files = env.files.clone();
    let registry = Registry::open(&env).await;
    let first = put(&files, "a.md", "# A\n\nfirst draft\n").await;
    let second = put(&files, "a.md", "# A\n\nsecond draft\n").await;

    // A writer in flight, as an upload of the first draft again holds the namespace: its
    // transaction names the first version again and has not committed.
    let mut writer = registry.0.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
        .bind(namespace_lock_key(NS))
        .execute(&mut *writer)
        .await
        .unwrap();
    sqlx::query("UPDATE kg_files SET version_id = $1 WHERE file_id = $2")
        .bind(&first.version_id)
        .bind(&first.file_id)
        .execute(&mut *writer)
        .await
        .unwrap();
    let prune = tokio::spawn(async move { files.prune_versions().await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!prune.is_finished(), "the prune waits for the writer");
    writer.commit().await.unwrap();
    let pruned = prune.await.unwrap().unwrap();
    assert_eq!(
        pruned.versions, 0,
        "found unnamed, named again before it was removed"
    );
    assert_eq!(registry.rows(&first.version_id).await.0, 1);
    assert_eq!(
        registry.rows(&second.version_id).await.0,
        1,
        "named when the prune looked"
    );
    assert_eq!(
        env.files.prune_versions().await.unwrap().versions,
        1,
        "the second, now"
    );
    assert_eq!(registry.rows(&second.version_id).await.0, 0);
}
