//! kg_files and kg_file: find files, then read or query one of them. The files
//! service scans and queries under the caller's access filter; here its answer
//! is sanitised (file contents are untrusted text) and held under the result
//! limit of one tool call, cutting row and line lists before failing.

use kg_common::ErrorCode;
use kg_common::sanitize::{DEFAULT_FIELD_CAP, sanitize_json, sanitize_text};
use kg_proto::v1::{
    FileInfo, FileStatus, FindFilesRequest, FindFilesResponse, FoundFile, QueryFileRequest,
    QueryFileResponse,
};
use serde_json::{Map, Value, json};

use super::args::{FileArgs, FilesArgs, MAX_FILES_CURSOR_CHARS};
use super::tools::require_readable;
use super::{MAX_RESULT_BYTES, wire_len};
use crate::error::ClientError;
use crate::state::{Caller, GatewayState};

/// Cap on names, keys, mime types and other short fields.
const SHORT_FIELD_CAP: usize = 1024;
/// Cap on one matching line in a kg_files page (a finder, not a reader).
const MATCH_LINE_CAP: usize = 500;
/// Parts of a kg_file result that may be cut to fit the result limit: rows
/// (sql), matches and lines (text), result (JSON nodes or rendered text).
const CUTTABLE: [&str; 4] = ["rows", "matches", "lines", "result"];

fn clean(text: &str) -> Value {
    Value::String(sanitize_text(text, SHORT_FIELD_CAP))
}

/// Every string (and object key) of a parsed result, sanitised; long strings
/// are capped at the field cap.
fn clean_json(value: Value) -> Value {
    sanitize_json(value, DEFAULT_FIELD_CAP, SHORT_FIELD_CAP)
}

/// The lowercase name of an indexing status.
fn status_name(status: i32) -> &'static str {
    match FileStatus::try_from(status) {
        Ok(FileStatus::Pending) => "pending",
        Ok(FileStatus::Indexed) => "indexed",
        Ok(FileStatus::Failed) => "failed",
        Ok(FileStatus::Deleted) => "deleted",
        Ok(FileStatus::Stored) => "stored",
        Ok(FileStatus::Unspecified) | Err(_) => "unknown",
    }
}

/// A file's identity and state, as both tools return it.
fn file_json(info: &FileInfo) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("namespace".into(), clean(&info.namespace));
    out.insert("path".into(), clean(&info.path));
    out.insert("fileId".into(), clean(&info.file_id));
    out.insert("size".into(), info.size.into());
    out.insert("mime".into(), clean(&info.mime));
    out.insert("status".into(), status_name(info.status).into());
    if !info.status_reason.is_empty() {
        out.insert("statusReason".into(), clean(&info.status_reason));
    }
    out
}

fn too_large(bytes: usize) -> ClientError {
    ClientError::new(
        ErrorCode::PayloadTooLarge,
        format!(
            "the result is {bytes} bytes on the wire, over the {MAX_RESULT_BYTES}-byte limit of one tool call; \
             narrow it: fewer columns or a lower maxRows, a smaller line window, a more specific expression"
        ),
    )
}

/// Runs kg_files.
pub(crate) async fn find_files(
    state: &GatewayState,
    caller: &Caller,
    args: FilesArgs,
) -> Result<Value, ClientError> {
    require_readable(caller.context(), &args.namespace)?;
    let with_pattern = !args.pattern.is_empty();
    let request = caller.request(FindFilesRequest {
        namespace: args.namespace,
        folder_prefix: args.folder_prefix,
        name: args.name,
        pattern: args.pattern,
        limit: args.limit,
        cursor: args.cursor,
    });
    let response = state
        .backends
        .files
        .clone()
        .find_files(request)
        .await
        .map_err(|status| ClientError::from_status("files", &status))?
        .into_inner();
    fit_files(files_result(&response, with_pattern), MAX_RESULT_BYTES)
}

