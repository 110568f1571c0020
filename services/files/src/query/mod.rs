//! kg_file (`QueryFile`): the metadata of one readable file, or one query
//! over it: SQL over CSV/TSV, a regex or a line window over text, JSONPath,
//! JSONata or Jinja over JSON. Every string in a result is sanitised and the
//! whole `result_json` stays within the result limit.

mod json;
pub(crate) mod output;
pub(crate) mod sql;
pub(crate) mod text;

use std::path::{Path, PathBuf};
use std::time::Instant;

use kg_common::access::{normalize_path, validate_namespace};
use kg_common::caller::access_for;
use kg_common::sanitize::sanitize_text;
use kg_proto::v1::query_file_request::Selector;
use kg_proto::v1::{CallerContext, FileInfo, QueryFileRequest, QueryFileResponse};
use kg_stores::blobs::BlobStore;
use serde_json::{Value, json};

use crate::error::{FilesError, Result};
use crate::limits::human_duration;
use crate::query::output::{fit_json, sanitize_json};
use crate::query::sql::blocking;
use crate::service::FilesService;
use crate::store::{FileSelector, Readable, status_str};

/// Default and largest row / match cap of one query.
const DEFAULT_ROWS: u32 = 100;
const MAX_ROWS: u32 = 1000;
/// Longest query text (SQL, pattern, expression or template).
const MAX_QUERY_BYTES: usize = 64 * 1024;
/// Room kept in `result_json` for everything around the rows / matches.
const ENVELOPE_BYTES: usize = 4096;

/// The formats of `QueryFile`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Metadata,
    Sql,
    Text,
    JsonPath,
    Jsonata,
    Jinja,
}

