//! kg_files (`FindFiles`): readable, visible files of one namespace by
//! folder, path glob and content regex.
//!
//! `name` is a glob (globset, case-insensitive): `*` stays inside one path
//! segment and `**` crosses segments. A glob without `/` matches the file
//! name (`*.md`, `*runbook*`); a glob with `/` matches the whole path, or the
//! path below `folderPrefix` (`handbook/**/*.md`). A bare word without glob
//! characters matches as a case-insensitive substring of the path.
//!
//! Without `pattern` the call lists a page; `total` counts every readable
//! file matching folder and name. With `pattern` (a case-sensitive regex;
//! `(?i)` for case-insensitive) it scans file contents in path order from the
//! cursor, within a time and a byte budget, skipping binary files and files
//! over the query size limit; the cursor resumes the scan where it stopped.
//! The name filter runs before any blob is read. Hidden files never appear,
//! not even to writers: this is the agent's view.

use std::time::Instant;

use globset::{GlobBuilder, GlobMatcher};
use kg_common::access::{normalize_folder_prefix, validate_namespace};
use kg_common::caller::access_for;
use kg_common::sanitize::sanitize_text;
use kg_proto::v1::{CallerContext, ContentMatch, FindFilesRequest, FindFilesResponse, FoundFile};
use regex::Regex;
use sha2::{Digest, Sha256};

use crate::error::{FilesError, Result};
use crate::limits::{human_bytes, human_duration};
use crate::query::blob_path;
use crate::query::sql::blocking;
use crate::query::text::{MATCH_LINE_CHARS, compile_regex, looks_binary};
use crate::service::FilesService;
use crate::store::Readable;

/// Default and largest page.
const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 200;
/// Registry rows read per round trip while paging or scanning.
const CHUNK: u32 = 256;
/// Matching lines reported per file.
const LINES_PER_FILE: usize = 3;
/// Longest name glob.
const MAX_NAME_BYTES: usize = 1024;

/// The `name` filter.
#[derive(Debug)]
pub(crate) enum NameFilter {
    All,
    Substring(String),
    Glob {
        matcher: GlobMatcher,
        whole_path: bool,
    },
}

impl NameFilter {
    pub(crate) fn parse(name: &str) -> Result<Self> {
        let name = name.trim();
        if name.is_empty() {
            return Ok(NameFilter::All);
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(FilesError::Invalid(format!(
                "name is {} bytes; the limit is {MAX_NAME_BYTES}",
                name.len()
            )));
        }
        if !name.contains(['*', '?', '[', '{']) {
            return Ok(NameFilter::Substring(name.to_lowercase()));
        }
        let glob = GlobBuilder::new(name.trim_start_matches('/'))
            .literal_separator(true)
            .case_insensitive(true)
            .build()
            .map_err(|err| FilesError::Invalid(format!("invalid name glob: {err}")))?;
        Ok(NameFilter::Glob {
            matcher: glob.compile_matcher(),
            whole_path: name.contains('/'),
        })
    }

    pub(crate) fn matches(&self, path: &str, folder_prefix: &str) -> bool {
        match self {
            NameFilter::All => true,
            NameFilter::Substring(word) => path.to_lowercase().contains(word.as_str()),
            NameFilter::Glob {
                matcher,
                whole_path: true,
            } => {
                matcher.is_match(path)
                    || (!folder_prefix.is_empty()
                        && path
                            .strip_prefix(folder_prefix)
                            .is_some_and(|below| matcher.is_match(below)))
            }
            NameFilter::Glob {
                matcher,
                whole_path: false,
            } => matcher.is_match(path.rsplit('/').next().unwrap_or(path)),
        }
    }
}

/// Where a listing or scan resumes, and how many files matched before it.
///
/// A cursor is bound to the arguments of the call that returned it: `matched`
/// counts earlier pages of *that* query, so resuming another query from it
/// would report a wrong `total` and skip files silently.
#[derive(Debug, Default, PartialEq)]
struct FindCursor {
    matched: i64,
    after: String,
}

impl FindCursor {
    fn encode(&self, query: &QueryFingerprint) -> String {
        hex::encode(format!("{}\n{}\n{}", query.0, self.matched, self.after))
    }

