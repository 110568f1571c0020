//! `kgmesh file`: list a namespace's files, flip `enabled`/`hidden`, delete, reindex; and
//! `kgmesh blobs sweep`, the blob store's content (and the registry's rows) no version needs
//! removed now.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::{ArgAction, ArgGroup, Subcommand};
use serde_json::{Value, json};

use super::Remote;

/// Most pages `file list` follows before it stops (a server bug guard).
const MAX_PAGES: usize = 10_000;

#[derive(Subcommand)]
pub(crate) enum FileCommand {
    /// List files, following every page.
    List {
        #[arg(long)]
        namespace: String,
        /// Only files under this folder, e.g. `handbook/`.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Include files flagged hidden.
        #[arg(long)]
        include_hidden: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Set a file's flags: disabled or hidden files are unreadable to readers.
    #[command(group(ArgGroup::new("flags").required(true).multiple(true).args(["enabled", "hidden"])))]
    Set {
        #[arg(long)]
        namespace: String,
        /// The file's path in the namespace, e.g. `handbook/leave.md`.
        #[arg(long)]
        path: String,
        #[arg(long, action = ArgAction::Set, value_name = "true|false")]
        enabled: Option<bool>,
        #[arg(long, action = ArgAction::Set, value_name = "true|false")]
        hidden: Option<bool>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Delete a file and everything indexed from it.
    Delete {
        #[arg(long)]
        namespace: String,
        #[arg(long)]
        path: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Index files again from their stored content, rewriting graph, vectors and entities
    /// (after a store was lost or restored, an upgrade, or failures). Needs admin on the folder.
    Reindex {
        #[arg(long)]
        namespace: String,
        /// Only files under this folder, e.g. `handbook/`.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Only files whose indexing failed.
        #[arg(long)]
        failed: bool,
        /// Wait until every queued file is indexed or failed; exit code 3 if any failed.
        #[arg(long)]
        wait: bool,
        /// With --wait, give up after this many seconds.
        #[arg(long, default_value_t = 3600)]
        timeout_secs: u64,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Subcommand)]
pub(crate) enum BlobsCommand {
    /// Remove now the stored content no version needs (deleted files, replaced versions; a
    /// preview branch's or a release's stay), and the registry rows of versions nothing names,
    /// as the hourly sweep does. Needs a deployment admin.
    Sweep {
        /// Keep content stored or uploaded again within this many seconds (at least 60).
        #[arg(long, default_value_t = 60)]
        grace_seconds: u64,
        #[command(flatten)]
        remote: Remote,
    },
}

pub(crate) async fn blobs(command: BlobsCommand) -> anyhow::Result<()> {
    match command {
        BlobsCommand::Sweep {
            grace_seconds,
            remote,
        } => {
            let swept = remote
                .client()?
                .post(&["blobs", "sweep"], json!({"graceSeconds": grace_seconds}))
                .await?;
            remote.print(&swept)
        }
    }
}

/// `namespaces/<ns>/files/<path segments...>`: each segment of the path is its
/// own URL segment, so `/` is not percent-encoded. The path is checked as the
/// server checks it first: a URL would resolve `a/../b.md` to `b.md` and act on
/// another file than the one named.
pub(crate) fn file_segments(namespace: &str, path: &str) -> anyhow::Result<Vec<String>> {
    let path = kg_common::access::normalize_path(path)?;
    let mut segments = vec![
        "namespaces".to_owned(),
        namespace.to_owned(),
        "files".to_owned(),
    ];
    segments.extend(path.split('/').map(str::to_owned));
    Ok(segments)
}

/// Borrows owned URL segments for the client's `&[&str]` calls.
pub(crate) fn segment_refs(segments: &[String]) -> Vec<&str> {
    segments.iter().map(String::as_str).collect()
}

pub(crate) async fn file(command: FileCommand) -> anyhow::Result<ExitCode> {
    match command {
        FileCommand::List {
            namespace,
            prefix,
            include_hidden,
            remote,
        } => list(&namespace, &prefix, include_hidden, &remote).await?,
        FileCommand::Set {
            namespace,
            path,
            enabled,
            hidden,
            remote,
        } => {
            let mut body = serde_json::Map::new();
            if let Some(enabled) = enabled {
                body.insert("enabled".into(), json!(enabled));
            }
            if let Some(hidden) = hidden {
                body.insert("hidden".into(), json!(hidden));
            }
            let v = remote
                .client()?
                .patch(
                    &segment_refs(&file_segments(&namespace, &path)?),
                    Value::Object(body),
                )
                .await?;
            remote.print(&v)?;
        }
        FileCommand::Delete {
            namespace,
            path,
            remote,
        } => {
            let v = remote
                .client()?
                .delete(&segment_refs(&file_segments(&namespace, &path)?))
                .await?;
            remote.print(&v)?;
        }
        FileCommand::Reindex {
            namespace,
            prefix,
            failed,
            wait,
            timeout_secs,
            remote,
        } => {
            let wait = wait.then(|| Duration::from_secs(timeout_secs));
            return reindex(&namespace, &prefix, failed, wait, &remote).await;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints every file under `prefix`, following the pages.
async fn list(
    namespace: &str,
    prefix: &str,
    include_hidden: bool,
    remote: &Remote,
) -> anyhow::Result<()> {
    let client = remote.client()?;
    let mut files: Vec<Value> = Vec::new();
    let mut cursor = String::new();
    for _ in 0..MAX_PAGES {
        let page = client
            .get(
                &["namespaces", namespace, "files"],
                &[
                    ("folderPrefix", prefix.to_owned()),
                    ("cursor", cursor.clone()),
                    ("includeHidden", include_hidden.to_string()),
                ],
            )
            .await?;
        if let Some(list) = page.get("files").and_then(Value::as_array) {
            files.extend(list.iter().cloned());
        }
        let total = page.get("total").cloned().unwrap_or(Value::Null);
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) if !next.is_empty() && next != cursor => next.clone_into(&mut cursor),
            Some(next) if !next.is_empty() => {
                bail!("the server returned the same cursor twice; stopping")
            }
            _ => return remote.print(&json!({"files": files, "total": total})),
        }
    }
    bail!("more than {MAX_PAGES} pages of files; narrow the listing with --prefix")
}

/// Queues the files, then (with `wait`) waits for each queued version's outcome.
async fn reindex(
    namespace: &str,
    prefix: &str,
    failed_only: bool,
    wait: Option<Duration>,
    remote: &Remote,
) -> anyhow::Result<ExitCode> {
    let client = remote.client()?;
    let mut queued = 0;
    // path -> version id of each file queued, to wait for
    let mut waiting: HashMap<String, String> = HashMap::new();
    let mut cursor = String::new();
    for _ in 0..MAX_PAGES {
        let page = client
            .post(
                &["namespaces", namespace, "reindex"],
                json!({"folderPrefix": prefix, "failedOnly": failed_only, "cursor": cursor}),
            )
            .await?;
        queued += page.get("queued").and_then(Value::as_i64).unwrap_or(0);
        for file in page
            .get("files")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let (Some(path), Some(version)) = (
                file.get("path").and_then(Value::as_str),
                file.get("versionId").and_then(Value::as_str),
            ) {
                waiting.insert(path.to_owned(), version.to_owned());
            }
        }
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) if !next.is_empty() && next != cursor => next.clone_into(&mut cursor),
            Some(next) if !next.is_empty() => {
                bail!("the server returned the same cursor twice; stopping")
            }
            _ => break,
        }
    }
    let Some(timeout) = wait else {
        remote.print(&json!({"namespace": namespace, "queued": queued}))?;
        return Ok(ExitCode::SUCCESS);
    };
    let outcome = kgmesh::ingest::wait_indexed(&client, namespace, waiting, timeout).await?;
    let failed: Vec<Value> = outcome
        .failed
        .iter()
        .map(|(path, reason)| json!({"path": path, "reason": reason}))
        .collect();
    remote.print(&json!({
        "namespace": namespace,
        "queued": queued,
        "indexed": outcome.indexed,
        "stored": outcome.stored,
        "failed": failed,
    }))?;
    Ok(if outcome.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn file_paths_become_url_segments() {
        assert_eq!(
            file_segments("demo", "/handbook/leave.md").unwrap(),
            ["namespaces", "demo", "files", "handbook", "leave.md"]
        );
    }

    #[test]
    fn dot_segments_are_refused_not_resolved() {
        for path in ["guide/../index.md", "../escape.md", "a/./b.md", "a//b.md"] {
            let err = file_segments("demo", path).unwrap_err().to_string();
            assert!(err.starts_with(&format!("invalid path `{path}`")), "{err}");
        }
    }
}
