//! The warehouse side: identifier quoting, the SELECT lists generated tools
//! run (sensitive columns never appear in them), schema introspection and row
//! decoding over sqlx Any (SQLite or PostgreSQL). Every value is bound.

use std::collections::HashMap;
use std::sync::Arc;

use kg_stores::sql::{SqlBackend, SqlStore};
use serde_json::{Map, Value};
use sqlx::any::{AnyArguments, AnyRow};
use sqlx::query::Query;
use sqlx::{Any, AssertSqlSafe, Row as _};

use crate::error::{ToolCode, ToolError};
use crate::project::{ObjectDef, ValueType};

/// Longest string value returned to a model, in characters.
pub const FIELD_CAP: usize = 2000;

/// Column alias of the computed state.
pub(crate) const STATE_ALIAS: &str = "__kg_state";

/// A typed value bound into a query.
#[derive(Debug, Clone, PartialEq)]
pub enum Bound {
    /// BIGINT.
    Int(i64),
    /// DOUBLE PRECISION.
    Float(f64),
    /// TEXT.
    Text(String),
    /// BOOLEAN.
    Bool(bool),
}

/// Quotes one identifier: `"name"` with inner quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a table name, `schema.table` as two identifiers.
pub fn quote_table(name: &str) -> String {
    name.split('.')
        .map(quote_ident)
        .collect::<Vec<_>>()
        .join(".")
}

/// A SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The SELECT expression of one property: cast so both backends decode it the same way.
pub(crate) fn column_expr(alias: Option<&str>, column: &str, ty: ValueType) -> String {
    let col = match alias {
        Some(a) => format!("{a}.{}", quote_ident(column)),
        None => quote_ident(column),
    };
    match ty {
        ValueType::Integer => format!("CAST({col} AS BIGINT)"),
        ValueType::Number => format!("CAST({col} AS DOUBLE PRECISION)"),
        ValueType::String => format!("CAST({col} AS TEXT)"),
        ValueType::Boolean => {
            format!(
                "CAST(CASE WHEN {col} IS NULL THEN NULL WHEN {col} THEN 1 ELSE 0 END AS BIGINT)"
            )
        }
    }
}

/// `CASE WHEN (e1) THEN 'n1' … END`, or None for an object without states.
pub(crate) fn state_expr(obj: &ObjectDef) -> Option<String> {
    if obj.states.is_empty() {
        return None;
    }
    let arms: String = obj
        .states
        .iter()
        .map(|(name, expr)| format!(" WHEN ({expr}) THEN {}", literal(name)))
        .collect();
    Some(format!("CAST(CASE{arms} ELSE NULL END AS TEXT)"))
}

/// The readable (non-sensitive) properties, in declared order.
pub(crate) fn readable(obj: &ObjectDef) -> impl Iterator<Item = (&String, ValueType)> {
    obj.properties
        .iter()
        .filter(|(_, p)| !p.sensitive)
        .map(|(n, p)| (n, p.value_type))
}

/// The SELECT list of an object's rows: readable properties and the state.
pub(crate) fn select_list(obj: &ObjectDef) -> String {
    let mut cols: Vec<String> = readable(obj)
        .map(|(n, t)| format!("{} AS {}", column_expr(None, n, t), quote_ident(n)))
        .collect();
    if let Some(state) = state_expr(obj) {
        cols.push(format!("{state} AS {}", quote_ident(STATE_ALIAS)));
    }
    cols.join(", ")
}

/// The SQL type a value of `ty` is bound as.
fn bound_sql_type(ty: ValueType) -> &'static str {
    match ty {
        ValueType::Integer => "BIGINT",
        ValueType::Number => "DOUBLE PRECISION",
        ValueType::String => "TEXT",
        ValueType::Boolean => "BOOLEAN",
    }
}