impl Format {
    fn parse(format: &str) -> Result<Self> {
        Ok(match format.trim().to_ascii_lowercase().as_str() {
            "" | "metadata" => Format::Metadata,
            "sql" => Format::Sql,
            "text" => Format::Text,
            "jsonpath" => Format::JsonPath,
            "jsonata" => Format::Jsonata,
            "jinja" => Format::Jinja,
            other => {
                return Err(FilesError::Invalid(format!(
                    "unknown format `{}`; use one of: \"\" (metadata), sql, text, jsonpath, jsonata, jinja",
                    sanitize_text(other, 40)
                )));
            }
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            Format::Metadata => "",
            Format::Sql => "sql",
            Format::Text => "text",
            Format::JsonPath => "jsonpath",
            Format::Jsonata => "jsonata",
            Format::Jinja => "jinja",
        }
    }
}

/// The delimiter of a CSV (`,`) or TSV (tab) file, by mime type or extension.
fn table_delimiter(file: &FileInfo) -> Option<u8> {
    let mime = file.mime.to_ascii_lowercase();
    let path = file.path.to_ascii_lowercase();
    if mime == "text/csv" || mime == "application/csv" || path.ends_with(".csv") {
        Some(b',')
    } else if mime == "text/tab-separated-values" || path.ends_with(".tsv") {
        Some(b'\t')
    } else {
        None
    }
}

fn is_json(file: &FileInfo) -> bool {
    let mime = file.mime.to_ascii_lowercase();
    mime == "application/json"
        || mime.ends_with("+json")
        || file.path.to_ascii_lowercase().ends_with(".json")
}

/// The local file of a blob. The blob store's documented layout is
/// `root/ab/cd/<sha256 hex>`; the key is checked so it can only name a file
/// inside the store.
pub(crate) fn blob_path(blobs: &BlobStore, key: &str) -> Result<PathBuf> {
    let valid = key.len() == 64 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !valid {
        return Err(FilesError::Engine(format!(
            "registry holds a malformed blob key `{key}`"
        )));
    }
    Ok(blobs.root().join(&key[0..2]).join(&key[2..4]).join(key))
}

/// Namespace and selector of a request; a path may be a chat reference
/// `@kg:<namespace>/<path>`, whose namespace must agree with `namespace`
/// (or stands in for it when that is empty).
fn target(request: &QueryFileRequest) -> Result<(String, Selector)> {
    let selector = match &request.selector {
        Some(Selector::Path(p)) if !p.trim().is_empty() => Selector::Path(p.trim().to_owned()),
        Some(Selector::FileId(f)) if !f.trim().is_empty() => Selector::FileId(f.trim().to_owned()),
        _ => {
            return Err(FilesError::Invalid(
                "pass exactly one of path or fileId".to_owned(),
            ));
        }
    };
    let Selector::Path(path) = &selector else {
        return Ok((request.namespace.clone(), selector));
    };
    let Some(reference) = path.strip_prefix("@kg:") else {
        return Ok((request.namespace.clone(), selector));
    };
    let Some((namespace, inner)) = reference.split_once('/') else {
        return Err(FilesError::Invalid(format!(
            "`{}` is not a file reference; use @kg:<namespace>/<path>",
            sanitize_text(path, 200)
        )));
    };
    if !request.namespace.is_empty() && request.namespace != namespace {
        return Err(FilesError::Invalid(format!(
            "the reference names namespace `{}` but the call names `{}`; pass the same namespace in both",
            sanitize_text(namespace, 80),
            sanitize_text(&request.namespace, 80)
        )));
    }
    Ok((namespace.to_owned(), Selector::Path(inner.to_owned())))
}

fn rows_cap(max_rows: u32) -> Result<usize> {
    match max_rows {
        0 => Ok(DEFAULT_ROWS as usize),
        n if n > MAX_ROWS => Err(FilesError::Invalid(format!(
            "maxRows {n} is over the maximum of {MAX_ROWS}"
        ))),
        n => Ok(n as usize),
    }
}

fn need_query(format: Format, query: &str, what: &str) -> Result<()> {
    if query.trim().is_empty() {
        return Err(FilesError::Invalid(format!(
            "format {} needs query: {what}",
            format.as_str()
        )));
    }
    Ok(())
}

impl FilesService {
    /// kg_file: metadata of one readable file, or a query over it (see the
    /// module docs). A file the caller may not read is `not_found`, exactly
    /// like a missing one.
    pub async fn query_file(
        &self,
        caller: &CallerContext,
        request: &QueryFileRequest,
    ) -> Result<QueryFileResponse> {
        let format = Format::parse(&request.format)?;
        let max_rows = rows_cap(request.max_rows)?;
        if request.query.len() > MAX_QUERY_BYTES {
            return Err(FilesError::Invalid(format!(
                "the query is {} bytes; the limit is {MAX_QUERY_BYTES}",
                request.query.len()
            )));
        }
        if format == Format::Metadata && !request.query.is_empty() {
            return Err(FilesError::Invalid(
                "query needs a format: pass format sql, text, jsonpath, jsonata or jinja"
                    .to_owned(),
            ));
        }
        if format != Format::Text && (request.start_line.is_some() || request.end_line.is_some()) {
            return Err(FilesError::Invalid(
                "startLine and endLine are for format text only".to_owned(),
            ));
        }
        let (namespace, selector) = target(request)?;
        validate_namespace(&namespace)?;
        // The agent's view: the caller's filter as issued (disabled files
        // are unreadable even to writers here, as in search).
        let filter = access_for(caller, &namespace)?;
        let (found, shown) = match &selector {
            Selector::Path(p) => {
                let p = normalize_path(p)?;
                let found = self
                    .store
                    .get_readable(&namespace, FileSelector::Path(&p), filter)
                    .await?;
                (found, p)
            }
            Selector::FileId(id) => (
                self.store
                    .get_readable(&namespace, FileSelector::Id(id), filter)
                    .await?,
                sanitize_text(id, 120),
            ),
        };
        let readable = found.ok_or_else(|| FilesError::NotFound(format!("{namespace}/{shown}")))?;
        let path = blob_path(&self.blobs, &readable.blob_key)?;
        let mut answer = Answer::default();
        match format {
            Format::Metadata => self.metadata(&readable, &path, &mut answer).await?,
            Format::Sql => {
                self.sql(request, &readable, &path, max_rows, &mut answer)
                    .await?
            }
            Format::Text => {
                self.text(request, &readable, &path, max_rows, &mut answer)
                    .await?
            }
            Format::JsonPath | Format::Jsonata | Format::Jinja => {
                self.json(format, request, &readable, &path, max_rows, &mut answer)
                    .await?
            }
        }
        let budget = self.limits.max_result_bytes;
        let (result, cut) = fit_json(sanitize_json(answer.result), budget);
        let result_json = serde_json::to_string(&result)
            .map_err(|err| FilesError::Engine(format!("result does not serialise: {err}")))?;
        Ok(QueryFileResponse {
            file: Some(readable.file),
            format: format.as_str().to_owned(),
            columns: answer.columns,
            result_json,
            truncated: answer.truncated || cut,
        })
    }

    fn too_large(&self, file: &FileInfo) -> bool {
        u64::try_from(file.size).unwrap_or(u64::MAX) > self.limits.max_query_file_bytes
    }

    fn refuse_large(&self, file: &FileInfo, format: Format) -> Result<()> {
        if self.too_large(file) {
            return Err(FilesError::QueryTooLarge {
                size: file.size,
                limit: self.limits.max_query_file_bytes,
                format: format.as_str().to_owned(),
            });
        }
        Ok(())
    }

