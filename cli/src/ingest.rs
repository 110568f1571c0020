//! `kgmesh ingest`: upload a folder into a namespace and wait until every file
//! is indexed or failed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::client::{AdminClient, Refused, RequestBody};

/// Files uploaded at once.
const UPLOAD_CONCURRENCY: usize = 4;
/// Tries of one upload while the gateway or a service behind it is away (a restart, a
/// rollout): 1 s, 2 s, then 4 s apart. Past them the ingest stops, as for any outage.
const UPLOAD_TRIES: u32 = 4;
const UPLOAD_RETRY_FIRST: Duration = Duration::from_secs(1);

/// What happened to one ingest.
#[derive(Debug, Default)]
pub struct IngestReport {
    /// Files uploaded with new content.
    pub uploaded: usize,
    /// Files whose content was already current.
    pub unchanged: usize,
    /// Files whose content was current but whose indexing had failed: queued again.
    pub retried: usize,
    /// Files indexed.
    pub indexed: usize,
    /// Files kept without indexing: a type kgmesh reads no text from (an image, an archive).
    pub stored: usize,
    /// Files of the namespace deleted because the folder no longer holds them (`--delete`).
    pub deleted: Vec<String>,
    /// Files of the folder left out by `--exclude`.
    pub excluded: usize,
    /// Hidden entries of the folder (files and folders named `.*`) left out; `--hidden` takes
    /// them in.
    pub hidden: usize,
    /// Files that failed, with the reason.
    pub failed: Vec<(String, String)>,
}

/// Where an ingest puts the files, and whether it removes what the folder no longer holds.
#[derive(Debug, Clone, Default)]
pub struct IngestOptions {
    /// The namespace folder the files go under (`team/docs`), or its root.
    pub into: Option<String>,
    /// Delete the namespace's files under `into` that the folder does not hold.
    pub delete: bool,
    /// Globs of paths (relative to the folder) neither uploaded nor deleted.
    pub exclude: Vec<String>,
    /// Take in hidden entries (named `.*`) too; without it they are neither uploaded nor
    /// deleted.
    pub include_hidden: bool,
    /// How long to wait for indexing.
    pub timeout: Duration,
}

/// `--exclude` patterns, gitignore-like: one without `/` matches a file name at any depth
/// (`*.png`), one with `/` the whole path from the folder (`drafts/**`, `/README.md`); `*`
/// stays within a name, `**` crosses folders.
#[derive(Debug)]
pub struct Excludes {
    names: globset::GlobSet,
    paths: globset::GlobSet,
}

impl Excludes {
    /// Compiles the patterns; a malformed one is refused naming it.
    pub fn new(patterns: &[String]) -> anyhow::Result<Excludes> {
        let mut names = globset::GlobSetBuilder::new();
        let mut paths = globset::GlobSetBuilder::new();
        for pattern in patterns {
            let anchored = pattern.trim_start_matches('/');
            let glob = globset::GlobBuilder::new(anchored)
                .literal_separator(true)
                .build()
                .with_context(|| format!("--exclude `{pattern}` is not a glob"))?;
            if pattern.contains('/') {
                paths.add(glob);
            } else {
                names.add(glob);
            }
        }
        Ok(Excludes {
            names: names.build()?,
            paths: paths.build()?,
        })
    }

    /// Whether `relative` (a `/`-separated path inside the folder) is left out.
    pub fn excludes(&self, relative: &str) -> bool {
        let name = relative.rsplit('/').next().unwrap_or(relative);
        self.names.is_match(name) || self.paths.is_match(relative)
    }
}

/// `--into` as a path prefix: `team/docs` and `/team/docs/` both give `team/docs/`; empty
/// segments, `.` and `..` are refused, since the server would refuse every file under them.
pub fn folder_prefix(into: Option<&str>) -> anyhow::Result<String> {
    let Some(into) = into.map(|i| i.trim_matches('/')).filter(|i| !i.is_empty()) else {
        return Ok(String::new());
    };
    if into
        .split('/')
        .any(|segment| segment.is_empty() || segment == "." || segment == "..")
    {
        bail!("--into `{into}`: name a folder such as team/docs, without empty, `.` or `..` parts");
    }
    Ok(format!("{into}/"))
}