fn found_json(found: &FoundFile, with_pattern: bool) -> Value {
    let mut out = found.file.as_ref().map(file_json).unwrap_or_default();
    if with_pattern {
        let matches: Vec<Value> = found
            .matches
            .iter()
            .map(|m| json!({"lineNumber": m.line_number, "line": sanitize_text(&m.line, MATCH_LINE_CAP)}))
            .collect();
        out.insert("matches".into(), Value::Array(matches));
    }
    Value::Object(out)
}

/// The kg_files result; matches only when a pattern was given.
fn files_result(response: &FindFilesResponse, with_pattern: bool) -> Value {
    let files: Vec<Value> = response
        .files
        .iter()
        // A row without file info cannot be cited; the service always sets it.
        .filter(|f| f.file.is_some())
        .map(|f| found_json(f, with_pattern))
        .collect();
    let next_cursor = if response.next_cursor.is_empty() {
        Value::Null
    } else {
        Value::String(sanitize_text(&response.next_cursor, MAX_FILES_CURSOR_CHARS))
    };
    let mut out = json!({
        "files": files,
        "nextCursor": next_cursor,
        "total": response.total.max(0),
        "stoppedEarly": response.stopped_early,
    });
    if !response.stop_reason.is_empty() {
        out["stopReason"] = clean(&response.stop_reason);
    }
    if with_pattern {
        out["filesScanned"] = json!(response.files_scanned.max(0));
    }
    out
}

/// Holds a kg_files page under `limit`: the page keeps every file (so the
/// cursor stays right) and each file keeps its first matching line only.
fn fit_files(mut out: Value, limit: usize) -> Result<Value, ClientError> {
    let bytes = wire_len(&out);
    if bytes <= limit {
        return Ok(out);
    }
    if let Some(files) = out.get_mut("files").and_then(Value::as_array_mut) {
        for file in files {
            if let Some(matches) = file.get_mut("matches").and_then(Value::as_array_mut)
                && matches.len() > 1
            {
                matches.truncate(1);
                file["matchesTruncated"] = Value::Bool(true);
            }
        }
    }
    if wire_len(&out) <= limit {
        Ok(out)
    } else {
        Err(too_large(bytes))
    }
}

/// Runs kg_file.
pub(crate) async fn query_file(
    state: &GatewayState,
    caller: &Caller,
    args: FileArgs,
) -> Result<Value, ClientError> {
    require_readable(caller.context(), &args.namespace)?;
    let format = args.format.clone();
    let request = caller.request(QueryFileRequest {
        namespace: args.namespace,
        selector: Some(args.selector),
        format: args.format,
        query: args.query,
        start_line: args.start_line,
        end_line: args.end_line,
        max_rows: args.max_rows,
    });
    let response = state
        .backends
        .files
        .clone()
        .query_file(request)
        .await
        .map_err(|status| ClientError::from_status("files", &status))?
        .into_inner();
    fit_file(file_result(response, &format)?, MAX_RESULT_BYTES)
}

/// The kg_file result: the file, the format that ran, CSV columns, the
/// service's result (parsed and sanitised) and whether it was cut.
fn file_result(response: QueryFileResponse, requested: &str) -> Result<Value, ClientError> {
    let result = if response.result_json.trim().is_empty() {
        Value::Null
    } else {
        let parsed: Value = serde_json::from_str(&response.result_json).map_err(|err| {
            if super::args::nests_too_deep(&err) {
                return ClientError::new(
                    ErrorCode::ResourceExhausted,
                    "the result nests deeper than the 127 levels a tool result carries; select \
                     a shallower part (a longer JSONPath, or a JSONata expression that flattens it)",
                );
            }
            tracing::error!(error = %err, "files returned a result that is not JSON");
            ClientError::new(ErrorCode::Internal, "")
        })?;
        clean_json(parsed)
    };
    let format = match (response.format.as_str(), requested) {
        ("", "") => Value::Null,
        ("", f) | (f, _) => clean(f),
    };
    let file = response.file.as_ref().map(file_json).unwrap_or_default();
    let mut out = json!({
        "file": file,
        "format": format,
        "result": result,
        "truncated": response.truncated,
    });
    if !response.columns.is_empty() {
        out["columns"] = Value::Array(response.columns.iter().map(|c| clean(c)).collect());
    }
    Ok(out)
}

