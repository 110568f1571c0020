//! `format: "text"`: an in-file regular expression, or a line window that
//! streams the blob (so it also reads files over the query size limit).

use std::fs::File;
use std::io::{BufRead, BufReader, Read as _};
use std::path::Path;
use std::time::Instant;

use kg_common::sanitize::sanitize_text;
use regex::{Regex, RegexBuilder};
use serde_json::{Value, json};

use crate::error::{FilesError, Result};
use crate::limits::human_bytes;
use crate::query::output::json_len;

/// Longest regular expression accepted, in bytes.
const MAX_PATTERN_BYTES: usize = 4096;
/// Compiled-program limit: past it a pattern is "too costly".
const REGEX_SIZE_LIMIT: usize = 1024 * 1024;
/// Lazy-DFA cache per regex.
const REGEX_DFA_LIMIT: usize = 4 * 1024 * 1024;
/// Characters kept of a matching line.
pub(crate) const MATCH_LINE_CHARS: usize = 500;
/// Characters kept of a line in a window.
const WINDOW_LINE_CHARS: usize = 2000;
/// Longest line window.
pub(crate) const MAX_WINDOW_LINES: u64 = 2000;
/// Lines of a window when only `startLine` is given.
pub(crate) const DEFAULT_WINDOW_LINES: u64 = 200;
/// Bytes sniffed for NUL to call a file binary.
const SNIFF_BYTES: usize = 8192;

/// Compiles a user pattern. `multi_line` makes `^`/`$` match at line ends
/// (for whole-file scans); compile size is capped so a pathological pattern
/// is refused up front instead of eating the scan budget.
pub(crate) fn compile_regex(pattern: &str, multi_line: bool) -> Result<Regex> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(FilesError::Invalid(format!(
            "the regular expression is {} bytes; the limit is {MAX_PATTERN_BYTES}",
            pattern.len()
        )));
    }
    RegexBuilder::new(pattern)
        .multi_line(multi_line)
        .crlf(multi_line)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_DFA_LIMIT)
        .build()
        .map_err(|err| match err {
            regex::Error::CompiledTooBig(limit) => FilesError::TooCostly(format!(
                "the regular expression is too costly: its compiled form is over {}; use fewer or smaller counted repetitions and character classes",
                human_bytes(limit as u64)
            )),
            regex::Error::Syntax(msg) => {
                FilesError::Invalid(format!("invalid regular expression: {msg}"))
            }
            other => FilesError::Invalid(format!("invalid regular expression: {other}")),
        })
}

/// Whether the bytes look binary (a NUL byte near the start).
pub(crate) fn looks_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(SNIFF_BYTES)].contains(&0)
}

fn binary_error(mime: &str) -> FilesError {
    FilesError::Invalid(format!(
        "format text needs a text file; this file is binary ({mime})"
    ))
}

fn line_json(number: u64, line: &str, chars: usize) -> Value {
    json!({"lineNumber": number, "line": sanitize_text(line.trim_end_matches('\r'), chars)})
}

/// Lines of `path` matching `regex`: the first `max_matches`, within
/// `budget` bytes, plus the total number of matching lines.
pub(crate) fn grep(
    path: &Path,
    mime: &str,
    regex: &Regex,
    max_matches: usize,
    deadline: Instant,
    budget: usize,
    timeout_text: &str,
) -> Result<Value> {
    let bytes = std::fs::read(path)?;
    if looks_binary(&bytes) {
        return Err(binary_error(mime));
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut matches = Vec::new();
    let mut used = 64;
    let mut total: u64 = 0;
    let mut truncated = false;
    for (index, line) in text.lines().enumerate() {
        if index % 1024 == 0 && Instant::now() > deadline {
            return Err(FilesError::Timeout(format!(
                "the regular expression scan ran past its time budget of {timeout_text}; use a more specific pattern"
            )));
        }
        if !regex.is_match(line) {
            continue;
        }
        total += 1;
        if truncated {
            continue;
        }
        let item = line_json(index as u64 + 1, line, MATCH_LINE_CHARS);
        let len = json_len(&item) + 1;
        if matches.len() >= max_matches || used + len > budget {
            truncated = true;
            continue;
        }
        used += len;
        matches.push(item);
    }
    Ok(json!({"matches": matches, "truncated": truncated, "totalMatches": total}))
}

/// Reads one line into `out`, keeping at most `keep` bytes of it. False at
/// the end of the input.
fn read_line_capped(reader: &mut impl BufRead, out: &mut Vec<u8>, keep: usize) -> Result<bool> {
    out.clear();
    let mut any = false;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(any);
        }
        any = true;
        let (chunk, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], i + 1),
            None => (available, available.len()),
        };
        let room = keep.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let found_newline = done > chunk.len();
        reader.consume(done);
        if found_newline {
            return Ok(true);
        }
    }
}