/// What a folder holds for an upload.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    /// Files with their `/`-separated paths relative to the folder.
    pub(crate) files: Vec<(PathBuf, String)>,
    /// Files that cannot be uploaded as they are, with the reason: their path is not UTF-8.
    pub(crate) skipped: Vec<(String, String)>,
    /// Hidden entries left out (a hidden folder counts once, whatever it holds).
    pub(crate) hidden: usize,
}

/// Whether a name is hidden by the Unix convention (`.git`, `.env`, `.DS_Store`).
fn is_hidden(name: &str) -> bool {
    name.starts_with('.')
}

/// Whether a `/`-separated path inside the folder passes through a hidden entry.
fn in_hidden_entry(relative: &str) -> bool {
    relative.split('/').any(is_hidden)
}

/// The namespace path of a file at `relative` inside the folder, exactly as named there; or
/// (the name as printable text, why it is skipped). A name the server would refuse or change
/// (control characters, which URLs also drop; a backslash, which is not a separator here;
/// white space at either end of the path) is skipped: uploaded under another name, it would overwrite
/// a file of that name, and `--delete` would remove it as a file the folder no longer holds.
fn namespace_path(relative: &Path) -> Result<String, (String, String)> {
    let printable = || relative.to_string_lossy().escape_debug().to_string();
    let Some(utf8) = relative.to_str() else {
        return Err((
            printable(),
            "skipped: the path is not UTF-8; rename it to upload it".to_owned(),
        ));
    };
    let path = if std::path::MAIN_SEPARATOR == '\\' {
        utf8.replace('\\', "/")
    } else {
        utf8.to_owned()
    };
    let reason = match kg_common::access::normalize_path(&path) {
        Ok(normal) if normal == path => return Ok(path),
        Ok(_) => "the path starts or ends with white space, which the server trims".to_owned(),
        Err(kg_common::access::NameError::Path { reason, .. }) => reason.to_owned(),
        Err(err) => err.to_string(),
    };
    Err((
        printable(),
        format!("skipped: {reason}; rename it to upload it"),
    ))
}

/// Files under `root` with their `/`-separated relative paths; symbolic links are not
/// followed, and hidden entries are left out (counted) unless `include_hidden`.
pub(crate) fn collect_files(root: &Path, include_hidden: bool) -> anyhow::Result<Collected> {
    let metadata =
        std::fs::metadata(root).with_context(|| format!("cannot read {}", root.display()))?;
    if metadata.is_file() {
        let name = root.file_name().context("the file has no name")?;
        let (files, skipped) = match namespace_path(Path::new(name)) {
            Ok(path) => (vec![(root.to_path_buf(), path)], Vec::new()),
            Err(skipped) => (Vec::new(), vec![skipped]),
        };
        return Ok(Collected {
            files,
            skipped,
            hidden: 0,
        });
    }
    let mut collected = Collected::default();
    let mut hidden = 0usize;
    for entry in walkdir::WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| {
            let left_out =
                !include_hidden && e.depth() > 0 && is_hidden(&e.file_name().to_string_lossy());
            hidden += usize::from(left_out);
            !left_out
        })
    {
        // walkdir's error already names the path and repeats its I/O error as its source.
        let entry = entry.map_err(|err| {
            let path = err.path().unwrap_or(root).display().to_string();
            match err.io_error() {
                Some(io) => anyhow::anyhow!("cannot read {path}: {io}"),
                None => anyhow::anyhow!("cannot read {path}: {err}"),
            }
        })?;
        if !entry.file_type().is_file() {
            continue;
        }
        let relative = entry.path().strip_prefix(root)?;
        match namespace_path(relative) {
            Ok(path) => collected.files.push((entry.path().to_path_buf(), path)),
            Err(skipped) => collected.skipped.push(skipped),
        }
    }
    collected.hidden = hidden;
    Ok(collected)
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

/// What a folder holds for one ingest, with `--into` and `--exclude` applied.
struct Prepared {
    prefix: String,
    excludes: Excludes,
    /// Local file and namespace path of each file to upload.
    files: Vec<(PathBuf, String)>,
    /// Namespace paths that cannot be uploaded, with why.
    skipped: Vec<(String, String)>,
    excluded: usize,
    hidden: usize,
    /// Whether the namespace's hidden paths are the folder's to mirror (`--hidden`).
    include_hidden: bool,
    /// Every namespace path the folder holds, uploadable or not: a file refused this time
    /// keeps what an earlier ingest stored.
    held: std::collections::HashSet<String>,
}

