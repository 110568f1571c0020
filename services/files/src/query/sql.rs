//! `format: "sql"`: one read-only SELECT or WITH over a CSV/TSV file exposed
//! as the table `data`, run by Apache DataFusion.
//!
//! The statement is parsed with DataFusion's own parser and its AST checked
//! before planning: exactly one query, no nested DDL/DML, no `SELECT INTO`,
//! no table functions, and no relation other than `data` or a WITH name (so
//! URL tables and file-reading functions are unreachable). The plan is then
//! checked again with `SQLOptions` (no DDL, DML or statements).
//!
//! Types are inferred from every row of the file (files here are at most the
//! query size limit), so a late "N/A" cannot break a query mid-way. Rows
//! whose field count differs from the header are skipped and counted
//! (`malformedRows`); the query then runs over a cleaned copy.

use std::collections::{HashSet, VecDeque};
use std::fs::File;
use std::io::BufReader;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, ArrayRef, AsArray as _, RecordBatch};
use datafusion::arrow::datatypes::{
    DataType, Field, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, Schema,
    SchemaRef, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::error::DataFusionError;
use datafusion::execution::context::SQLOptions;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::prelude::{CsvReadOptions, SessionConfig, SessionContext};
use datafusion::sql::parser::{DFParserBuilder, Statement as DfStatement};
use datafusion::sql::sqlparser::ast::{
    ObjectNamePart, Query, Select, Statement, TableFactor, Visit as _, Visitor,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::ParserError;
use kg_common::sanitize::{DEFAULT_FIELD_CAP, sanitize_text};
use serde_json::{Number, Value};

use crate::error::{FilesError, Result};
use crate::query::output::json_len;

/// The table name a statement queries.
pub(crate) const TABLE: &str = "data";
/// Nesting the SQL parser accepts (deeper statements are refused, not overflowed).
const PARSER_RECURSION_LIMIT: usize = 64;
/// Profiles kept in memory (they are a few hundred bytes each).
const PROFILE_CACHE_ENTRIES: usize = 64;
/// Longest error text passed on from the engine.
const MAX_MESSAGE_CHARS: usize = 1000;

/// What a CSV/TSV file looks like as a table.
#[derive(Debug)]
pub(crate) struct CsvProfile {
    /// Column names as the table exposes them: the header, trimmed, with
    /// blank names and duplicates renamed (`column_3`, `name_2`).
    pub columns: Vec<String>,
    /// Inferred column types.
    pub schema: SchemaRef,
    /// Rows whose field count differs from the header; skipped.
    pub malformed_rows: u64,
    /// Whether a quoted value spans lines (disables split scanning).
    pub newlines_in_values: bool,
}

/// The rows of one statement.
pub(crate) struct SqlOutput {
    pub columns: Vec<String>,
    pub types: Vec<String>,
    pub rows: Vec<Value>,
    pub truncated: bool,
    /// Text cells cut at [`DEFAULT_FIELD_CAP`] characters (each ends in `…`).
    pub cells_cut: usize,
}

/// The SQL engine: DataFusion's runtime environment (memory-capped, no
/// spilling), its own tokio runtime (CPU-heavy statements never starve the
/// service's request handling, and a statement past its time limit is
/// aborted there), and a cache of CSV profiles keyed by content-addressed
/// version.
pub(crate) struct SqlEngine {
    env: Arc<RuntimeEnv>,
    workers: Workers,
    /// One permit per running statement. A cancelled statement keeps its
    /// permit until its current batch ends (cancellation is cooperative), so
    /// runaways cannot pile up on the CPUs.
    slots: Arc<tokio::sync::Semaphore>,
    profiles: Mutex<VecDeque<(String, Arc<CsvProfile>)>>,
}

/// A tokio runtime that shuts down without blocking when dropped (the
/// engine may be dropped on an async worker).
struct Workers(Option<tokio::runtime::Runtime>);

impl Drop for Workers {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for SqlEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlEngine").finish_non_exhaustive()
    }
}

fn csv_read_error(err: csv::Error) -> FilesError {
    if err.is_io_error() {
        match err.into_kind() {
            csv::ErrorKind::Io(io) => FilesError::Io(io),
            other => {
                FilesError::BadContent(format!("the file could not be read as CSV: {other:?}"))
            }
        }
    } else {
        FilesError::BadContent(format!("the file could not be read as CSV: {err}"))
    }
}

fn csv_reader(path: &Path, delimiter: u8) -> Result<csv::Reader<BufReader<File>>> {
    let file = File::open(path)?;
    Ok(csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(delimiter)
        .from_reader(BufReader::with_capacity(256 * 1024, file)))
}

/// Header names: the first record, trimmed, BOM removed, blanks and
/// duplicates renamed so every column can be named in SQL.
fn header_names(record: &csv::ByteRecord) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut names = Vec::with_capacity(record.len());
    for (i, raw) in record.iter().enumerate() {
        let text = String::from_utf8_lossy(raw);
        let text = text.trim_start_matches('\u{feff}').trim();
        let base = if text.is_empty() {
            format!("column_{}", i + 1)
        } else {
            sanitize_text(text, 200)
        };
        let mut name = base.clone();
        let mut n = 2;
        while !seen.insert(name.clone()) {
            name = format!("{base}_{n}");
            n += 1;
        }
        names.push(name);
    }
    names
}

