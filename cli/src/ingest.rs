//! `kgmesh ingest`: upload a folder into a namespace and wait until every file
//! is indexed or failed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::Method;
use serde_json::{Value, json};

use crate::client::{AdminClient, RequestBody};

/// Files uploaded at once.
const UPLOAD_CONCURRENCY: usize = 4;

/// What happened to one ingest.
#[derive(Debug, Default)]
pub struct IngestReport {
    /// Files uploaded with new content.
    pub uploaded: usize,
    /// Files whose content was already current.
    pub unchanged: usize,
    /// Files indexed.
    pub indexed: usize,
    /// Files that failed, with the reason.
    pub failed: Vec<(String, String)>,
}

/// Files under `root` (hidden entries skipped) with their `/`-separated relative paths.
pub(crate) fn collect_files(root: &Path) -> anyhow::Result<Vec<(PathBuf, String)>> {
    if root.is_file() {
        let name = root
            .file_name()
            .and_then(|n| n.to_str())
            .context("the file name is not UTF-8")?
            .to_owned();
        return Ok(vec![(root.to_path_buf(), name)]);
    }
    let mut files = Vec::new();
    for entry in walkdir::WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| e.depth() == 0 || !e.file_name().to_string_lossy().starts_with('.'))
    {
        let entry = entry.with_context(|| format!("cannot read {}", root.display()))?;
        if !entry.file_type().is_file() {
            continue;
        }
        let relative = entry.path().strip_prefix(root)?;
        let Some(relative) = relative.to_str() else {
            bail!("{} is not a UTF-8 path", entry.path().display());
        };
        files.push((entry.path().to_path_buf(), relative.replace('\\', "/")));
    }
    Ok(files)
}

fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template("{msg:>10} [{bar:30}] {pos}/{len} {wide_msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_owned());
    bar
}

/// Uploads `root` into `namespace` (created if missing) and waits for indexing.
pub async fn ingest(
    client: &AdminClient,
    root: &Path,
    namespace: &str,
    timeout: Duration,
) -> anyhow::Result<IngestReport> {
    let files = collect_files(root)?;
    if files.is_empty() {
        bail!("no files found under {}", root.display());
    }
    ensure_namespace(client, namespace).await?;

    let bar = progress(files.len() as u64, "uploading");
    let uploads = futures::stream::iter(files.into_iter().map(|(local, relative)| {
        let client = client.clone();
        let namespace = namespace.to_owned();
        async move {
            let bytes = tokio::fs::read(&local)
                .await
                .with_context(|| format!("cannot read {}", local.display()))?;
            let mut segments = vec!["namespaces", namespace.as_str(), "files"];
            segments.extend(relative.split('/'));
            let url = client.url(&segments)?;
            let answer: Value = client
                .send(Method::PUT, url, Some(RequestBody::Bytes(bytes)))
                .await
                .with_context(|| format!("uploading {relative}"))?;
            anyhow::Ok((relative, answer))
        }
    }))
    .buffer_unordered(UPLOAD_CONCURRENCY);
    tokio::pin!(uploads);

    let mut report = IngestReport::default();
    // path -> version id we wait for
    let mut waiting: HashMap<String, String> = HashMap::new();
    while let Some(result) = uploads.next().await {
        let (path, answer) = result?;
        bar.inc(1);
        let changed = answer
            .get("changed")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let file = answer.get("file").cloned().unwrap_or(Value::Null);
        let version = file
            .get("versionId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let status = file
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if changed {
            report.uploaded += 1;
        } else {
            report.unchanged += 1;
        }
        match status {
            "indexed" => report.indexed += 1,
            "failed" => report.failed.push((
                path,
                file.get("statusReason")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            )),
            _ => {
                waiting.insert(path, version);
            }
        }
    }
    bar.finish_and_clear();

    let bar = progress(waiting.len() as u64, "indexing");
    let deadline = Instant::now() + timeout;
    while !waiting.is_empty() {
        let listed = Instant::now();
        let files = list_all(client, namespace).await?;
        let pause = poll_pause(listed.elapsed());
        for file in files {
            let path = file.get("path").and_then(Value::as_str).unwrap_or_default();
            let Some(version) = waiting.get(path) else {
                continue;
            };
            if file.get("versionId").and_then(Value::as_str) != Some(version.as_str()) {
                continue;
            }
            match file.get("status").and_then(Value::as_str) {
                Some("indexed") => report.indexed += 1,
                Some("failed") => report.failed.push((
                    path.to_owned(),
                    file.get("statusReason")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                )),
                _ => continue,
            }
            waiting.remove(path);
            bar.inc(1);
        }
        if waiting.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bar.finish_and_clear();
            let mut pending: Vec<&String> = waiting.keys().collect();
            pending.sort();
            bail!(
                "{} file(s) still not indexed after {timeout:?} (first: {}); check the indexer's log",
                pending.len(),
                pending.first().map(|s| s.as_str()).unwrap_or_default()
            );
        }
        tokio::time::sleep(pause).await;
    }
    bar.finish_and_clear();
    Ok(report)
}

/// The wait between two status listings: twenty times what the last one took, within
/// 200 ms..5 s. A listing reads every file of the namespace, so polling a big one at a
/// fixed rate would take CPU from the indexer it is waiting for; this keeps the poller's
/// share of the server near 5% whatever the namespace's size.
fn poll_pause(listing: Duration) -> Duration {
    listing
        .saturating_mul(20)
        .clamp(Duration::from_millis(200), Duration::from_secs(5))
}

async fn ensure_namespace(client: &AdminClient, namespace: &str) -> anyhow::Result<()> {
    let existing = client.get(&["namespaces"], &[]).await?;
    let exists = existing
        .get("namespaces")
        .and_then(Value::as_array)
        .is_some_and(|list| {
            list.iter()
                .any(|n| n.get("name").and_then(Value::as_str) == Some(namespace))
        });
    if !exists {
        client
            .post(
                &["namespaces"],
                json!({"name": namespace, "description": ""}),
            )
            .await
            .with_context(|| format!("creating namespace `{namespace}`"))?;
    }
    Ok(())
}

/// Every file of a namespace (hidden ones included), following cursors.
pub async fn list_all(client: &AdminClient, namespace: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = client
            .get(
                &["namespaces", namespace, "files"],
                &[
                    ("limit", "1000".to_owned()),
                    ("cursor", cursor.clone()),
                    ("includeHidden", "true".to_owned()),
                ],
            )
            .await?;
        if let Some(files) = page.get("files").and_then(Value::as_array) {
            out.extend(files.iter().cloned());
        }
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) if !next.is_empty() => cursor = next.to_owned(),
            _ => return Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_backs_off_with_the_cost_of_a_listing() {
        let ms = Duration::from_millis;
        // A small namespace lists in a few ms: poll every 200 ms, as before.
        assert_eq!(poll_pause(ms(3)), ms(200));
        // 6,000 files listed in 120 ms: wait 2.4 s, so listings take ~5% of the time.
        assert_eq!(poll_pause(ms(120)), ms(2_400));
        // However slow the listing, the wait for the last file stays bounded.
        assert_eq!(poll_pause(Duration::from_secs(60)), Duration::from_secs(5));
    }
}