fn prepare(root: &Path, options: &IngestOptions) -> anyhow::Result<Prepared> {
    let prefix = folder_prefix(options.into.as_deref())?;
    let excludes = Excludes::new(&options.exclude)?;
    if options.delete && root.is_file() {
        bail!(
            "--delete needs a folder: it removes the files the folder no longer holds, and {} is one file",
            root.display()
        );
    }
    let Collected {
        mut files,
        mut skipped,
        hidden,
    } = collect_files(root, options.include_hidden)?;
    if files.is_empty() && skipped.is_empty() {
        bail!("no files found under {}", root.display());
    }
    let found = files.len() + skipped.len();
    files.retain(|(_, relative)| !excludes.excludes(relative));
    skipped.retain(|(relative, _)| !excludes.excludes(relative));
    let excluded = found - files.len() - skipped.len();
    let files: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|(local, relative)| (local, format!("{prefix}{relative}")))
        .collect();
    let skipped: Vec<(String, String)> = skipped
        .into_iter()
        .map(|(relative, reason)| (format!("{prefix}{relative}"), reason))
        .collect();
    let held = files
        .iter()
        .map(|(_, path)| path.clone())
        .chain(skipped.iter().map(|(path, _)| path.clone()))
        .collect();
    Ok(Prepared {
        prefix,
        excludes,
        files,
        skipped,
        excluded,
        hidden,
        include_hidden: options.include_hidden,
        held,
    })
}

/// What an ingest would do (`--dry-run`); nothing is uploaded, created or deleted.
#[derive(Debug, Default)]
pub struct IngestPlan {
    /// Whether the namespace exists and this token reads it (else every file is new).
    pub namespace_exists: bool,
    /// Files new to the namespace or with other content.
    pub upload: Vec<String>,
    /// Files the namespace holds with the same content.
    pub unchanged: usize,
    /// Files the namespace holds with the same content whose indexing failed: the upload
    /// queues them again.
    pub retry: Vec<String>,
    /// Files `--delete` would delete.
    pub delete: Vec<String>,
    /// Files left out by `--exclude`.
    pub excluded: usize,
    /// Hidden entries left out (without `--hidden`).
    pub hidden: usize,
    /// Files that could not go in, with the reason.
    pub failed: Vec<(String, String)>,
}

/// Compares the folder with the namespace: content by SHA-256, as the registry stores it.
pub async fn plan(
    client: &AdminClient,
    root: &Path,
    namespace: &str,
    options: &IngestOptions,
) -> anyhow::Result<IngestPlan> {
    use sha2::{Digest as _, Sha256};
    kg_common::access::validate_namespace(namespace)?;
    let mut prepared = prepare(root, options)?;
    let namespace_exists = namespace_visible(client, namespace).await?;
    let listing = if namespace_exists {
        list_all(client, namespace).await?
    } else {
        Vec::new()
    };
    // path -> (content SHA-256, indexing failed)
    let stored: HashMap<&str, (&str, bool)> = listing
        .iter()
        .filter_map(|file| {
            let failed = file.get("status").and_then(Value::as_str) == Some("failed");
            Some((
                file.get("path")?.as_str()?,
                (file.get("contentSha256")?.as_str()?, failed),
            ))
        })
        .collect();
    let mut plan = IngestPlan {
        namespace_exists,
        excluded: prepared.excluded,
        hidden: prepared.hidden,
        failed: std::mem::take(&mut prepared.skipped),
        ..IngestPlan::default()
    };
    for (local, path) in std::mem::take(&mut prepared.files) {
        match tokio::fs::read(&local).await {
            Ok(bytes) => {
                let sha = hex::encode(Sha256::digest(&bytes));
                match stored.get(path.as_str()) {
                    Some(&(stored_sha, false)) if stored_sha == sha => plan.unchanged += 1,
                    Some(&(stored_sha, true)) if stored_sha == sha => plan.retry.push(path),
                    _ => plan.upload.push(path),
                }
            }
            Err(err) => plan.failed.push((path, format!("cannot read it: {err}"))),
        }
    }
    if options.delete {
        plan.delete = stale_paths(&listing, &prepared);
    }
    plan.upload.sort();
    plan.retry.sort();
    plan.delete.sort();
    plan.failed.sort();
    Ok(plan)
}