/// The header of a CSV/TSV file, reading only its first record.
pub(crate) fn read_header(path: &Path, delimiter: u8) -> Result<Vec<String>> {
    let mut reader = csv_reader(path, delimiter)?;
    let mut record = csv::ByteRecord::new();
    if !reader
        .read_byte_record(&mut record)
        .map_err(csv_read_error)?
    {
        return Ok(Vec::new());
    }
    Ok(header_names(&record))
}

/// Profiles a CSV/TSV file: header, malformed rows, and types inferred from
/// every well-formed row. Returns a cleaned copy when rows were skipped.
pub(crate) fn profile_csv(
    path: &Path,
    delimiter: u8,
) -> Result<(CsvProfile, Option<tempfile::TempPath>)> {
    let mut reader = csv_reader(path, delimiter)?;
    let mut record = csv::ByteRecord::new();
    if !reader
        .read_byte_record(&mut record)
        .map_err(csv_read_error)?
    {
        return Err(FilesError::Invalid(
            "the file is empty; a CSV needs a header line".to_owned(),
        ));
    }
    let columns = header_names(&record);
    let width = record.len();
    let mut malformed_rows = 0u64;
    let mut newlines_in_values = false;
    while reader
        .read_byte_record(&mut record)
        .map_err(csv_read_error)?
    {
        if record.len() != width {
            malformed_rows += 1;
        } else if !newlines_in_values && record.iter().any(|f| f.contains(&b'\n')) {
            newlines_in_values = true;
        }
    }
    let clean = if malformed_rows > 0 {
        Some(clean_copy(path, delimiter, width)?)
    } else {
        None
    };
    let source: &Path = clean.as_deref().unwrap_or(path);
    let format = datafusion::arrow::csv::reader::Format::default()
        .with_header(true)
        .with_delimiter(delimiter);
    let (inferred, _) = format
        .infer_schema(BufReader::new(File::open(source)?), None)
        .map_err(|err| {
            FilesError::BadContent(format!("the file could not be read as CSV: {err}"))
        })?;
    let fields: Vec<Field> = columns
        .iter()
        .zip(inferred.fields().iter())
        .map(|(name, field)| {
            // An all-empty column is text, not the Null type.
            let data_type = match field.data_type() {
                DataType::Null => DataType::Utf8,
                other => other.clone(),
            };
            Field::new(name, data_type, true)
        })
        .collect();
    Ok((
        CsvProfile {
            columns,
            schema: Arc::new(Schema::new(fields)),
            malformed_rows,
            newlines_in_values,
        },
        clean,
    ))
}

/// A copy of the file without the rows whose field count differs from the
/// header's `width`.
pub(crate) fn clean_copy(path: &Path, delimiter: u8, width: usize) -> Result<tempfile::TempPath> {
    let mut reader = csv_reader(path, delimiter)?;
    let temp = tempfile::Builder::new()
        .prefix("kg-files-sql-")
        .suffix(".csv")
        .tempfile()?;
    let (file, temp_path) = temp.into_parts();
    let mut writer = csv::WriterBuilder::new()
        .delimiter(delimiter)
        .from_writer(std::io::BufWriter::new(file));
    let mut record = csv::ByteRecord::new();
    while reader
        .read_byte_record(&mut record)
        .map_err(csv_read_error)?
    {
        if record.len() == width {
            writer.write_byte_record(&record).map_err(csv_read_error)?;
        }
    }
    writer.flush()?;
    Ok(temp_path)
}

