//! Writes racing for one name (a client retrying after a timeout, two ingest jobs
//! overlapping) on SQLite and PostgreSQL: uploads of one new path, on main or on a branch,
//! all succeed as one file;
//! of branches or releases created under one name at once, one is made and the others are
//! told it exists (`already_exists`), never an internal error; deploys of one environment
//! at once all land, one after another. Flag changes at once to one file (one disables it,
//! one hides it) both stay, and the events carry a count that orders them for the indexer.

use kg_common::error::{ErrorCode, ErrorExt};
use kg_files::FilesService;
use kg_proto::v1::{FileChangeOp, Permission, ReleaseTarget, release_target};
use kg_stores::blobs::BlobStore;
use kg_stores::embedded::{EmbeddedNats, EmbeddedPostgres, find_venv};
use kg_stores::sql::SqlStore;

use crate::common::{changes, writer};

const NS: &str = "race";

async fn race(files: &FilesService, path: &str) {
    let caller = writer(NS);
    let uploads = (0..8).map(|i| {
        let caller = caller.clone();
        async move {
            let content = format!("# Draft {i}\n\nThe same page, written eight times at once.\n");
            files
                .upload(&caller, NS, path, content.as_bytes(), "")
                .await
        }
    });
    let results = futures::future::join_all(uploads).await;
    let mut ids = Vec::new();
    for result in results {
        let file = result
            .unwrap_or_else(|status| panic!("an upload failed: {status}"))
            .file
            .unwrap();
        ids.push(file.file_id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "one file for one path: {ids:?}");
    let folder = path.rsplit_once('/').map_or("", |(folder, _)| folder);
    let listed = files
        .list_files(&caller, NS, &format!("{folder}/"), 0, "", true)
        .await
        .unwrap();
    let same_path: Vec<_> = listed.files.iter().filter(|f| f.path == path).collect();
    assert_eq!(same_path.len(), 1, "{:?}", listed.files);
    assert_eq!(same_path[0].file_id, ids[0]);
}

/// Eight creations of one branch, then of one release, at once: one wins, the rest exist.
async fn names_race(files: &FilesService, tag: &str) {
    let mut admin = writer(NS);
    admin.access[0].permission = Permission::Admin as i32;
    admin.access[0].admin_prefixes = vec![String::new()];
    admin.is_admin = true;
    let branch = format!("preview-{tag}");
    let made =
        futures::future::join_all((0..8).map(|_| files.create_branch(&admin, NS, &branch))).await;
    // Eight uploads of one path new to the branch at once: all land as one file.
    let draft = format!("drafts/{tag}.md");
    let uploads = futures::future::join_all((0..8).map(|i| {
        let content = format!("# Draft {i}\n");
        let (admin, branch, draft) = (&admin, &branch, &draft);
        async move {
            files
                .upload_to_branch(admin, NS, branch, draft, content.as_bytes(), "")
                .await
        }
    }))
    .await;
    let mut ids: Vec<String> = uploads
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|err| panic!("a branch upload failed: {err}"))
                .file_id
        })
        .collect();
    ids.dedup();
    assert_eq!(ids.len(), 1, "one file for one path on the branch: {ids:?}");
    let version = format!("v1-{tag}");
    let released = futures::future::join_all(
        (0..8).map(|_| files.create_release(&admin, NS, &version, "main", "")),
    )
    .await;
    // Eight deploys of one new environment at once: each lands, one after another.
    let target = ReleaseTarget {
        selector: Some(release_target::Selector::ReleaseVersion(version.clone())),
    };
    let environment = format!("staging-{tag}");
    let deployed = futures::future::join_all(
        (0..8).map(|_| files.deploy_environment(&admin, NS, &environment, &target)),
    )
    .await;
    for result in deployed {
        result.unwrap_or_else(|err| panic!("a deploy failed: {err}"));
    }
    let environments = files.list_environments(&admin, NS).await.unwrap();
    let staged = environments.iter().find(|e| e.name == environment).unwrap();
    assert_eq!(
        staged.history.len(),
        8,
        "eight deploys recorded: {staged:?}"
    );
    for (what, codes) in [
        (
            "branch",
            made.iter()
                .map(|r| r.as_ref().err().map(ErrorExt::code))
                .collect::<Vec<_>>(),
        ),
        (
            "release",
            released
                .iter()
                .map(|r| r.as_ref().err().map(ErrorExt::code))
                .collect(),
        ),
    ] {
        assert_eq!(
            codes.iter().filter(|c| c.is_none()).count(),
            1,
            "{what}: one made: {codes:?}"
        );
        assert!(
            codes
                .iter()
                .flatten()
                .all(|c| *c == ErrorCode::AlreadyExists),
            "{what}: the others exist: {codes:?}"
        );
    }
}