/// How a column is compared with a value bound as its declared type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Comparison {
    /// `"col" = $n`: the types compare as they are, and an index on the column serves.
    Plain,
    /// `"col" = CAST($n AS type)`: PostgreSQL has no operator between the column's type and
    /// the bound one (`uuid = text`, an enum and text), so the value takes the column's type
    /// and an index on the column still serves. A value that is not of that type (`abc` for
    /// a uuid) is refused by the database as a data exception.
    CastValue(String),
    /// `CAST("col" AS type) = $n`: the column's declared form, as the tools show it; no
    /// index serves it, so it is the last resort.
    CastColumn,
}

/// `ORDER BY` the identity columns.
pub(crate) fn identity_order(obj: &ObjectDef) -> String {
    obj.identity
        .iter()
        .map(|c| quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Binds values in order.
pub(crate) fn bind_all<'q>(
    mut query: Query<'q, Any, AnyArguments>,
    values: &[Bound],
) -> Query<'q, Any, AnyArguments> {
    for v in values {
        query = match v {
            Bound::Int(i) => query.bind(*i),
            Bound::Float(f) => query.bind(*f),
            Bound::Text(s) => query.bind(s.clone()),
            Bound::Bool(b) => query.bind(*b),
        };
    }
    query
}

/// Coerces a JSON argument to a property type; None when it does not fit.
pub(crate) fn coerce(value: &Value, ty: ValueType) -> Option<Bound> {
    match (ty, value) {
        (ValueType::Integer, Value::Number(n)) => n.as_i64().map(Bound::Int),
        (ValueType::Integer, Value::String(s)) => s.trim().parse().ok().map(Bound::Int),
        (ValueType::Number, Value::Number(n)) => n.as_f64().map(Bound::Float),
        // "NaN", "inf" and "1e999" parse, but are no number a warehouse or JSON holds (they
        // became null, read later as a parameter never supplied).
        (ValueType::Number, Value::String(s)) => s
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(Bound::Float),
        (ValueType::String, Value::String(s)) => Some(Bound::Text(s.clone())),
        (ValueType::String, Value::Number(n)) => Some(Bound::Text(n.to_string())),
        (ValueType::Boolean, Value::Bool(b)) => Some(Bound::Bool(*b)),
        _ => None,
    }
}

/// The JSON form of a bound value.
pub(crate) fn bound_json(b: &Bound) -> Value {
    match b {
        Bound::Int(i) => Value::from(*i),
        Bound::Float(f) => Value::from(*f),
        Bound::Text(s) => Value::String(s.clone()),
        Bound::Bool(b) => Value::Bool(*b),
    }
}

/// Reads column `idx` as `ty`, sanitising text.
pub(crate) fn decode(row: &AnyRow, idx: usize, ty: ValueType) -> Result<Value, sqlx::Error> {
    Ok(match ty {
        ValueType::Integer => row
            .try_get::<Option<i64>, _>(idx)?
            .map_or(Value::Null, Value::from),
        ValueType::Number => row
            .try_get::<Option<f64>, _>(idx)?
            .map_or(Value::Null, Value::from),
        ValueType::Boolean => row
            .try_get::<Option<i64>, _>(idx)?
            .map_or(Value::Null, |b| Value::Bool(b != 0)),
        ValueType::String => row
            .try_get::<Option<String>, _>(idx)?
            .map_or(Value::Null, |s| {
                Value::String(kg_common::sanitize::sanitize_text(&s, FIELD_CAP))
            }),
    })
}

/// One object row as JSON: readable properties then `state`.
pub(crate) fn row_json(row: &AnyRow, obj: &ObjectDef) -> Result<Map<String, Value>, sqlx::Error> {
    let mut out = Map::new();
    let mut idx = 0;
    for (name, ty) in readable(obj) {
        out.insert(name.clone(), decode(row, idx, ty)?);
        idx += 1;
    }
    if !obj.states.is_empty() {
        out.insert("state".into(), decode(row, idx, ValueType::String)?);
    }
    Ok(out)
}

/// The warehouse a project reads.
#[derive(Clone, Debug)]
pub struct Warehouse {
    store: SqlStore,
    /// Columns that are not compared plainly with a bound value, by (table, column); set
    /// when the project is checked against the warehouse ([`Warehouse::plan_comparison`]).
    comparisons: Arc<HashMap<(String, String), Comparison>>,
}