/// Why a statement was refused, as the visitor's break value.
struct ReadOnlyGuard {
    ctes: HashSet<String>,
}

impl Visitor for ReadOnlyGuard {
    type Break = String;

    fn pre_visit_statement(&mut self, statement: &Statement) -> ControlFlow<String> {
        match statement {
            Statement::Query(_) => ControlFlow::Continue(()),
            other => ControlFlow::Break(format!(
                "only a read-only SELECT or WITH query is allowed; `{}` is refused",
                statement_kind(other)
            )),
        }
    }

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<String> {
        if let Some(with) = &query.with {
            for cte in &with.cte_tables {
                self.ctes.insert(cte.alias.name.value.clone());
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<String> {
        if select.into.is_some() {
            return ControlFlow::Break(
                "SELECT INTO creates a table and is refused; use a plain SELECT".to_owned(),
            );
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<String> {
        match factor {
            TableFactor::Table { name, args, .. } => {
                if args.is_some() {
                    return ControlFlow::Break(format!(
                        "table functions such as `{name}(...)` are refused; query the table `{TABLE}`"
                    ));
                }
                let allowed = match name.0.as_slice() {
                    [ObjectNamePart::Identifier(ident)] => {
                        ident.value == TABLE || self.ctes.contains(&ident.value)
                    }
                    _ => false,
                };
                if allowed {
                    ControlFlow::Continue(())
                } else {
                    ControlFlow::Break(format!(
                        "only the table `{TABLE}` (and names defined in WITH) can be queried; found `{name}`"
                    ))
                }
            }
            TableFactor::Derived { .. }
            | TableFactor::NestedJoin { .. }
            | TableFactor::UNNEST { .. } => ControlFlow::Continue(()),
            other => ControlFlow::Break(format!(
                "`{other}` is refused in FROM; query the table `{TABLE}`"
            )),
        }
    }
}

/// The leading keywords of a statement, for messages ("CREATE TABLE", "SET").
fn statement_kind(statement: &Statement) -> String {
    let text = statement.to_string();
    let mut words = text.split_whitespace();
    let first = words.next().unwrap_or_default().to_uppercase();
    match first.as_str() {
        "CREATE" | "DROP" | "ALTER" | "TRUNCATE" => {
            format!(
                "{first} {}",
                words.next().unwrap_or_default().to_uppercase()
            )
        }
        _ => first,
    }
}

fn parser_message(err: &ParserError) -> String {
    match err {
        ParserError::TokenizerError(m) | ParserError::ParserError(m) => m.clone(),
        ParserError::RecursionLimitExceeded => {
            "the statement nests too deeply; simplify it".to_owned()
        }
    }
}

/// Parses `sql` and checks it is one read-only query over `data`.
pub(crate) fn parse_read_only(sql: &str) -> Result<DfStatement> {
    let dialect = GenericDialect {};
    let mut statements = DFParserBuilder::new(sql)
        .with_dialect(&dialect)
        .with_recursion_limit(PARSER_RECURSION_LIMIT)
        .build()
        .and_then(|mut parser| parser.parse_statements())
        .map_err(|err| with_end_position(engine_error(err), sql))?;
    let statement = match statements.len() {
        0 => return Err(FilesError::Invalid("the SQL statement is empty".to_owned())),
        1 => statements.pop_front(),
        n => {
            return Err(FilesError::Invalid(format!(
                "pass exactly one SQL statement; found {n}"
            )));
        }
    };
    let refused = |kind: &str| {
        FilesError::Invalid(format!(
            "only a read-only SELECT or WITH query is allowed; `{kind}` is refused"
        ))
    };
    match &statement {
        Some(DfStatement::Statement(inner)) => {
            let mut guard = ReadOnlyGuard {
                ctes: HashSet::new(),
            };
            if let ControlFlow::Break(reason) = inner.visit(&mut guard) {
                return Err(FilesError::Invalid(reason));
            }
        }
        Some(DfStatement::CreateExternalTable(_)) => return Err(refused("CREATE EXTERNAL TABLE")),
        Some(DfStatement::CopyTo(_)) => return Err(refused("COPY")),
        Some(DfStatement::Explain(_)) => return Err(refused("EXPLAIN")),
        Some(DfStatement::Reset(_)) => return Err(refused("RESET")),
        None => return Err(FilesError::Invalid("the SQL statement is empty".to_owned())),
    }
    statement.ok_or_else(|| FilesError::Invalid("the SQL statement is empty".to_owned()))
}

/// Errors at the end of input ("found: EOF") carry no position; add it.
fn with_end_position(err: FilesError, sql: &str) -> FilesError {
    match err {
        FilesError::Invalid(message) if !message.contains("Line:") => {
            let line = sql.lines().count().max(1);
            let column = sql.lines().last().map_or(0, |l| l.chars().count()) + 1;
            FilesError::Invalid(format!(
                "{message} at the end of the statement (Line: {line}, Column: {column})"
            ))
        }
        other => other,
    }
}

fn capped(message: &str) -> String {
    // The engine's own advice names a setting the caller cannot change.
    let message = message.replace(
        " or disable the datafusion.sql_parser.enable_ident_normalization configuration",
        "",
    );
    sanitize_text(&message, MAX_MESSAGE_CHARS)
}

/// Maps an engine error to a client error: mistakes in the statement are
/// invalid arguments with the engine's words; memory is resource exhaustion;
/// anything else is ours (and its detail, which may name a path, is masked).
pub(crate) fn engine_error(err: DataFusionError) -> FilesError {
    match err.find_root() {
        DataFusionError::SQL(parser, _) => {
            FilesError::Invalid(format!("invalid SQL: {}", capped(&parser_message(parser))))
        }
        DataFusionError::Plan(m) | DataFusionError::NotImplemented(m) => {
            FilesError::Invalid(format!("the SQL statement cannot run: {}", capped(m)))
        }
        DataFusionError::SchemaError(e, _) => FilesError::Invalid(format!(
            "the SQL statement cannot run: {}",
            capped(&e.to_string())
        )),
        DataFusionError::Execution(m) => {
            FilesError::Invalid(format!("the SQL statement failed: {}", capped(m)))
        }
        DataFusionError::ArrowError(e, _) => FilesError::Invalid(format!(
            "the SQL statement failed: {}",
            capped(&e.to_string())
        )),
        DataFusionError::ResourcesExhausted(m) => FilesError::TooCostly(format!(
            "the SQL statement needs more memory than allowed: {}; aggregate or filter more",
            capped(m)
        )),
        other => FilesError::Engine(other.to_string()),
    }
}

/// The SQL name of a type, as a CAST would spell it.
pub(crate) fn type_name(data_type: &DataType) -> String {
    match data_type {
        DataType::Boolean => "BOOLEAN".to_owned(),
        DataType::Int8 => "TINYINT".to_owned(),
        DataType::Int16 => "SMALLINT".to_owned(),
        DataType::Int32 => "INT".to_owned(),
        DataType::Int64 => "BIGINT".to_owned(),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
            "BIGINT UNSIGNED".to_owned()
        }
        DataType::Float16 | DataType::Float32 => "FLOAT".to_owned(),
        DataType::Float64 => "DOUBLE".to_owned(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "VARCHAR".to_owned(),
        DataType::Date32 | DataType::Date64 => "DATE".to_owned(),
        DataType::Timestamp(_, None) => "TIMESTAMP".to_owned(),
        DataType::Timestamp(_, Some(_)) => "TIMESTAMP WITH TIME ZONE".to_owned(),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => format!("DECIMAL({p},{s})"),
        DataType::Null => "NULL".to_owned(),
        other => other.to_string(),
    }
}

fn float_json(v: f64) -> Value {
    Number::from_f64(v).map_or_else(|| Value::String(v.to_string()), Value::Number)
}

/// One cell as JSON: numbers and booleans natively, text sanitised, dates
/// and times as ISO strings.
fn cell(array: &ArrayRef, formatter: &ArrayFormatter<'_>, row: usize, cut: &mut usize) -> Value {
    let mut text = |value: &str| {
        if value.chars().nth(DEFAULT_FIELD_CAP).is_some() {
            *cut += 1;
        }
        Value::String(sanitize_text(value, DEFAULT_FIELD_CAP))
    };
    if array.is_null(row) {
        return Value::Null;
    }
    match array.data_type() {
        DataType::Boolean => Value::Bool(array.as_boolean().value(row)),
        DataType::Int8 => Value::from(array.as_primitive::<Int8Type>().value(row)),
        DataType::Int16 => Value::from(array.as_primitive::<Int16Type>().value(row)),
        DataType::Int32 => Value::from(array.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => Value::from(array.as_primitive::<Int64Type>().value(row)),
        DataType::UInt8 => Value::from(array.as_primitive::<UInt8Type>().value(row)),
        DataType::UInt16 => Value::from(array.as_primitive::<UInt16Type>().value(row)),
        DataType::UInt32 => Value::from(array.as_primitive::<UInt32Type>().value(row)),
        DataType::UInt64 => Value::from(array.as_primitive::<UInt64Type>().value(row)),
        DataType::Float32 => float_json(f64::from(array.as_primitive::<Float32Type>().value(row))),
        DataType::Float64 => float_json(array.as_primitive::<Float64Type>().value(row)),
        DataType::Decimal128(..) | DataType::Decimal256(..) => {
            let text = formatter.value(row).to_string();
            text.parse::<f64>()
                .ok()
                .map_or(Value::String(text), float_json)
        }
        DataType::Utf8 => text(array.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => text(array.as_string::<i64>().value(row)),
        DataType::Utf8View => text(array.as_string_view().value(row)),
        _ => text(&formatter.value(row).to_string()),
    }
}

/// At most `max_rows` rows within `budget` bytes; whether more exist, and how many text
/// cells were cut.
fn rows_json(
    batches: &[RecordBatch],
    max_rows: usize,
    budget: usize,
) -> Result<(Vec<Value>, bool, usize)> {
    let mut cut = 0;
    let options = FormatOptions::default();
    let mut rows = Vec::new();
    let mut used = 0usize;
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|a| ArrayFormatter::try_new(a.as_ref(), &options))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|err| FilesError::Engine(err.to_string()))?;
        for row in 0..batch.num_rows() {
            if rows.len() == max_rows {
                return Ok((rows, true, cut));
            }
            let values: Vec<Value> = batch
                .columns()
                .iter()
                .zip(&formatters)
                .map(|(array, formatter)| cell(array, formatter, row, &mut cut))
                .collect();
            let value = Value::Array(values);
            let len = json_len(&value) + 1;
            if used + len > budget {
                return Ok((rows, true, cut));
            }
            used += len;
            rows.push(value);
        }
    }
    Ok((rows, false, cut))
}

impl SqlEngine {
    /// An engine whose statements share `memory_bytes`; nothing spills to disk.
    pub(crate) fn new(memory_bytes: usize) -> Result<Self> {
        let env = RuntimeEnvBuilder::new()
            .with_memory_limit(memory_bytes, 1.0)
            .with_disk_manager_builder(
                DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
            )
            .build_arc()
            .map_err(|err| FilesError::Engine(err.to_string()))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(partitions())
            .thread_name("kg-files-sql")
            .enable_all()
            .build()?;
        Ok(Self {
            env,
            workers: Workers(Some(runtime)),
            slots: Arc::new(tokio::sync::Semaphore::new(partitions())),
            profiles: Mutex::new(VecDeque::new()),
        })
    }

    /// Profiles the file and runs a checked statement on the engine's
    /// runtime, aborting it at `limit`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn query(
        self: &Arc<Self>,
        version_key: &str,
        path: &Path,
        delimiter: u8,
        statement: DfStatement,
        max_rows: usize,
        budget: usize,
        limit: std::time::Duration,
    ) -> Result<(Arc<CsvProfile>, SqlOutput)> {
        let handle = self
            .workers
            .0
            .as_ref()
            .map(|r| r.handle().clone())
            .ok_or_else(|| FilesError::Engine("SQL runtime is shut down".to_owned()))?;
        let started = tokio::time::Instant::now();
        let permit = match tokio::time::timeout(limit, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(FilesError::Engine("SQL slots are closed".to_owned())),
            Err(_) => {
                return Err(FilesError::Busy(
                    "every SQL slot is taken by running statements; retry shortly".to_owned(),
                ));
            }
        };
        let engine = self.clone();
        let version_key = version_key.to_owned();
        let path = path.to_path_buf();
        let mut task = handle.spawn(async move {
            let _permit = permit;
            let (profile, clean) = engine.profile(&version_key, &path, delimiter, true).await?;
            let table_path: &Path = clean.as_deref().unwrap_or(&path);
            let output = engine
                .run(table_path, delimiter, &profile, statement, max_rows, budget)
                .await?;
            Ok::<_, FilesError>((profile, output))
        });
        let remaining = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(remaining, &mut task).await {
            Ok(joined) => {
                joined.map_err(|err| FilesError::Engine(format!("SQL task failed: {err}")))?
            }
            Err(_) => {
                // Aborting drops DataFusion's streams, which cancels their tasks.
                task.abort();
                Err(FilesError::Timeout(format!(
                    "the SQL statement ran past its time limit of {}; filter or aggregate more",
                    crate::limits::human_duration(limit)
                )))
            }
        }
    }

    fn cached(&self, key: &str) -> Option<Arc<CsvProfile>> {
        let profiles = self.profiles.lock().unwrap_or_else(|e| e.into_inner());
        profiles
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, p)| p.clone())
    }

    fn remember(&self, key: String, profile: Arc<CsvProfile>) {
        let mut profiles = self.profiles.lock().unwrap_or_else(|e| e.into_inner());
        if profiles.iter().any(|(k, _)| *k == key) {
            return;
        }
        if profiles.len() == PROFILE_CACHE_ENTRIES {
            profiles.pop_front();
        }
        profiles.push_back((key, profile));
    }

    /// The profile of a file version (cached: versions never change), and a
    /// cleaned copy when it has malformed rows and `need_table` is set.
    pub(crate) async fn profile(
        &self,
        version_key: &str,
        path: &Path,
        delimiter: u8,
        need_table: bool,
    ) -> Result<(Arc<CsvProfile>, Option<tempfile::TempPath>)> {
        let key = format!("{version_key}:{delimiter}");
        let owned = path.to_path_buf();
        if let Some(profile) = self.cached(&key) {
            if need_table && profile.malformed_rows > 0 {
                let width = profile.columns.len();
                let clean = blocking(move || clean_copy(&owned, delimiter, width)).await?;
                return Ok((profile, Some(clean)));
            }
            return Ok((profile, None));
        }
        let (profile, clean) = blocking(move || profile_csv(&owned, delimiter)).await?;
        let profile = Arc::new(profile);
        self.remember(key, profile.clone());
        Ok((profile, clean))
    }

    /// Runs a checked statement over the CSV at `table_path` (the blob or
    /// its cleaned copy). At most `max_rows` rows within `budget` bytes.
    async fn run(
        &self,
        table_path: &Path,
        delimiter: u8,
        profile: &CsvProfile,
        statement: DfStatement,
        max_rows: usize,
        budget: usize,
    ) -> Result<SqlOutput> {
        let mut config = SessionConfig::new()
            .with_information_schema(false)
            .with_target_partitions(partitions());
        // Names match the header exactly: `SELECT Region` finds "Region".
        config.options_mut().sql_parser.enable_ident_normalization = false;
        let ctx = SessionContext::new_with_config_rt(config, self.env.clone());
        let location = table_path
            .to_str()
            .ok_or_else(|| FilesError::Engine("blob path is not UTF-8".to_owned()))?;
        let options = CsvReadOptions::new()
            .has_header(true)
            .delimiter(delimiter)
            .schema(&profile.schema)
            .file_extension("")
            .newlines_in_values(profile.newlines_in_values);
        ctx.register_csv(TABLE, location, options)
            .await
            .map_err(engine_error)?;
        let plan = ctx
            .state()
            .statement_to_plan(statement)
            .await
            .map_err(engine_error)?;
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)
            .map_err(engine_error)?;
        let frame = ctx
            .execute_logical_plan(plan)
            .await
            .map_err(engine_error)?
            .limit(0, Some(max_rows + 1))
            .map_err(engine_error)?;
        let schema = frame.schema().as_arrow().clone();
        let task = frame.task_ctx();
        let physical = frame.create_physical_plan().await.map_err(engine_error)?;
        refuse_unbounded_joins(&physical)?;
        let batches = datafusion::physical_plan::collect(physical, Arc::new(task))
            .await
            .map_err(engine_error)?;
        let columns = schema
            .fields()
            .iter()
            .map(|f| sanitize_text(f.name(), 200))
            .collect();
        let types = schema
            .fields()
            .iter()
            .map(|f| type_name(f.data_type()))
            .collect();
        let (rows, truncated, cells_cut) = rows_json(&batches, max_rows, budget)?;
        Ok(SqlOutput {
            columns,
            types,
            rows,
            truncated,
            cells_cut,
        })
    }
}