    fn decode(cursor: &str, query: &QueryFingerprint) -> Result<Self> {
        if cursor.is_empty() {
            return Ok(Self::default());
        }
        let text = hex::decode(cursor)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| {
                FilesError::Invalid(
                    "cursor is not one this service returned; start without a cursor".to_owned(),
                )
            })?;
        let mut parts = text.splitn(3, '\n');
        let (Some(fingerprint), Some(matched), Some(after)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(FilesError::Invalid(
                "cursor is not one this service returned; start without a cursor".to_owned(),
            ));
        };
        if fingerprint != query.0 {
            return Err(FilesError::Invalid(
                "cursor belongs to a call with other arguments; repeat the namespace, \
                 folderPrefix, name and pattern of the call that returned it, or start \
                 without a cursor"
                    .to_owned(),
            ));
        }
        // A path holds no control character (see `decode_cursor` in the service).
        match matched.parse() {
            Ok(matched) if !after.chars().any(char::is_control) => Ok(FindCursor {
                matched,
                after: after.to_owned(),
            }),
            _ => Err(FilesError::Invalid(
                "cursor is not one this service returned; start without a cursor".to_owned(),
            )),
        }
    }
}

/// A short digest of the arguments that decide which files a query matches.
#[derive(Debug)]
struct QueryFingerprint(String);

impl QueryFingerprint {
    fn of(namespace: &str, folder: &str, name: &str, pattern: &str) -> Self {
        let text = format!("{namespace}\0{folder}\0{name}\0{pattern}");
        QueryFingerprint(hex::encode(&Sha256::digest(text.as_bytes())[..8]))
    }
}

/// Why a content scan stopped before the end of the namespace.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stop {
    Limit,
    Time,
    Bytes,
}

/// A content scan in progress; moved into and out of blocking tasks.
struct Scan {
    regex: Regex,
    blobs: kg_stores::blobs::BlobStore,
    max_file_bytes: u64,
    limit: usize,
    deadline: Instant,
    bytes_left: u64,
    found: Vec<FoundFile>,
    scanned: i64,
    skipped_large: i64,
    /// The last path consumed (scanned or skipped).
    position: String,
    stop: Option<Stop>,
}

impl Scan {
    fn run_chunk(&mut self, candidates: Vec<Readable>) {
        for readable in candidates {
            if self.found.len() >= self.limit {
                self.stop = Some(Stop::Limit);
                return;
            }
            // The first file of a call is always scanned, so every call progresses.
            if self.scanned > 0 && Instant::now() >= self.deadline {
                self.stop = Some(Stop::Time);
                return;
            }
            let size = u64::try_from(readable.file.size).unwrap_or(u64::MAX);
            if size > self.max_file_bytes {
                self.skipped_large += 1;
                self.position = readable.file.path;
                continue;
            }
            if self.scanned > 0 && size > self.bytes_left {
                self.stop = Some(Stop::Bytes);
                return;
            }
            let bytes = match blob_path(&self.blobs, &readable.blob_key)
                .and_then(|p| std::fs::read(p).map_err(FilesError::from))
            {
                Ok(bytes) => bytes,
                Err(err) => {
                    tracing::warn!(path = %readable.file.path, error = %err, "blob unreadable; not scanned");
                    self.position = readable.file.path;
                    continue;
                }
            };
            self.bytes_left = self.bytes_left.saturating_sub(bytes.len() as u64);
            self.scanned += 1;
            self.position = readable.file.path.clone();
            if looks_binary(&bytes) {
                continue;
            }
            let matches = first_matching_lines(&self.regex, &String::from_utf8_lossy(&bytes));
            if !matches.is_empty() {
                self.found.push(FoundFile {
                    file: Some(readable.file),
                    matches,
                });
            }
        }
    }

    fn stop_reason(&self, scan_time: std::time::Duration, scan_bytes: u64) -> String {
        let mut notes = Vec::new();
        match self.stop {
            Some(Stop::Time) => notes.push(format!(
                "time budget of {} reached; pass nextCursor to continue",
                human_duration(scan_time)
            )),
            Some(Stop::Bytes) => notes.push(format!(
                "byte budget of {} reached; pass nextCursor to continue",
                human_bytes(scan_bytes)
            )),
            Some(Stop::Limit) | None => {}
        }
        if self.skipped_large > 0 {
            notes.push(format!(
                "skipped_large: {} file(s) over {} were not scanned; read them with kg_file format text and a line window",
                self.skipped_large,
                human_bytes(self.max_file_bytes)
            ));
        }
        notes.join("; ")
    }
}