    async fn metadata(&self, readable: &Readable, path: &Path, answer: &mut Answer) -> Result<()> {
        let file = &readable.file;
        let too_large = self.too_large(file);
        let mut result = json!({
            "size": file.size,
            "mime": file.mime,
            "status": status_str(file.status()),
            "statusReason": file.status_reason,
            "tooLarge": too_large,
        });
        if let Some(delimiter) = table_delimiter(file) {
            let mut columns = None;
            let mut types = None;
            if !too_large {
                // The same profile SQL uses, so the types shown are the types queried.
                if let Ok((profile, _)) = self
                    .sql
                    .profile(&file.version_id, path, delimiter, false)
                    .await
                {
                    if let Value::Object(map) = &mut result {
                        rows_read_note(map, &profile);
                    }
                    columns = Some(profile.columns.clone());
                    types = Some(
                        profile
                            .schema
                            .fields()
                            .iter()
                            .map(|f| sql::type_name(f.data_type()))
                            .collect::<Vec<_>>(),
                    );
                }
            }
            if columns.is_none() {
                let owned = path.to_path_buf();
                columns = blocking(move || sql::read_header(&owned, delimiter))
                    .await
                    .ok();
            }
            if let (Some(columns), Value::Object(map)) = (&columns, &mut result) {
                map.insert("columns".to_owned(), json!(columns));
                if let Some(types) = types {
                    map.insert("columnTypes".to_owned(), json!(types));
                }
            }
            answer.columns = columns.unwrap_or_default();
        }
        answer.result = result;
        Ok(())
    }

    async fn sql(
        &self,
        request: &QueryFileRequest,
        readable: &Readable,
        path: &Path,
        max_rows: usize,
        answer: &mut Answer,
    ) -> Result<()> {
        let file = &readable.file;
        let Some(delimiter) = table_delimiter(file) else {
            return Err(FilesError::Invalid(format!(
                "format sql needs a CSV or TSV file; this file is {}",
                file.mime
            )));
        };
        self.refuse_large(file, Format::Sql)?;
        need_query(
            Format::Sql,
            &request.query,
            "one SELECT or WITH statement over the table data",
        )?;
        let statement = sql::parse_read_only(&request.query)?;
        let budget = self.limits.max_result_bytes.saturating_sub(ENVELOPE_BYTES);
        let (profile, output) = self
            .sql
            .query(
                &file.version_id,
                path,
                delimiter,
                statement,
                max_rows,
                budget,
                self.limits.sql_timeout,
            )
            .await?;
        let mut result = json!({
            "columns": output.columns,
            "types": output.types,
            "rowCount": output.rows.len(),
            "rows": output.rows,
            "truncated": output.truncated,
        });
        if let Value::Object(map) = &mut result {
            rows_read_note(map, &profile);
            // A cut cell reads like a value; the count says some are not whole.
            if output.cells_cut > 0 {
                map.insert("cellsCut".to_owned(), json!(output.cells_cut));
            }
        }
        answer.columns = profile.columns.clone();
        answer.truncated = output.truncated;
        answer.result = result;
        Ok(())
    }

    async fn text(
        &self,
        request: &QueryFileRequest,
        readable: &Readable,
        path: &Path,
        max_rows: usize,
        answer: &mut Answer,
    ) -> Result<()> {
        let file = &readable.file;
        let has_window = request.start_line.is_some() || request.end_line.is_some();
        let budget = self.limits.max_result_bytes.saturating_sub(ENVELOPE_BYTES);
        let deadline = Instant::now() + self.limits.eval_timeout;
        let owned = path.to_path_buf();
        let mime = file.mime.clone();
        if !request.query.is_empty() {
            if has_window {
                return Err(FilesError::Invalid(
                    "pass either query (a regular expression) or startLine/endLine, not both"
                        .to_owned(),
                ));
            }
            self.refuse_large(file, Format::Text)?;
            let regex = text::compile_regex(&request.query, false)?;
            let timeout_text = human_duration(self.limits.eval_timeout);
            let result = blocking(move || {
                text::grep(
                    &owned,
                    &mime,
                    &regex,
                    max_rows,
                    deadline,
                    budget,
                    &timeout_text,
                )
            })
            .await?;
            answer.truncated = result["truncated"] == Value::Bool(true);
            answer.result = result;
            return Ok(());
        }
        let start = request.start_line.unwrap_or(1);
        if start < 1 {
            return Err(FilesError::Invalid(format!(
                "startLine {start} is invalid; lines are numbered from 1"
            )));
        }
        let end = request
            .end_line
            .unwrap_or(start.saturating_add(text::DEFAULT_WINDOW_LINES as i64 - 1));
        if end < start {
            return Err(FilesError::Invalid(format!(
                "endLine {end} is before startLine {start}"
            )));
        }
        let (start, end) = (start as u64, end as u64);
        if end - start + 1 > text::MAX_WINDOW_LINES {
            return Err(FilesError::Invalid(format!(
                "a line window is at most {} lines; startLine {start} to endLine {end} is {}",
                text::MAX_WINDOW_LINES,
                end - start + 1
            )));
        }
        let result =
            blocking(move || text::window(&owned, &mime, start, end, deadline, budget)).await?;
        let returned = result["lines"].as_array().map_or(0, Vec::len) as u64;
        let last = result["endLine"].as_u64().unwrap_or(0);
        let total = result["totalLines"].as_u64();
        // Cut by the result budget before the requested (or last) line.
        answer.truncated = returned > 0 && last < end && total.is_none_or(|t| last < t);
        answer.result = result;
        Ok(())
    }