/// Counts the remaining lines of `reader` (a last line without a newline
/// counts), giving up at `deadline`.
fn count_rest(reader: &mut impl BufRead, deadline: Instant) -> Result<Option<u64>> {
    let mut lines = 0u64;
    let mut last = b'\n';
    loop {
        if Instant::now() > deadline {
            return Ok(None);
        }
        let available = reader.fill_buf()?;
        if available.is_empty() {
            if last != b'\n' {
                lines += 1;
            }
            return Ok(Some(lines));
        }
        lines += available.iter().filter(|&&b| b == b'\n').count() as u64;
        if let Some(&b) = available.last() {
            last = b;
        }
        let n = available.len();
        reader.consume(n);
    }
}

/// Lines `start..=end` (1-based) of `path`, streamed. `end` past the last
/// line clamps; `totalLines` is given when counting finishes before `deadline`.
pub(crate) fn window(
    path: &Path,
    mime: &str,
    start: u64,
    end: u64,
    deadline: Instant,
    budget: usize,
) -> Result<Value> {
    let mut file = File::open(path)?;
    let mut head = vec![0u8; SNIFF_BYTES];
    let sniffed = read_up_to(&mut file, &mut head)?;
    if looks_binary(&head[..sniffed]) {
        return Err(binary_error(mime));
    }
    let file = File::open(path)?;
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let keep = WINDOW_LINE_CHARS * 4 + 4;
    let mut buf = Vec::new();
    let mut lines = Vec::new();
    let mut used = 96;
    let mut number = 0u64;
    let mut last_included = start.saturating_sub(1);
    let mut cut = false;
    while number < end && read_line_capped(&mut reader, &mut buf, keep)? {
        number += 1;
        if number < start || cut {
            continue;
        }
        let line = String::from_utf8_lossy(&buf);
        let item = line_json(number, &line, WINDOW_LINE_CHARS);
        let len = json_len(&item) + 1;
        if used + len > budget {
            cut = true;
            continue;
        }
        used += len;
        last_included = number;
        lines.push(item);
    }
    let total = if number < end {
        // The file ended inside the window.
        Some(number)
    } else {
        count_rest(&mut reader, deadline)?.map(|rest| number + rest)
    };
    if let Some(total) = total
        && start > total
        && total > 0
    {
        return Err(FilesError::Invalid(format!(
            "startLine {start} is past the end of the file; it has {total} lines"
        )));
    }
    let mut result = json!({
        "startLine": start,
        "endLine": last_included,
        "lines": lines,
    });
    if let (Some(total), Value::Object(map)) = (total, &mut result) {
        map.insert("totalLines".to_owned(), json!(total));
    }
    Ok(result)
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = file.read(&mut buf[filled..])?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::time::Duration;

    fn file_with(content: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(content).unwrap();
        f
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn grep_numbers_lines_and_counts_all_matches() {
        let f = file_with(b"alpha\r\nbeta\nalphabet\ngamma\nalpha again\n");
        let re = compile_regex("^alpha", false).unwrap();
        let v = grep(f.path(), "text/plain", &re, 2, later(), 1 << 20, "2s").unwrap();
        assert_eq!(v["totalMatches"], 3);
        assert_eq!(v["truncated"], true);
        assert_eq!(v["matches"][0], json!({"lineNumber": 1, "line": "alpha"}));
        assert_eq!(v["matches"][1]["lineNumber"], 3);
    }

    #[test]
    fn costly_and_invalid_patterns_have_distinct_errors() {
        use kg_common::{ErrorCode, ErrorExt as _};
        let err = compile_regex(r"(\w{100}){100}", false).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ResourceExhausted, "{err}");
        let err = compile_regex("a(b", false).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert!(err.to_string().contains("invalid regular expression"));
    }

    #[test]
    fn window_clamps_and_counts() {
        let f = file_with(b"1\n2\n3\n4\n5");
        let v = window(f.path(), "text/plain", 2, 10, later(), 1 << 20).unwrap();
        assert_eq!(v["startLine"], 2);
        assert_eq!(v["endLine"], 5);
        assert_eq!(v["totalLines"], 5);
        assert_eq!(v["lines"].as_array().unwrap().len(), 4);
        let v = window(f.path(), "text/plain", 1, 2, later(), 1 << 20).unwrap();
        assert_eq!(v["endLine"], 2);
        assert_eq!(v["totalLines"], 5);
        let err = window(f.path(), "text/plain", 9, 10, later(), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("past the end"), "{err}");
    }

    #[test]
    fn window_refuses_binary_and_cuts_long_lines() {
        let f = file_with(b"PK\x03\x04\x00\x00binary");
        assert!(window(f.path(), "application/zip", 1, 5, later(), 1 << 20).is_err());
        let long = "x".repeat(50_000);
        let f = file_with(long.as_bytes());
        let v = window(f.path(), "text/plain", 1, 1, later(), 1 << 20).unwrap();
        let line = v["lines"][0]["line"].as_str().unwrap();
        assert_eq!(line.chars().count(), WINDOW_LINE_CHARS + 1);
    }
}