/// The first lines (1-based numbers) holding a match, one entry per line.
fn first_matching_lines(regex: &Regex, text: &str) -> Vec<ContentMatch> {
    let mut out: Vec<ContentMatch> = Vec::new();
    let mut counted_to = 0usize;
    let mut line_number = 1i64;
    for found in regex.find_iter(text) {
        let start = found.start();
        line_number += text[counted_to..start]
            .bytes()
            .filter(|&b| b == b'\n')
            .count() as i64;
        counted_to = start;
        if out.last().is_some_and(|m| m.line_number == line_number) {
            continue;
        }
        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
        let line = text[line_start..line_end].trim_end_matches('\r');
        out.push(ContentMatch {
            line_number,
            line: sanitize_text(line, MATCH_LINE_CHARS),
        });
        if out.len() == LINES_PER_FILE {
            break;
        }
    }
    out
}

impl FilesService {
    /// kg_files: a page of readable, visible files under a folder whose path
    /// matches `name`, optionally whose content matches `pattern` (see the
    /// module docs for both).
    pub async fn find_files(
        &self,
        caller: &CallerContext,
        request: &FindFilesRequest,
    ) -> Result<FindFilesResponse> {
        let namespace = request.namespace.as_str();
        validate_namespace(namespace)?;
        let filter = access_for(caller, namespace)?;
        let folder = normalize_folder_prefix(&request.folder_prefix)?;
        let name = NameFilter::parse(&request.name)?;
        let limit = match request.limit {
            0 => DEFAULT_LIMIT,
            n if n > MAX_LIMIT => {
                return Err(FilesError::Invalid(format!(
                    "limit {n} is over the maximum of {MAX_LIMIT}"
                )));
            }
            n => n,
        } as usize;
        let query = QueryFingerprint::of(namespace, &folder, &request.name, &request.pattern);
        let cursor = FindCursor::decode(&request.cursor, &query)?;
        if request.pattern.is_empty() {
            return self
                .list_page(namespace, &folder, &name, limit, (cursor, &query), filter)
                .await;
        }
        let regex = compile_regex(&request.pattern, true)?;
        let mut scan = Scan {
            regex,
            blobs: self.blobs.clone(),
            max_file_bytes: self.limits.max_query_file_bytes,
            limit,
            deadline: Instant::now() + self.limits.scan_time,
            bytes_left: self.limits.scan_bytes,
            found: Vec::new(),
            scanned: 0,
            skipped_large: 0,
            position: cursor.after.clone(),
            stop: None,
        };
        let mut exhausted = false;
        while scan.stop.is_none() {
            let rows = self
                .store
                .scan_visible(namespace, &folder, &scan.position, CHUNK, filter)
                .await?;
            let last_row = rows.last().map(|r| r.file.path.clone());
            let full = rows.len() == CHUNK as usize;
            let candidates: Vec<Readable> = rows
                .into_iter()
                .filter(|r| name.matches(&r.file.path, &folder))
                .collect();
            if !candidates.is_empty() {
                scan = blocking(move || {
                    scan.run_chunk(candidates);
                    Ok(scan)
                })
                .await?;
            }
            if scan.stop.is_some() {
                break;
            }
            // Every row of the chunk was consumed (scanned, skipped or filtered out).
            if let Some(last) = last_row {
                scan.position = last;
            }
            if !full {
                exhausted = true;
                break;
            }
            if Instant::now() >= scan.deadline {
                scan.stop = Some(Stop::Time);
            }
        }
        let total = cursor.matched + scan.found.len() as i64;
        let next_cursor = if exhausted {
            String::new()
        } else {
            FindCursor {
                matched: total,
                after: scan.position.clone(),
            }
            .encode(&query)
        };
        Ok(FindFilesResponse {
            stopped_early: matches!(scan.stop, Some(Stop::Time | Stop::Bytes)),
            stop_reason: scan.stop_reason(self.limits.scan_time, self.limits.scan_bytes),
            files_scanned: scan.scanned,
            files: scan.found,
            next_cursor,
            total,
        })
    }

