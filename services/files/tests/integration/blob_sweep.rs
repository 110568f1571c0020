//! The sweep of blobs no version needs, on SQLite and PostgreSQL: a deleted file's content and
//! a replaced version's go; a live file's current version, content another live file shares,
//! a preview branch's version and a release's version stay, and so does every blob within the
//! grace period. Content uploaded again after its blob went is stored again.

use std::time::Duration;

use kg_common::{ErrorCode, ErrorExt as _};
use kg_files::FilesService;
use kg_proto::v1::{CallerContext, FileInfo};
use kg_stores::blobs::{BlobStore, Swept};
use sha2::{Digest as _, Sha256};

use crate::common::{env, metric, put_as};

const NS: &str = "swept";

fn admin() -> CallerContext {
    crate::common::admin(NS)
}

async fn put(files: &FilesService, path: &str, body: &str) -> FileInfo {
    put_as(files, &admin(), NS, path, body).await
}

fn key(body: &str) -> String {
    hex::encode(Sha256::digest(body.as_bytes()))
}

async fn sweeps_what_no_version_needs(postgres: bool) {
    let env = env(postgres).await;
    let files = &env.files;
    let blobs = BlobStore::new(env.dir.path().join("blobs"));
    let held = async |body: &str| blobs.contains(&key(body)).await.unwrap();

    put(files, "a.md", "# A\n\nfirst draft\n").await;
    put(files, "a.md", "# A\n\nsecond draft\n").await;
    let shared = put(files, "shared-1.md", "# Shared\n\nsame bytes\n").await;
    put(files, "shared-2.md", "# Shared\n\nsame bytes\n").await;
    assert!(
        files
            .delete_file(&admin(), NS, &shared.file_id)
            .await
            .unwrap()
    );
    let gone = put(
        files,
        "gone.md",
        "# Gone\n\nshould never have been uploaded\n",
    )
    .await;
    assert!(
        files
            .delete_file(&admin(), NS, &gone.file_id)
            .await
            .unwrap()
    );
    put(files, "c.md", "# C\n\nas released\n").await;
    files
        .create_release(&admin(), NS, "1.0", "", "before c changed")
        .await
        .unwrap();
    put(files, "c.md", "# C\n\nafter the release\n").await;
    files.create_branch(&admin(), NS, "preview").await.unwrap();
    files
        .upload_to_branch(
            &admin(),
            NS,
            "preview",
            "d.md",
            b"# D\n\non the branch\n",
            "",
        )
        .await
        .unwrap();

    // Within the grace period nothing goes.
    let swept = files.sweep_blobs(Duration::from_secs(3600)).await.unwrap();
    assert_eq!((swept.kept, swept.young, swept.removed), (5, 2, 0));

    // An admin's sweep now: the deployment's admins only, and never under a minute's grace.
    let err = files.sweep_blobs_for(&admin(), 0).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    let deployment_admin = CallerContext {
        is_admin: true,
        tool: kg_common::caller::ADMIN_API_TOOL.into(),
        ..admin()
    };
    let err = files
        .sweep_blobs_for(&deployment_admin, 59)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert!(err.to_string().contains("at least 60"), "{err}");
    let swept = files.sweep_blobs_for(&deployment_admin, 0).await.unwrap();
    assert_eq!(
        (swept.kept, swept.within_grace, swept.removed),
        (5, 2, 0),
        "0 is the least grace, a minute"
    );

    let swept = files.sweep_blobs(Duration::ZERO).await.unwrap();
    assert_eq!(
        swept,
        Swept {
            kept: 5,
            young: 0,
            removed: 2,
            removed_bytes: ("# A\n\nfirst draft\n".len()
                + "# Gone\n\nshould never have been uploaded\n".len())
                as u64,
        }
    );
    assert!(!held("# A\n\nfirst draft\n").await, "a replaced version");
    assert!(
        !held("# Gone\n\nshould never have been uploaded\n").await,
        "a deleted file"
    );
    assert!(held("# A\n\nsecond draft\n").await);
    assert!(
        held("# Shared\n\nsame bytes\n").await,
        "a live file shares the deleted one's content"
    );
    assert!(
        held("# C\n\nas released\n").await,
        "release 1.0 names this version"
    );
    assert!(held("# C\n\nafter the release\n").await);
    assert!(
        held("# D\n\non the branch\n").await,
        "the preview branch holds it"
    );

    // Exported for dashboards and an alert on a sweep that keeps failing.
    assert_eq!(metric("kgmesh_blobs_swept_total"), Some(2.0));
    assert_eq!(
        metric("kgmesh_blob_bytes_swept_total"),
        Some(swept.removed_bytes as f64)
    );
    assert!(metric("kgmesh_blob_sweep_completed_timestamp_seconds").is_some_and(|at| at > 1.7e9));

    // The same content uploaded again is stored again, and kept.
    let back = put(
        files,
        "gone.md",
        "# Gone\n\nshould never have been uploaded\n",
    )
    .await;
    assert!(held("# Gone\n\nshould never have been uploaded\n").await);
    assert_eq!(files.sweep_blobs(Duration::ZERO).await.unwrap().removed, 0);
    assert_eq!(back.path, "gone.md");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeps_what_no_version_needs_on_sqlite() {
    sweeps_what_no_version_needs(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeps_what_no_version_needs_on_postgres() {
    sweeps_what_no_version_needs(true).await;
}