/// The namespace's files under the prefix the folder does not hold. Excluded paths are kept
/// (an excluded path is the folder's to keep out, not the namespace's to lose), and so are
/// hidden ones unless `--hidden` read them: the folder's hidden entries were not looked at.
fn stale_paths(listing: &[Value], prepared: &Prepared) -> Vec<String> {
    listing
        .iter()
        .filter_map(|file| file.get("path").and_then(Value::as_str))
        .filter(|path| {
            path.strip_prefix(prepared.prefix.as_str())
                .is_some_and(|relative| {
                    !prepared.excludes.excludes(relative)
                        && (prepared.include_hidden || !in_hidden_entry(relative))
                })
                && !prepared.held.contains(*path)
        })
        .map(str::to_owned)
        .collect()
}

/// Uploads `root` into `namespace` (created if missing), deletes what it no longer holds when
/// asked, and waits for indexing.
pub async fn ingest(
    client: &AdminClient,
    root: &Path,
    namespace: &str,
    options: &IngestOptions,
) -> anyhow::Result<IngestReport> {
    kg_common::access::validate_namespace(namespace)?;
    let mut prepared = prepare(root, options)?;
    ensure_namespace(client, namespace).await?;

    let mut report = IngestReport {
        failed: std::mem::take(&mut prepared.skipped),
        excluded: prepared.excluded,
        hidden: prepared.hidden,
        ..IngestReport::default()
    };
    let files = std::mem::take(&mut prepared.files);
    let bar = progress(files.len() as u64, "uploading");
    let uploads = futures::stream::iter(files.into_iter().map(|(local, relative)| {
        let client = client.clone();
        let namespace = namespace.to_owned();
        async move {
            let bytes = match tokio::fs::read(&local).await {
                Ok(bytes) => bytes,
                Err(err) => return Ok((relative, Err(format!("cannot read it: {err}")))),
            };
            let mut segments = vec!["namespaces", namespace.as_str(), "files"];
            segments.extend(relative.split('/'));
            let url = client.url(&segments)?;
            match put_file(&client, url, bytes, UPLOAD_RETRY_FIRST).await {
                Ok(answer) => anyhow::Ok((relative, Ok(answer))),
                Err(err) => match err.downcast_ref::<Refused>() {
                    Some(refused) if refuses_only_this_file(refused.status) => {
                        let reason = format!("refused: {}", refused.detail);
                        Ok((relative, Err(reason)))
                    }
                    _ => Err(err.context(format!("uploading {relative}"))),
                },
            }
        }
    }))
    .buffer_unordered(UPLOAD_CONCURRENCY);
    tokio::pin!(uploads);

    // path -> version id we wait for
    let mut waiting: HashMap<String, String> = HashMap::new();
    while let Some(result) = uploads.next().await {
        let (path, answer) = result?;
        bar.inc(1);
        let answer = match answer {
            Ok(answer) => answer,
            Err(reason) => {
                report.failed.push((path, reason));
                continue;
            }
        };
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
        let requeued = answer
            .get("requeued")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if changed {
            report.uploaded += 1;
        } else if requeued {
            report.retried += 1;
        } else {
            report.unchanged += 1;
        }
        match status {
            "indexed" => report.indexed += 1,
            "stored" => report.stored += 1,
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

    if options.delete {
        delete_missing(client, namespace, &prepared, &mut report).await?;
    }

    let outcome = wait_indexed(client, namespace, waiting, options.timeout).await?;
    report.indexed += outcome.indexed;
    report.stored += outcome.stored;
    report.failed.extend(outcome.failed);
    report.failed.sort();
    report.deleted.sort();
    Ok(report)
}

/// What [`wait_indexed`] saw become of the versions it waited for.
#[derive(Debug, Default)]
pub struct Indexed {
    /// Versions indexed.
    pub indexed: usize,
    /// Versions kept without indexing (a type kgmesh reads no text from).
    pub stored: usize,
    /// Versions whose indexing failed, with the reason, by path.
    pub failed: Vec<(String, String)>,
}

/// Waits until each file in `waiting` (path -> version id) is indexed, stored or failed at that
/// version, polling the namespace's listing; fails after `timeout` naming what is left. A
/// file deleted or replaced by another upload meanwhile is no longer waited for (nor counted).
pub async fn wait_indexed(
    client: &AdminClient,
    namespace: &str,
    mut waiting: HashMap<String, String>,
    timeout: Duration,
) -> anyhow::Result<Indexed> {
    let mut outcome = Indexed::default();
    let bar = progress(waiting.len() as u64, "indexing");
    let deadline = Instant::now() + timeout;
    while !waiting.is_empty() {
        let listed = Instant::now();
        let files = list_all(client, namespace).await?;
        let pause = poll_pause(listed.elapsed());
        let mut listed_paths = std::collections::HashSet::new();
        for file in files {
            let path = file.get("path").and_then(Value::as_str).unwrap_or_default();
            let Some(version) = waiting.get(path) else {
                continue;
            };
            listed_paths.insert(path.to_owned());
            if file.get("versionId").and_then(Value::as_str) != Some(version.as_str()) {
                waiting.remove(path);
                bar.inc(1);
                continue;
            }
            match file.get("status").and_then(Value::as_str) {
                Some("indexed") => outcome.indexed += 1,
                Some("stored") => outcome.stored += 1,
                Some("failed") => outcome.failed.push((
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
        waiting.retain(|path, _| listed_paths.contains(path));
        if waiting.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bar.finish_and_clear();
            let mut pending: Vec<&String> = waiting.keys().collect();
            pending.sort();
            bail!(
                "{} file(s) still not indexed after {:?} (first: {}); check the indexer's log",
                pending.len(),
                timeout,
                pending.first().map(|s| s.as_str()).unwrap_or_default()
            );
        }
        tokio::time::sleep(pause).await;
    }
    bar.finish_and_clear();
    Ok(outcome)
}

/// Deletes the namespace's files under the prefix that the folder does not hold
/// ([`stale_paths`]). Only files this token can list are candidates, and each delete is
/// checked by the server like any other; one it refuses is reported, not fatal.
async fn delete_missing(
    client: &AdminClient,
    namespace: &str,
    prepared: &Prepared,
    report: &mut IngestReport,
) -> anyhow::Result<()> {
    let stale = stale_paths(&list_all(client, namespace).await?, prepared);
    let bar = progress(stale.len() as u64, "deleting");
    for path in stale {
        let mut segments = vec!["namespaces", namespace, "files"];
        segments.extend(path.split('/'));
        match client.delete(&segments).await {
            Ok(_) => report.deleted.push(path),
            Err(err) => match err.downcast_ref::<Refused>() {
                Some(refused) if refuses_only_this_file(refused.status) => report
                    .failed
                    .push((path, format!("not deleted: {}", refused.detail))),
                // Gone already (another ingest, an admin): what --delete wanted.
                Some(refused) if refused.status == StatusCode::NOT_FOUND => {}
                _ => return Err(err.context(format!("deleting {path}"))),
            },
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(())
}

/// Uploads one file, again after `pause` (doubling) while the answer is an outage. An upload
/// is safe to repeat: the same content is the same version, and one that was stored answers
/// "unchanged" the second time.
async fn put_file(
    client: &AdminClient,
    url: reqwest::Url,
    bytes: Vec<u8>,
    mut pause: Duration,
) -> anyhow::Result<Value> {
    let mut tried = 1;
    loop {
        let body = Some(RequestBody::Bytes(bytes.clone()));
        match client.send::<Value>(Method::PUT, url.clone(), body).await {
            Err(err) if tried < UPLOAD_TRIES && is_outage(&err) => {
                tokio::time::sleep(pause).await;
                pause *= 2;
                tried += 1;
            }
            answered => return answered,
        }
    }
}

/// Whether a failed request met an outage that may pass (502, 503 or 504, or no answer at
/// all) rather than a refusal.
pub fn is_outage(err: &anyhow::Error) -> bool {
    if let Some(refused) = err.downcast_ref::<Refused>() {
        return matches!(
            refused.status,
            StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
        );
    }
    err.chain().any(|cause| {
        cause
            .downcast_ref::<reqwest::Error>()
            .is_some_and(|e| !e.is_builder())
    })
}

/// Whether a refused upload says something about that file alone (its size, path, type, or
/// the caller's right to write there), so the other files still go up. Anything else (a
/// missing namespace, an outage, too many requests) would refuse every file: the ingest stops.
fn refuses_only_this_file(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_REQUEST
            | StatusCode::FORBIDDEN
            | StatusCode::CONFLICT
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::UNSUPPORTED_MEDIA_TYPE
            | StatusCode::UNPROCESSABLE_ENTITY
    )
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

/// Whether `namespace` exists and this token may read it (an admin sees every namespace,
/// anyone else those it may read).
async fn namespace_visible(client: &AdminClient, namespace: &str) -> anyhow::Result<bool> {
    let visible = client.get(&["namespaces"], &[]).await?;
    Ok(visible
        .get("namespaces")
        .and_then(Value::as_array)
        .is_some_and(|list| {
            list.iter()
                .any(|n| n.get("name").and_then(Value::as_str) == Some(namespace))
        }))
}

async fn ensure_namespace(client: &AdminClient, namespace: &str) -> anyhow::Result<()> {
    if namespace_visible(client, namespace).await? {
        return Ok(());
    }
    match client
        .post(
            &["namespaces"],
            json!({"name": namespace, "description": ""}),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Only an admin creates namespaces.
        Err(err) if refused_with(&err, StatusCode::FORBIDDEN) => bail!(
            "namespace `{namespace}` does not exist or this token may not read it; an admin \
             creates it (`kgmesh ns create {namespace}`) and grants write on it \
             (`kgmesh grant put --principal ... --namespace {namespace} --permission write`)"
        ),
        Err(err) => Err(err.context(format!("creating namespace `{namespace}`"))),
    }
}

/// Whether `err` is the gateway refusing a request with `status`.
fn refused_with(err: &anyhow::Error, status: StatusCode) -> bool {
    err.downcast_ref::<Refused>()
        .is_some_and(|refused| refused.status == status)
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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A gateway answering each PUT with the next of `statuses` (the last one for ever); the
    /// number of PUTs it saw.
    async fn gateway_answering(
        statuses: Vec<u16>,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let seen = Arc::new(AtomicUsize::new(0));
        let counted = seen.clone();
        let app = axum::Router::new().fallback(move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            let status = statuses[n.min(statuses.len() - 1)];
            async move {
                let body =
                    serde_json::json!({"code": "unavailable", "message": "x", "changed": true});
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    axum::Json(body),
                )
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (addr, seen)
    }

    /// A service restarting behind the gateway (503 for a moment) costs an ingest a pause, not
    /// its run; an outage that lasts still stops it, and a refusal is never sent again.
    #[tokio::test]
    async fn an_upload_is_sent_again_through_a_short_outage_only() {
        use std::sync::atomic::Ordering;
        let pause = Duration::from_millis(5);
        let upload = async |statuses: Vec<u16>| {
            let (addr, seen) = gateway_answering(statuses).await;
            let client = AdminClient::new(&addr, "kg_pat_test", None).unwrap();
            let url = client.url(&["namespaces", "ns", "files", "a.md"]).unwrap();
            let answer = put_file(&client, url, b"# A\n".to_vec(), pause).await;
            (answer, seen.load(Ordering::SeqCst))
        };
        let (answer, puts) = upload(vec![503, 503, 200]).await;
        assert!(answer.is_ok(), "{answer:?}");
        assert_eq!(puts, 3);
        let (answer, puts) = upload(vec![503]).await;
        let refused = answer.unwrap_err();
        assert_eq!(
            refused.downcast_ref::<Refused>().unwrap().status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(puts, UPLOAD_TRIES as usize);
        let (answer, puts) = upload(vec![413]).await;
        assert!(answer.is_err());
        assert_eq!(puts, 1, "a refusal is not sent again");
    }

    #[test]
    fn excludes_match_names_anywhere_and_paths_from_the_folder() {
        let patterns = ["*.png", "drafts/**", "/top.md"].map(String::from);
        let excludes = Excludes::new(&patterns).unwrap();
        for left_out in [
            "logo.png",
            "img/a/logo.png",
            "drafts/x.md",
            "drafts/a/b.md",
            "top.md",
        ] {
            assert!(excludes.excludes(left_out), "{left_out}");
        }
        for kept in ["logo.png.md", "a/drafts/x.md", "sub/top.md", "drafts.md"] {
            assert!(!excludes.excludes(kept), "{kept}");
        }
        assert!(Excludes::new(&["a[".to_owned()]).is_err());
    }

    #[test]
    fn into_becomes_one_folder_prefix() {
        for (into, prefix) in [
            (None, ""),
            (Some(""), ""),
            (Some("/"), ""),
            (Some("team"), "team/"),
            (Some("/team/docs/"), "team/docs/"),
        ] {
            assert_eq!(folder_prefix(into).unwrap(), prefix, "{into:?}");
        }
        for bad in ["a//b", "./a", "a/..", "../x"] {
            assert!(folder_prefix(Some(bad)).is_err(), "{bad}");
        }
    }

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