    /// A page without content matching; `total` counts all matches.
    async fn list_page(
        &self,
        namespace: &str,
        folder: &str,
        name: &NameFilter,
        limit: usize,
        (cursor, query): (FindCursor, &QueryFingerprint),
        filter: &kg_proto::v1::AccessFilter,
    ) -> Result<FindFilesResponse> {
        let total = match name {
            NameFilter::All => self.store.count_visible(namespace, folder, filter).await?,
            _ => self
                .store
                .visible_paths(namespace, folder, filter)
                .await?
                .iter()
                .filter(|p| name.matches(p, folder))
                .count() as i64,
        };
        let mut files = Vec::new();
        let mut after = cursor.after.clone();
        let mut more = false;
        'pages: loop {
            let rows = self
                .store
                .scan_visible(namespace, folder, &after, CHUNK, filter)
                .await?;
            let full = rows.len() == CHUNK as usize;
            for row in rows {
                after = row.file.path.clone();
                if !name.matches(&row.file.path, folder) {
                    continue;
                }
                if files.len() == limit {
                    more = true;
                    break 'pages;
                }
                files.push(FoundFile {
                    file: Some(row.file),
                    matches: Vec::new(),
                });
            }
            if !full {
                break;
            }
        }
        let next_cursor = match files.last().and_then(|f| f.file.as_ref()) {
            Some(last) if more => FindCursor {
                matched: cursor.matched + files.len() as i64,
                after: last.path.clone(),
            }
            .encode(query),
            _ => String::new(),
        };
        Ok(FindFilesResponse {
            files,
            next_cursor,
            total,
            stopped_early: false,
            stop_reason: String::new(),
            files_scanned: 0,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn globs_words_and_folders() {
        let md = NameFilter::parse("*.md").unwrap();
        assert!(md.matches("a/b/readme.MD", ""));
        assert!(!md.matches("a/b/readme.txt", ""));
        let deep = NameFilter::parse("**/*.md").unwrap();
        assert!(deep.matches("top.md", ""));
        assert!(deep.matches("a/b/c.md", ""));
        let one = NameFilter::parse("handbook/*.md").unwrap();
        assert!(one.matches("handbook/a.md", ""));
        assert!(!one.matches("handbook/x/a.md", ""));
        // Relative to the folder prefix too.
        let rel = NameFilter::parse("ops/*.md").unwrap();
        assert!(rel.matches("handbook/ops/a.md", "handbook/"));
        let word = NameFilter::parse("Runbook").unwrap();
        assert!(word.matches("ops/db-runbook-v2.md", ""));
        assert!(!word.matches("ops/db.md", ""));
        assert!(NameFilter::parse("a[").is_err());
        assert!(NameFilter::parse("").unwrap().matches("x", ""));
    }

    #[test]
    fn cursors_round_trip() {
        let query = QueryFingerprint::of("ns", "docs/", "*.md", "");
        let c = FindCursor {
            matched: 7,
            after: "a/b c.md".to_owned(),
        };
        assert_eq!(FindCursor::decode(&c.encode(&query), &query).unwrap(), c);
        assert!(FindCursor::decode("zz", &query).is_err());
        assert!(FindCursor::decode(&hex::encode("x"), &query).is_err());
        let forged = |rest: &str| hex::encode(format!("{}\n{rest}", query.0));
        // A path never holds a control character: a forged one is refused here.
        assert!(FindCursor::decode(&forged("0\n\0"), &query).is_err());
        assert!(FindCursor::decode(&forged("0\na\nb"), &query).is_err());
        assert!(FindCursor::decode(&forged("x\na"), &query).is_err());
    }

    #[test]
    fn a_cursor_resumes_only_the_query_that_returned_it() {
        let query = QueryFingerprint::of("ns", "docs/", "*.md", "");
        let cursor = FindCursor {
            matched: 3,
            after: "docs/c.md".to_owned(),
        }
        .encode(&query);
        for other in [
            QueryFingerprint::of("other", "docs/", "*.md", ""),
            QueryFingerprint::of("ns", "", "*.md", ""),
            QueryFingerprint::of("ns", "docs/", "*.txt", ""),
            QueryFingerprint::of("ns", "docs/", "*.md", "TODO"),
        ] {
            let err = FindCursor::decode(&cursor, &other).unwrap_err().to_string();
            assert!(err.contains("other arguments"), "{err}");
        }
    }

    #[test]
    fn matching_lines_are_numbered_once_each() {
        let re = compile_regex("(?i)alpha", true).unwrap();
        let text = "x\nalpha alpha\r\ny\nALPHA\nz\nalpha\nalpha\n";
        let lines = first_matching_lines(&re, text);
        let numbers: Vec<i64> = lines.iter().map(|m| m.line_number).collect();
        assert_eq!(numbers, vec![2, 4, 6]);
        assert_eq!(lines[0].line, "alpha alpha");
        let anchored = compile_regex("^y$", true).unwrap();
        assert_eq!(first_matching_lines(&anchored, "x\ny\nz").len(), 1);
    }
}