/// Rounds of a disable and a hide of one file at once: both stay every time (before, each
/// wrote both flags as it had read them, so the later write undid the other change), and
/// the change events' flags versions order them as the registry did.
async fn flags_race(files: &FilesService, js: &async_nats::jetstream::Context, path: &str) {
    let caller = writer(NS);
    let file = files
        .upload(
            &caller,
            NS,
            path,
            b"# Flags\n\nChanged twice at once.\n",
            "",
        )
        .await
        .unwrap()
        .file
        .unwrap();
    let id = file.file_id.as_str();
    for round in 0..8 {
        files
            .set_flags(&caller, NS, id, Some(true), Some(false))
            .await
            .unwrap();
        let (disabled, hidden) = tokio::join!(
            files.set_flags(&caller, NS, id, Some(false), None),
            files.set_flags(&caller, NS, id, None, Some(true)),
        );
        disabled.unwrap();
        hidden.unwrap();
        let now = files.get_file(&caller, NS, None, Some(id)).await.unwrap();
        assert!(
            !now.enabled && now.hidden,
            "round {round}: a change was lost: enabled {}, hidden {}",
            now.enabled,
            now.hidden
        );
    }
    // An upload after them carries the flags and the count they reached.
    files
        .upload(&caller, NS, path, b"# Flags\n\nA new version.\n", "")
        .await
        .unwrap();
    let events = changes(js, NS, id).await;
    let flags: Vec<_> = events
        .iter()
        .filter(|e| e.op() == FileChangeOp::Flags)
        .collect();
    assert_eq!(flags.len(), 8 * 3);
    let mut versions: Vec<i64> = flags.iter().map(|e| e.flags_version).collect();
    versions.sort_unstable();
    versions.dedup();
    assert_eq!(
        versions,
        (1..=24).collect::<Vec<_>>(),
        "one count per change"
    );
    let newest = flags.iter().max_by_key(|e| e.flags_version).unwrap();
    assert!(!newest.enabled && newest.hidden, "{newest:?}");
    let upload = events.last().unwrap();
    assert_eq!(upload.op(), FileChangeOp::Upsert);
    assert_eq!(
        (upload.enabled, upload.hidden, upload.flags_version),
        (false, true, 24)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_racing_for_one_name_never_fail_as_internal() {
    let venv = find_venv().expect("run deploy/scripts/dev-deps.sh first");
    let dir = tempfile::tempdir().unwrap();
    let nats = EmbeddedNats::start(&venv, &dir.path().join("nats"))
        .await
        .unwrap();
    let js = kg_stores::events::connect(&nats.url).await.unwrap();
    let pg = EmbeddedPostgres::start(&venv, &dir.path().join("pg"))
        .await
        .unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("files.db").display());
    for (url, path) in [
        (sqlite.as_str(), "notes/sqlite.md"),
        (pg.url.as_str(), "notes/pg.md"),
    ] {
        let sql = SqlStore::connect(url).await.unwrap();
        let blobs = BlobStore::new(dir.path().join("blobs"));
        let files = FilesService::new(sql, blobs, js.clone(), 1 << 20)
            .await
            .unwrap();
        race(&files, path).await;
        flags_race(&files, &js, &path.replace("notes/", "flags/")).await;
        names_race(
            &files,
            path.trim_start_matches("notes/").trim_end_matches(".md"),
        )
        .await;
    }
}
