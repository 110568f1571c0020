//! Writes and counts under narrowed access, on SQLite and PostgreSQL: a caller who reads one
//! folder and writes another writes only the second and sees disabled files only there; an
//! upload over a file the caller is denied is refused without echoing that file; branch and
//! release counts include only files the caller may read. Callers are built as auth mints
//! them (`AccessFilter::write_prefixes` = where write or admin is granted).
use kg_common::caller::now_ms;

use crate::common::env;
use kg_common::{ErrorCode, ErrorExt as _};
use kg_files::{FilesError, FilesService};
use kg_proto::v1::{
    AccessFilter, CallerContext, FileInfo, LookupTarget, Permission, ReleaseTarget, lookup_target,
    release_target,
};

const NS: &str = "acl";
/// The refusal of a write outside the caller's write prefixes (or to a denied file).
const WRITE_DENIED: &str = "writing to namespace `acl` needs write permission on that path";

fn caller(filter: AccessFilter) -> CallerContext {
    let now = now_ms();
    CallerContext {
        principal_id: "tester".into(),
        access: vec![AccessFilter {
            namespace: NS.into(),
            enabled_only: true,
            ..filter
        }],
        issued_at_ms: now,
        expires_at_ms: now + 3_600_000,
        ..Default::default()
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// A deployment admin, as `admin_filters` mints it.
fn admin() -> CallerContext {
    let mut c = caller(AccessFilter {
        allow_prefixes: strings(&[""]),
        write_prefixes: strings(&[""]),
        admin_prefixes: strings(&[""]),
        permission: Permission::Admin as i32,
        ..Default::default()
    });
    c.is_admin = true;
    c
}

/// `read` on `docs/` and `write` on `team/`: the highest level held is write.
fn mixed() -> CallerContext {
    caller(AccessFilter {
        allow_prefixes: strings(&["docs/", "team/"]),
        write_prefixes: strings(&["team/"]),
        permission: Permission::Write as i32,
        visible_only: true,
        ..Default::default()
    })
}

async fn put(files: &FilesService, path: &str, body: &str) -> FileInfo {
    files
        .upload(&admin(), NS, path, body.as_bytes(), "")
        .await
        .unwrap()
        .file
        .unwrap()
}

async fn stored(files: &FilesService, path: &str) -> FileInfo {
    files
        .get_file(&admin(), NS, Some(path), None)
        .await
        .unwrap()
}

fn assert_write_denied<T: std::fmt::Debug>(result: Result<T, FilesError>, what: &str) {
    let err = result.expect_err(what);
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{what}: {err}");
    assert_eq!(err.to_string(), WRITE_DENIED, "{what}");
}

async fn listed(files: &FilesService, who: &CallerContext) -> (Vec<String>, i64) {
    let page = files.list_files(who, NS, "", 0, "", true).await.unwrap();
    let paths = page.files.iter().map(|f| f.path.clone()).collect();
    (paths, page.total)
}

/// Files under both folders, one disabled in each.
async fn mixed_corpus(files: &FilesService) -> [FileInfo; 4] {
    let doc = put(files, "docs/x.md", "# X\n").await;
    let doc_off = put(files, "docs/off.md", "# Off\n").await;
    let team = put(files, "team/y.md", "# Y\n").await;
    let team_off = put(files, "team/off.md", "# Team off\n").await;
    for off in [&doc_off, &team_off] {
        files
            .set_flags(&admin(), NS, &off.file_id, Some(false), None)
            .await
            .unwrap();
    }
    [doc, doc_off, team, team_off]
}

async fn mixed_writes(postgres: bool) {
    let env = env(postgres).await;
    let files = &env.files;
    let [doc, _, team, _] = mixed_corpus(files).await;
    files.create_branch(&admin(), NS, "preview").await.unwrap();
    let who = mixed();

    // The read-only folder: no upload (new or over a file), flag change, delete or branch upload.
    assert_write_denied(
        files
            .upload(&who, NS, "docs/x.md", b"# Rewritten\n", "")
            .await,
        "upload over docs/x.md",
    );
    assert_write_denied(
        files.upload(&who, NS, "docs/new.md", b"# New\n", "").await,
        "upload of docs/new.md",
    );
    assert_write_denied(
        files
            .set_flags(&who, NS, &doc.file_id, Some(false), Some(true))
            .await,
        "set_flags on docs/x.md",
    );
    assert_write_denied(
        files.delete_file(&who, NS, &doc.file_id).await,
        "delete of docs/x.md",
    );
    assert_write_denied(
        files
            .upload_to_branch(&who, NS, "preview", "docs/x.md", b"# Branch\n", "")
            .await,
        "branch upload of docs/x.md",
    );
    let after = stored(files, "docs/x.md").await;
    assert_eq!(after.content_sha256, doc.content_sha256);
    assert_eq!(after.version_id, doc.version_id);
    assert!(after.enabled && !after.hidden);
    assert!(
        files
            .get_file(&admin(), NS, Some("docs/new.md"), None)
            .await
            .is_err()
    );
    assert_eq!(
        files.list_branches(&admin(), NS).await.unwrap()[0].changed_files,
        0
    );
    // A hidden file under the write folder is as unseen as a denied one (the caller does not
    // see hidden files): no upload over it.
    let hidden = put(files, "team/hidden.md", "# Hidden\n").await;
    files
        .set_flags(&admin(), NS, &hidden.file_id, None, Some(true))
        .await
        .unwrap();
    assert_write_denied(
        files
            .upload(&who, NS, "team/hidden.md", b"# Hidden\n", "")
            .await,
        "upload over hidden team/hidden.md",
    );

    // The write folder: everything works.
    let z = files
        .upload(&who, NS, "team/z.md", b"# Z\n", "")
        .await
        .unwrap();
    assert!(z.changed);
    files
        .set_flags(&who, NS, &team.file_id, Some(false), None)
        .await
        .unwrap();
    files
        .upload_to_branch(&who, NS, "preview", "team/y.md", b"# Y2\n", "")
        .await
        .unwrap();
    assert!(
        files
            .delete_file(&who, NS, &z.file.unwrap().file_id)
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_grants_write_only_the_write_folder_on_sqlite() {
    mixed_writes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_grants_write_only_the_write_folder_on_postgres() {
    mixed_writes(true).await;
}

async fn mixed_reads(postgres: bool) {
    let env = env(postgres).await;
    let files = &env.files;
    let [_, doc_off, _, team_off] = mixed_corpus(files).await;
    let who = mixed();

    // Disabled files show only under the write folder, in the page and in its total.
    let (paths, total) = listed(files, &who).await;
    assert_eq!(paths, ["docs/x.md", "team/off.md", "team/y.md"]);
    assert_eq!(total, 3);
    let page = files
        .list_files(&who, NS, "docs/", 0, "", false)
        .await
        .unwrap();
    assert_eq!(page.total, 1);
    let err = files
        .get_file(&who, NS, Some("docs/off.md"), None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert_eq!(err.to_string(), format!("file not found: {NS}/docs/off.md"));
    let err = files
        .get_file(&who, NS, None, Some(&doc_off.file_id))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("file not found: {NS}/{}", doc_off.file_id)
    );
    let found = files
        .get_file(&who, NS, None, Some(&team_off.file_id))
        .await
        .unwrap();
    assert!(!found.enabled);
    // The admin sees both disabled files; a reader of both folders neither.
    assert_eq!(listed(files, &admin()).await.1, 4);
    let reader = caller(AccessFilter {
        allow_prefixes: strings(&["docs/", "team/"]),
        permission: Permission::Read as i32,
        visible_only: true,
        ..Default::default()
    });
    assert_eq!(listed(files, &reader).await.0, ["docs/x.md", "team/y.md"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_grants_show_disabled_files_only_under_the_write_folder_on_sqlite() {
    mixed_reads(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_grants_show_disabled_files_only_under_the_write_folder_on_postgres() {
    mixed_reads(true).await;
}

async fn denied_file(postgres: bool) {
    let env = env(postgres).await;
    let files = &env.files;
    let pay = put(files, "team/pay.csv", "name,salary\nAda,1\n").await;
    put(files, "team/ok.md", "# Ok\n").await;
    files.create_branch(&admin(), NS, "preview").await.unwrap();
    // Writes `team/`, denied the payroll file by id.
    let who = caller(AccessFilter {
        allow_prefixes: strings(&["team/"]),
        write_prefixes: strings(&["team/"]),
        deny_file_ids: vec![pay.file_id.clone()],
        permission: Permission::Write as i32,
        ..Default::default()
    });

    // The same bytes (a content probe), other bytes (an overwrite), and a branch upload
    // (which would name the file id): all refused, and the refusal echoes nothing.
    for (what, result) in [
        (
            "same bytes",
            files
                .upload(&who, NS, "team/pay.csv", b"name,salary\nAda,1\n", "")
                .await,
        ),
        (
            "other bytes",
            files
                .upload(&who, NS, "team/pay.csv", b"name,salary\nAda,999\n", "")
                .await,
        ),
    ] {
        let err = result.expect_err(what);
        assert_eq!(err.code(), ErrorCode::PermissionDenied, "{what}: {err}");
        assert_eq!(err.to_string(), WRITE_DENIED, "{what}");
        assert!(!err.to_string().contains(&pay.file_id));
    }
    let err = files
        .upload_to_branch(&who, NS, "preview", "team/pay.csv", b"x,y\n1,2\n", "")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    assert_eq!(err.to_string(), WRITE_DENIED);

    // The stored file is unchanged, and the branch holds nothing.
    let after = stored(files, "team/pay.csv").await;
    assert_eq!(after.content_sha256, pay.content_sha256);
    assert_eq!(after.version_id, pay.version_id);
    assert_eq!(after.updated_at_ms, pay.updated_at_ms);
    let branches = files.list_branches(&admin(), NS).await.unwrap();
    assert_eq!(branches[0].changed_files, 0);
    // Reading it is not found, as for any missing file.
    let err = files
        .get_file(&who, NS, Some("team/pay.csv"), None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);

    // Other files in the folder stay writable.
    let ok = files
        .upload(&who, NS, "team/ok.md", b"# Ok 2\n", "")
        .await
        .unwrap();
    assert!(ok.changed);
    files
        .upload_to_branch(&who, NS, "preview", "team/ok.md", b"# Ok 3\n", "")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_over_a_denied_file_is_refused_on_sqlite() {
    denied_file(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_over_a_denied_file_is_refused_on_postgres() {
    denied_file(true).await;
}

async fn counts(postgres: bool) {
    let env = env(postgres).await;
    let files = &env.files;
    put(files, "docs/a.md", "# A\n").await;
    put(files, "docs/b.md", "# B\n").await;
    put(files, "secret/s.md", "# S\n").await;
    let hidden = put(files, "docs/hidden.md", "# H\n").await;
    let denied = put(files, "docs/denied.md", "# D\n").await;
    let off = put(files, "docs/off.md", "# Off\n").await;
    files
        .set_flags(&admin(), NS, &hidden.file_id, None, Some(true))
        .await
        .unwrap();
    files
        .set_flags(&admin(), NS, &off.file_id, Some(false), None)
        .await
        .unwrap();
    files.create_branch(&admin(), NS, "preview").await.unwrap();
    for path in ["docs/a.md", "secret/s2.md", "docs/denied.md"] {
        files
            .upload_to_branch(&admin(), NS, "preview", path, b"# Changed\n", "")
            .await
            .unwrap();
    }
    files
        .create_release(&admin(), NS, "v1", "", "")
        .await
        .unwrap();
    // Reads `docs/` except one file; disabled and hidden files are not readable.
    let reader = caller(AccessFilter {
        allow_prefixes: strings(&["docs/"]),
        deny_file_ids: vec![denied.file_id.clone()],
        permission: Permission::Read as i32,
        visible_only: true,
        ..Default::default()
    });

    let releases = files.list_releases(&reader, NS).await.unwrap();
    assert_eq!(releases[0].file_count, 2, "docs/a.md and docs/b.md");
    let resolved = files
        .resolve_target(
            &reader,
            NS,
            Some(&LookupTarget {
                kind: Some(lookup_target::Kind::Release(ReleaseTarget {
                    selector: Some(release_target::Selector::ReleaseVersion("v1".into())),
                })),
            }),
            0,
            "",
        )
        .await
        .unwrap();
    assert_eq!(resolved.total, releases[0].file_count);
    let branches = files.list_branches(&reader, NS).await.unwrap();
    assert_eq!(branches[0].changed_files, 1, "docs/a.md only");

    // The admin counts every file.
    assert_eq!(
        files.list_releases(&admin(), NS).await.unwrap()[0].file_count,
        6
    );
    assert_eq!(
        files.list_branches(&admin(), NS).await.unwrap()[0].changed_files,
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branch_and_release_counts_only_readable_files_on_sqlite() {
    counts(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branch_and_release_counts_only_readable_files_on_postgres() {
    counts(true).await;
}

/// The registry marks a file deleted before the delete event goes out, so a delete whose
/// event was lost (the bus was down: `unavailable`) leaves the file in the lanes until the
/// caller retries. The retry must send the event again, not answer `not_found`.
#[tokio::test]
async fn a_delete_sent_again_sends_the_event_again() {
    use prost::Message as _;

    let env = env(false).await;
    let files = &env.files;
    let file = put(files, "team/gone.md", "# Gone\n").await;
    let js = kg_stores::events::connect(&env.nats.url).await.unwrap();
    let subject = kg_stores::events::files_changed_subject(NS).unwrap();
    let stream = js
        .get_stream(kg_stores::events::FILES_STREAM)
        .await
        .unwrap();
    let messages = || async { stream.clone().info().await.unwrap().state.messages };

    assert!(
        files
            .delete_file(&admin(), NS, &file.file_id)
            .await
            .unwrap()
    );
    let after_first = messages().await;
    assert!(
        files
            .delete_file(&admin(), NS, &file.file_id)
            .await
            .unwrap()
    );
    // Each delete goes on `changed`, in order, and again on `removed`, the fast path.
    assert_eq!(messages().await, after_first + 2);
    let removed = kg_stores::events::files_removed_subject(NS).unwrap();
    for subject in [&subject, &removed] {
        let last = stream
            .get_last_raw_message_by_subject(subject)
            .await
            .unwrap();
        let event = kg_proto::v1::FileChanged::decode(last.payload.as_ref()).unwrap();
        assert_eq!(
            (event.file_id.as_str(), event.op()),
            (file.file_id.as_str(), kg_proto::v1::FileChangeOp::Delete),
            "{subject}"
        );
    }
    // Still deleted for readers, and a writer who may not write there still may not.
    let gone = files
        .get_file(&admin(), NS, None, Some(&file.file_id))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), ErrorCode::NotFound);
    let refused = files
        .delete_file(&mixed_reader_of_team(), NS, &file.file_id)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::PermissionDenied);
}

/// Reads `team/` only.
fn mixed_reader_of_team() -> CallerContext {
    caller(AccessFilter {
        allow_prefixes: strings(&["team/"]),
        permission: Permission::Read as i32,
        ..Default::default()
    })
}

/// Admin of `handbook/` only (and write on everything): the highest level held is admin.
fn folder_admin() -> CallerContext {
    caller(AccessFilter {
        allow_prefixes: strings(&[""]),
        write_prefixes: strings(&[""]),
        admin_prefixes: strings(&["handbook/"]),
        permission: Permission::Admin as i32,
        ..Default::default()
    })
}

/// A release and an environment change what every folder serves: an admin of one folder may
/// neither cut one nor deploy one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_admin_of_the_whole_namespace_releases_and_deploys() {
    let env = env(false).await;
    let files = &env.files;
    put(files, "handbook/a.md", "# A\n").await;
    put(files, "ops/b.md", "# B\n").await;
    let refused = files
        .create_release(&folder_admin(), NS, "v1", "", "")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::PermissionDenied);
    assert!(
        refused.to_string().contains("on the whole namespace"),
        "{refused}"
    );
    files
        .create_release(&admin(), NS, "v1", "", "")
        .await
        .unwrap();
    let v1 = ReleaseTarget {
        selector: Some(release_target::Selector::ReleaseVersion("v1".into())),
    };
    let refused = files
        .deploy_environment(&folder_admin(), NS, "production", &v1)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::PermissionDenied);
    assert!(
        files
            .list_environments(&admin(), NS)
            .await
            .unwrap()
            .is_empty(),
        "nothing was deployed"
    );
    files
        .deploy_environment(&admin(), NS, "production", &v1)
        .await
        .unwrap();
    assert_eq!(
        files.list_releases(&admin(), NS).await.unwrap().len(),
        1,
        "the refused release left nothing behind"
    );
}