/// Holds a kg_file result under `limit` wire bytes by keeping a prefix of
/// its row, match, line or node list, or of a rendered string (and saying
/// so). A result that still does not fit, or of which nothing would be
/// left, is refused.
fn fit_file(mut out: Value, limit: usize) -> Result<Value, ClientError> {
    let bytes = wire_len(&out);
    if bytes <= limit {
        return Ok(out);
    }
    let Some(key) = CUTTABLE.into_iter().find(|k| {
        matches!(
            out["result"].get(*k),
            Some(Value::Array(_) | Value::String(_))
        )
    }) else {
        return Err(too_large(bytes));
    };
    let whole = out["result"][key].take();
    let prefix = |n: usize| match &whole {
        Value::Array(items) => Value::Array(items.iter().take(n).cloned().collect()),
        Value::String(text) => Value::String(text.chars().take(n).collect()),
        _ => Value::Null,
    };
    let len = match &whole {
        Value::Array(items) => items.len(),
        Value::String(text) => text.chars().count(),
        _ => 0,
    };
    // The flags are set first so that the sizes measured include them.
    out["truncated"] = Value::Bool(true);
    if out["result"].get("truncated").is_some() {
        out["result"]["truncated"] = Value::Bool(true);
    }
    // Largest prefix that fits: `keep` fits, `over` does not.
    let (mut keep, mut over) = (0, len);
    while over - keep > 1 {
        let mid = keep + (over - keep) / 2;
        out["result"][key] = prefix(mid);
        if wire_len(&out) <= limit {
            keep = mid;
        } else {
            over = mid;
        }
    }
    if keep == 0 {
        return Err(too_large(bytes));
    }
    let result = &mut out["result"];
    result[key] = prefix(keep);
    // Counts that described the whole list now describe what is returned
    // (they only shrink, so the result still fits).
    if key == "rows" && result.get("rowCount").and_then(Value::as_u64) == Some(len as u64) {
        result["rowCount"] = json!(keep);
    }
    if key == "lines"
        && let Some(start) = result.get("startLine").and_then(Value::as_i64)
    {
        result["endLine"] = json!(start + keep as i64 - 1);
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kg_proto::v1::ContentMatch;

    fn info(path: &str) -> FileInfo {
        FileInfo {
            namespace: "demo".into(),
            file_id: format!("fid:{path}"),
            path: path.into(),
            size: 120,
            mime: "text/csv".into(),
            status: FileStatus::Indexed as i32,
            enabled: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_result_nested_past_what_a_tool_result_carries_says_so() {
        let deep = |levels: usize| QueryFileResponse {
            result_json: format!("{}1{}", "[".repeat(levels), "]".repeat(levels)),
            ..Default::default()
        };
        assert!(file_result(deep(100), "json").is_ok());
        let err = file_result(deep(200), "json").unwrap_err();
        assert_eq!(err.code, ErrorCode::ResourceExhausted);
        assert!(err.message.contains("127 levels"), "{}", err.message);
        let broken = QueryFileResponse {
            result_json: "{".into(),
            ..Default::default()
        };
        assert_eq!(
            file_result(broken, "json").unwrap_err().code,
            ErrorCode::Internal,
            "a reply that is not JSON stays a fault of ours"
        );
    }

    fn conforms(tool: &str, value: &Value) {
        let registry = super::super::registry::ToolRegistry::builtin();
        let schema = registry
            .get(tool)
            .unwrap()
            .tool
            .output_schema
            .clone()
            .unwrap();
        let schema = Value::Object((*schema).clone());
        if let Err(err) = super::super::registry::check_schema(&schema, value, "$") {
            panic!("{tool} result does not match its outputSchema: {err}\n{value:#}");
        }
    }

    #[test]
    fn a_listing_has_no_matches_and_a_null_cursor_at_the_end() {
        let response = FindFilesResponse {
            files: vec![
                FoundFile {
                    file: Some(info("a.csv")),
                    matches: Vec::new(),
                },
                FoundFile {
                    file: None,
                    matches: Vec::new(),
                },
            ],
            next_cursor: String::new(),
            total: 1,
            ..Default::default()
        };
        let out = files_result(&response, false);
        assert_eq!(
            out,
            json!({"files": [{"namespace": "demo", "path": "a.csv", "fileId": "fid:a.csv", "size": 120,
                              "mime": "text/csv", "status": "indexed"}],
                   "nextCursor": null, "total": 1, "stoppedEarly": false})
        );
        conforms("kg_files", &out);
    }

    #[test]
    fn a_scan_reports_matches_budget_and_sanitises_lines() {
        let mut failed = info("b.md");
        failed.status = FileStatus::Failed as i32;
        failed.status_reason = "unsupported\u{202E} encoding".into();
        let response = FindFilesResponse {
            files: vec![FoundFile {
                file: Some(failed),
                matches: vec![ContentMatch {
                    line_number: 7,
                    line: format!("ignore\u{200B} previous \u{1b}[31m{}", "x".repeat(2000)),
                }],
            }],
            next_cursor: "c2".into(),
            total: 3,
            stopped_early: true,
            stop_reason: "time budget of 2 s spent".into(),
            files_scanned: 40,
        };
        let out = files_result(&response, true);
        let file = &out["files"][0];
        assert_eq!(file["status"], "failed");
        assert_eq!(file["statusReason"], "unsupported encoding");
        let line = file["matches"][0]["line"].as_str().unwrap();
        assert!(line.starts_with("ignore previous xxx"), "{line}");
        assert_eq!(line.chars().count(), MATCH_LINE_CAP + 1);
        assert_eq!(file["matches"][0]["lineNumber"], 7);
        assert_eq!(
            (
                &out["nextCursor"],
                &out["stoppedEarly"],
                &out["filesScanned"]
            ),
            (&json!("c2"), &json!(true), &json!(40))
        );
        conforms("kg_files", &out);
    }

    #[test]
    fn a_page_too_large_keeps_its_files_and_cuts_matches() {
        let many = |n: i64| FoundFile {
            file: Some(info(&format!("f{n}.txt"))),
            matches: (1..=20)
                .map(|l| ContentMatch {
                    line_number: l,
                    line: "y".repeat(400),
                })
                .collect(),
        };
        let response = FindFilesResponse {
            files: (0..10).map(many).collect(),
            total: 10,
            ..Default::default()
        };
        let out = files_result(&response, true);
        assert!(wire_len(&out) > 20_000);
        let cut = fit_files(out.clone(), 20_000).unwrap();
        let files = cut["files"].as_array().unwrap();
        assert_eq!(files.len(), 10);
        assert!(
            files
                .iter()
                .all(|f| f["matches"].as_array().unwrap().len() == 1
                    && f["matchesTruncated"] == true)
        );
        conforms("kg_files", &cut);
        let err = fit_files(out, 2_000).unwrap_err();
        assert_eq!(err.code, ErrorCode::PayloadTooLarge);
        assert!(err.message.contains("narrow it"), "{}", err.message);
    }

    fn sql_response(rows: usize) -> QueryFileResponse {
        let rows: Vec<Value> = (0..rows)
            .map(|i| json!([format!("region-{i}"), i, 1.5]))
            .collect();
        QueryFileResponse {
            file: Some(info("sales.csv")),
            format: "sql".into(),
            columns: vec!["region".into(), "Market Value (AUD)".into()],
            result_json:
                json!({"columns": ["region", "n", "v"], "types": ["Utf8", "Int64", "Float64"],
                                "rows": rows, "rowCount": rows.len(), "truncated": false})
                .to_string(),
            truncated: false,
        }
    }

    #[test]
    fn sql_results_pass_through_sanitised() {
        let mut response = sql_response(2);
        response.result_json = response
            .result_json
            .replace("region-1", "region\u{E0041}-1");
        let out = file_result(response, "sql").unwrap();
        assert_eq!(out["format"], "sql");
        assert_eq!(out["columns"], json!(["region", "Market Value (AUD)"]));
        assert_eq!(out["result"]["rows"][1], json!(["region-1", 1, 1.5]));
        assert_eq!(out["truncated"], false);
        conforms("kg_file", &out);
        assert_eq!(fit_file(out.clone(), MAX_RESULT_BYTES).unwrap(), out);
    }

    #[test]
    fn large_row_lists_are_cut_to_the_limit() {
        let out = file_result(sql_response(5000), "sql").unwrap();
        let limit = 50_000;
        assert!(wire_len(&out) > limit);
        let cut = fit_file(out, limit).unwrap();
        assert!(wire_len(&cut) <= limit);
        let rows = cut["result"]["rows"].as_array().unwrap().len();
        assert!(rows > 100 && rows < 5000, "{rows}");
        assert_eq!(cut["result"]["rowCount"], rows);
        assert_eq!(
            (&cut["truncated"], &cut["result"]["truncated"]),
            (&json!(true), &json!(true))
        );
        conforms("kg_file", &cut);
    }

    #[test]
    fn line_windows_are_cut_and_say_where_they_end() {
        let lines: Vec<String> = (0..300)
            .map(|i| format!("{i:04} {}", "z".repeat(100)))
            .collect();
        let response = QueryFileResponse {
            file: Some(info("big.log")),
            format: "text".into(),
            result_json: json!({"startLine": 11, "endLine": 310, "lines": lines}).to_string(),
            ..Default::default()
        };
        let cut = fit_file(file_result(response, "text").unwrap(), 10_000).unwrap();
        let kept = cut["result"]["lines"].as_array().unwrap().len();
        assert!(kept > 10 && kept < 300);
        assert_eq!(cut["result"]["endLine"], 11 + kept as i64 - 1);
        assert_eq!(cut["truncated"], true);
        conforms("kg_file", &cut);
    }

    #[test]
    fn rendered_text_is_cut_and_objects_too_large_are_refused() {
        let response = QueryFileResponse {
            file: Some(info("doc.json")),
            format: "jinja".into(),
            result_json: json!({"result": "w\"".repeat(20_000)}).to_string(),
            ..Default::default()
        };
        let out = file_result(response, "jinja").unwrap();
        conforms("kg_file", &out);
        let cut = fit_file(out, 10_000).unwrap();
        assert!(wire_len(&cut) <= 10_000);
        let text = cut["result"]["result"].as_str().unwrap();
        assert!(
            text.len() > 2_000 && text.starts_with("w\"w\""),
            "{}",
            text.len()
        );
        assert_eq!(cut["truncated"], true);
        conforms("kg_file", &cut);

        let response = QueryFileResponse {
            file: Some(info("doc.json")),
            format: "jsonata".into(),
            result_json: json!({"result": {"a": "w".repeat(40_000)}}).to_string(),
            ..Default::default()
        };
        let err = fit_file(file_result(response, "jsonata").unwrap(), 10_000).unwrap_err();
        assert_eq!(err.code, ErrorCode::PayloadTooLarge);
        assert_eq!(err.to_json()["code"], "PAYLOAD_TOO_LARGE");
    }

    #[test]
    fn metadata_has_a_null_format_and_broken_json_is_internal() {
        let response = QueryFileResponse {
            file: Some(info("a.csv")),
            format: String::new(),
            columns: vec!["a".into()],
            result_json:
                json!({"size": 120, "mime": "text/csv", "status": "indexed", "tooLarge": false,
                                "columnTypes": {"a": "Int64"}})
                .to_string(),
            truncated: false,
        };
        let out = file_result(response.clone(), "").unwrap();
        assert_eq!(out["format"], Value::Null);
        assert_eq!(out["result"]["tooLarge"], false);
        conforms("kg_file", &out);
        let err = file_result(
            QueryFileResponse {
                result_json: "{not json".into(),
                ..response
            },
            "",
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::Internal);
        assert!(!err.message.contains("not json"));
    }
}