/// Refuses a plan holding a join without an equality condition (a cross or nested-loop
/// join) unless one side is a single row. Its output is the product of its inputs (9 million rows from two copies of a
/// 3,000-row file), and the engine computes it without yielding to the runtime, so the time
/// limit's abort would not land: the statement would keep its slot and a core after its
/// caller had its timeout, and two such calls would shut SQL off for every caller.
fn refuse_unbounded_joins(plan: &Arc<dyn ExecutionPlan>) -> Result<()> {
    if matches!(plan.name(), "CrossJoinExec" | "NestedLoopJoinExec")
        && !plan.children().into_iter().any(at_most_one_row)
    {
        return Err(FilesError::Invalid(
            "the statement joins rows without an equality condition (a cross join, a comma \
             between tables, or ON with only <, >, <> ...), which is not run: join on \
             `a.column = b.column`, or aggregate in a subquery first"
                .to_owned(),
        ));
    }
    plan.children()
        .into_iter()
        .try_for_each(refuse_unbounded_joins)
}

/// Whether `plan` gives at most one row: an aggregate without GROUP BY (`(SELECT MAX(k) FROM
/// data) m`), under nodes that never add rows. A join with it multiplies nothing. (The
/// engine keeps no row counts for a CSV scan, so its statistics cannot tell.)
fn at_most_one_row(plan: &Arc<dyn ExecutionPlan>) -> bool {
    if let Some(aggregate) = plan.downcast_ref::<AggregateExec>() {
        return aggregate.group_expr().expr().is_empty();
    }
    let keeps_or_drops_rows = matches!(
        plan.name(),
        "ProjectionExec"
            | "FilterExec"
            | "CoalescePartitionsExec"
            | "CoalesceBatchesExec"
            | "RepartitionExec"
            | "SortExec"
            | "SortPreservingMergeExec"
            | "GlobalLimitExec"
            | "LocalLimitExec"
    );
    match plan.children().as_slice() {
        [only] if keeps_or_drops_rows => at_most_one_row(only),
        _ => false,
    }
}