impl Warehouse {
    /// Connects to `url`.
    pub async fn connect(url: &str) -> Result<Self, kg_stores::StoreError> {
        Ok(Self {
            store: SqlStore::connect(url).await?,
            comparisons: Arc::default(),
        })
    }

    /// Keeps the comparisons planned for the project's key columns.
    pub(crate) fn set_comparisons(&mut self, planned: HashMap<(String, String), Comparison>) {
        self.comparisons = Arc::new(
            planned
                .into_iter()
                .filter(|(_, c)| *c != Comparison::Plain)
                .collect(),
        );
    }

    /// `column = $n` for a value bound as `ty`, in the form [`Warehouse::plan_comparison`]
    /// chose for this column.
    pub(crate) fn equals(&self, table: &str, column: &str, ty: ValueType, n: usize) -> String {
        let col = quote_ident(column);
        match self.comparisons.get(&(table.to_owned(), column.to_owned())) {
            None | Some(Comparison::Plain) => format!("{col} = ${n}"),
            Some(Comparison::CastValue(pg_type)) => format!("{col} = CAST(${n} AS {pg_type})"),
            Some(Comparison::CastColumn) => {
                format!("CAST({col} AS {}) = ${n}", bound_sql_type(ty))
            }
        }
    }

    /// `"a" = $1 AND "b" = $2` over the identity, numbering from `first`.
    pub(crate) fn identity_where(&self, obj: &ObjectDef, first: usize) -> String {
        obj.identity
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let ty = obj
                    .properties
                    .get(c)
                    .map_or(ValueType::String, |p| p.value_type);
                self.equals(&obj.table, c, ty, first + i)
            })
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// How `column` of `table` can be compared with a value bound as `ty`, tried in order of
    /// preference against the live warehouse (`LIMIT 0`, no row read); the database's error
    /// when no form compiles. SQLite compares any two values, so it is always plain.
    pub(crate) async fn plan_comparison(
        &self,
        table: &str,
        column: &str,
        ty: ValueType,
    ) -> Result<Comparison, String> {
        if self.backend() == SqlBackend::Sqlite {
            return Ok(Comparison::Plain);
        }
        let from = quote_table(table);
        let col = quote_ident(column);
        let bound = format!("CAST(NULL AS {})", bound_sql_type(ty));
        let probe =
            |lhs: &str, rhs: &str| format!("SELECT 1 FROM {from} WHERE {lhs} = {rhs} LIMIT 0");
        let plain = match self.compiles(probe(&col, &bound)).await {
            Ok(()) => return Ok(Comparison::Plain),
            Err(err) => err,
        };
        if let Some(pg_type) = self.column_type(table, column).await {
            let cast = format!("CAST({bound} AS {pg_type})");
            if self.compiles(probe(&col, &cast)).await.is_ok() {
                return Ok(Comparison::CastValue(pg_type));
            }
        }
        let cast_column = format!("CAST({col} AS {})", bound_sql_type(ty));
        match self.compiles(probe(&cast_column, &bound)).await {
            Ok(()) => Ok(Comparison::CastColumn),
            Err(_) => Err(plain),
        }
    }

    /// The PostgreSQL type of a column as the catalog spells it (`uuid`, `order_status`,
    /// `character varying(20)`); None when it cannot be read or is not a plain type name.
    async fn column_type(&self, table: &str, column: &str) -> Option<String> {
        let row = sqlx::query(
            "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = CAST($1 AS regclass) AND a.attname = $2 AND NOT a.attisdropped",
        )
        .bind(quote_table(table))
        .bind(column.to_owned())
        .fetch_optional(self.pool())
        .await
        .ok()??;
        let pg_type: String = row.try_get(0).ok()?;
        // The catalog's own spelling, spliced into SQL: only what a type name is made of.
        let plain = !pg_type.is_empty()
            && pg_type
                .chars()
                .all(|c| c.is_alphanumeric() || " _.\"(),[]".contains(c));
        plain.then_some(pg_type)
    }

    /// The backend.
    pub fn backend(&self) -> SqlBackend {
        self.store.backend()
    }

    /// The pool.
    pub(crate) fn pool(&self) -> &sqlx::AnyPool {
        self.store.pool()
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.store.close().await;
    }

    /// Runs a statement (fetch all rows) with bound values.
    pub(crate) async fn fetch(
        &self,
        sql: String,
        values: &[Bound],
    ) -> Result<Vec<AnyRow>, ToolError> {
        tracing::debug!(sql = %sql, "warehouse query");
        let query = bind_all(sqlx::query(AssertSqlSafe(sql)), values);
        query
            .fetch_all(self.pool())
            .await
            .map_err(|err| match &err {
                // SQLSTATE class 22, a data exception: a value the caller passed does not fit
                // the column it is compared with (`abc` as a uuid, an unknown enum label), or a
                // state's expression failed on a row. Only the SQLSTATE is logged: the
                // database's message quotes the offending value, which may be a sensitive one.
                sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("22")) => {
                    let sqlstate = db.code().map(|c| c.into_owned()).unwrap_or_default();
                    tracing::info!(%sqlstate, "warehouse refused a value");
                    ToolError::new(
                        ToolCode::InvalidArguments,
                        "a value does not fit the type of the warehouse column it is compared with \
                     (for example an identity that is not a valid uuid, or an unknown label), or a \
                     state of the object cannot be computed for a row; pass a value as the tools \
                     show it, and if it is right, ask the ontology's owner to check its states",
                    )
                }
                _ => ToolError::from(err),
            })
    }

    /// Column names of `table`; an empty list when the table does not exist.
    pub(crate) async fn columns(&self, table: &str) -> Result<Vec<String>, sqlx::Error> {
        let (schema, name) = match table.split_once('.') {
            Some((s, n)) => (Some(s.to_owned()), n.to_owned()),
            None => (None, table.to_owned()),
        };
        let rows = match self.backend() {
            SqlBackend::Sqlite => {
                let sql = match &schema {
                    Some(s) => format!("SELECT name FROM {}.pragma_table_info($1)", quote_ident(s)),
                    None => "SELECT name FROM pragma_table_info($1)".to_owned(),
                };
                sqlx::query(AssertSqlSafe(sql)).bind(name).fetch_all(self.pool()).await?
            }
            SqlBackend::Postgres => {
                sqlx::query(
                    "SELECT CAST(column_name AS TEXT) FROM information_schema.columns \
                     WHERE table_name = $1 AND table_schema = COALESCE($2, current_schema()) ORDER BY ordinal_position",
                )
                .bind(name)
                .bind(schema)
                .fetch_all(self.pool())
                .await?
            }
        };
        rows.iter().map(|r| r.try_get::<String, _>(0)).collect()
    }

    /// Prepares `sql` without reading rows (`LIMIT 0`); the database's error on failure.
    pub(crate) async fn compiles(&self, sql: String) -> Result<(), String> {
        sqlx::query(AssertSqlSafe(sql))
            .fetch_all(self.pool())
            .await
            .map(|_| ())
            .map_err(|err| match err {
                sqlx::Error::Database(db) => db.message().to_owned(),
                other => other.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_table("s.t"), "\"s\".\"t\"");
        assert_eq!(literal("it's"), "'it''s'");
    }

    #[test]
    fn a_number_argument_is_a_finite_number() {
        use serde_json::json;
        for fine in [json!(2.5), json!("2.5"), json!(" 40 ")] {
            assert!(
                matches!(coerce(&fine, ValueType::Number), Some(Bound::Float(_))),
                "{fine}"
            );
        }
        for bad in [
            json!("NaN"),
            json!("inf"),
            json!("-infinity"),
            json!("1e999"),
            json!("abc"),
        ] {
            assert!(coerce(&bad, ValueType::Number).is_none(), "{bad}");
        }
    }
}