    async fn json(
        &self,
        format: Format,
        request: &QueryFileRequest,
        readable: &Readable,
        path: &Path,
        max_rows: usize,
        answer: &mut Answer,
    ) -> Result<()> {
        let file = &readable.file;
        if !is_json(file) {
            return Err(FilesError::Invalid(format!(
                "format {} needs a JSON file; this file is {}",
                format.as_str(),
                file.mime
            )));
        }
        self.refuse_large(file, format)?;
        need_query(
            format,
            &request.query,
            match format {
                Format::JsonPath => "a JSONPath such as $.items[*].name",
                Format::Jsonata => "a JSONata expression",
                _ => "a Jinja template over `data`",
            },
        )?;
        let owned = path.to_path_buf();
        let query = request.query.clone();
        let eval_timeout = self.limits.eval_timeout;
        let fuel = self.limits.jinja_fuel;
        let budget = self.limits.max_result_bytes.saturating_sub(ENVELOPE_BYTES);
        let (result, truncated) = blocking(move || {
            let bytes = std::fs::read(&owned)?;
            let document = json::parse_document(&bytes)?;
            drop(bytes);
            Ok(match format {
                Format::JsonPath => {
                    let (nodes, more) = json::jsonpath(&document, &query, max_rows)?;
                    (nodes, more)
                }
                Format::Jsonata => (json::jsonata(document, &query, eval_timeout)?, false),
                _ => {
                    let (text, cut) = json::jinja(document, &query, fuel, budget)?;
                    (Value::String(text), cut)
                }
            })
        })
        .await?;
        let (result, cut) = fit_json(sanitize_json(result), budget);
        answer.truncated = truncated || cut;
        answer.result = json!({ "result": result });
        Ok(())
    }
}

/// What a format handler produces.
#[derive(Default)]
struct Answer {
    result: Value,
    columns: Vec<String>,
    truncated: bool,
}

/// How the table differs from the file: the rows SQL leaves out because their field count
/// differs from the header's (`malformedRows`), told beside the columns and every answer.
fn rows_read_note(map: &mut serde_json::Map<String, Value>, profile: &sql::CsvProfile) {
    if profile.malformed_rows > 0 {
        map.insert("malformedRows".to_owned(), json!(profile.malformed_rows));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn request(namespace: &str, path: &str) -> QueryFileRequest {
        QueryFileRequest {
            namespace: namespace.to_owned(),
            selector: Some(Selector::Path(path.to_owned())),
            ..Default::default()
        }
    }

    #[test]
    fn chat_references_resolve_and_must_agree() {
        let (ns, sel) = target(&request("hb", "@kg:hb/a/b.csv")).unwrap();
        assert_eq!(ns, "hb");
        assert_eq!(sel, Selector::Path("a/b.csv".to_owned()));
        let (ns, _) = target(&request("", "@kg:hb/x.md")).unwrap();
        assert_eq!(ns, "hb");
        assert!(target(&request("other", "@kg:hb/x.md")).is_err());
        assert!(target(&request("hb", "@kg:hb")).is_err());
        let (ns, sel) = target(&request("hb", "plain/path.md")).unwrap();
        assert_eq!(
            (ns.as_str(), sel),
            ("hb", Selector::Path("plain/path.md".to_owned()))
        );
        assert!(target(&QueryFileRequest::default()).is_err());
    }

    #[test]
    fn formats_and_caps() {
        assert_eq!(Format::parse("").unwrap(), Format::Metadata);
        assert_eq!(Format::parse(" SQL ").unwrap(), Format::Sql);
        assert!(Format::parse("yaml").is_err());
        assert_eq!(rows_cap(0).unwrap(), 100);
        assert_eq!(rows_cap(1000).unwrap(), 1000);
        assert!(rows_cap(1001).is_err());
    }

    #[test]
    fn blob_paths_stay_inside_the_store() {
        let blobs = BlobStore::new("/srv/blobs");
        let key = "ab".repeat(32);
        assert_eq!(
            blob_path(&blobs, &key).unwrap(),
            PathBuf::from(format!("/srv/blobs/ab/ab/{key}"))
        );
        assert!(blob_path(&blobs, "../../etc/passwd").is_err());
    }
}