/// Threads and partitions of the SQL engine.
fn partitions() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8)
}

/// Runs blocking file work off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| FilesError::Engine(format!("blocking task failed: {err}")))?
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kg_common::{ErrorCode, ErrorExt as _};

    fn refused(sql: &str) -> String {
        let err = parse_read_only(sql).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{sql}: {err}");
        err.to_string()
    }

    #[test]
    fn only_one_read_only_query_over_data_passes() {
        for ok in [
            "SELECT * FROM data",
            "select \"Market Value (AUD)\" from data where x > 1",
            "WITH t AS (SELECT a FROM data) SELECT * FROM t JOIN data d ON t.a = d.a",
            "SELECT * FROM (SELECT 1 AS one) s",
            "SELECT 1",
            "SELECT a FROM data UNION ALL SELECT a FROM data",
        ] {
            assert!(parse_read_only(ok).is_ok(), "{ok}");
        }
        assert!(refused("SELECT 1; SELECT 2").contains("exactly one"));
        assert!(refused("").contains("empty"));
        assert!(refused("CREATE TABLE t AS SELECT 1").contains("CREATE TABLE"));
        assert!(refused("INSERT INTO data VALUES (1)").contains("INSERT"));
        assert!(refused("DROP TABLE data").contains("DROP TABLE"));
        assert!(refused("COPY data TO '/tmp/x.csv'").contains("COPY"));
        assert!(refused("EXPLAIN ANALYZE SELECT * FROM data").contains("EXPLAIN"));
        assert!(refused("SET datafusion.execution.batch_size = 1").contains("SET"));
        assert!(
            refused("CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '/etc/passwd'")
                .contains("CREATE EXTERNAL TABLE")
        );
        assert!(refused("SELECT * FROM read_csv('/etc/passwd')").contains("table functions"));
        assert!(refused("SELECT * FROM generate_series(1, 10)").contains("table functions"));
        assert!(refused("SELECT * FROM '/etc/passwd'").contains("only the table"));
        assert!(refused("SELECT * FROM other").contains("only the table"));
        assert!(refused("SELECT * FROM public.data").contains("only the table"));
        assert!(refused("SELECT * INTO t2 FROM data").contains("SELECT INTO"));
    }

    #[test]
    fn parse_errors_carry_the_position() {
        let message = refused("SELECT a FROM data WHERE");
        assert!(message.starts_with("invalid SQL:"), "{message}");
        assert!(message.contains("Line: 1, Column:"), "{message}");
        let message = refused("SELEC a FROM data");
        assert!(message.contains("Line: 1, Column: 1"), "{message}");
    }
}
