//! Access filters compiled into store predicates, and the naming rules every
//! service shares (namespace names, file paths).
//!
//! The filter is applied inside each store query, never by trimming results:
//! a Cypher `WHERE`, a SQL `WHERE`, a vector payload filter. One compiler per
//! target lives here so that all of them read the same [`AccessFilter`].

use kg_proto::v1::AccessFilter;
use serde_json::{Value, json};

/// Longest accepted file path inside a namespace.
pub const MAX_PATH_LEN: usize = 1024;

/// A Cypher boolean expression plus the parameters it references.
#[derive(Debug, Clone, PartialEq)]
pub struct CypherPredicate {
    /// The expression, e.g. `(c.enabled = true AND ...)`.
    pub text: String,
    /// Parameter names (without `$`) and values.
    pub params: Vec<(String, Value)>,
}

/// Compiles `filter` into a predicate over the node bound to `var`, whose path
/// property is `path_prop` (`path` on Chunk, `vfsPath` on FileRef). Parameter
/// names are prefixed with `param_prefix` so several predicates can share a query.
pub fn cypher_predicate(
    filter: &AccessFilter,
    var: &str,
    path_prop: &str,
    param_prefix: &str,
) -> CypherPredicate {
    if filter.allow_prefixes.is_empty() {
        // No readable prefix: nothing matches. Fail closed.
        return CypherPredicate {
            text: "false".to_owned(),
            params: Vec::new(),
        };
    }
    // Plain comparisons, one parameter per value: FalkorDB evaluates list
    // predicates (`any(p IN $list ...)`) wrongly on variables bound after a
    // `WITH`, which would silently hide readable rows.
    let mut clauses = Vec::new();
    let mut params = Vec::new();
    if filter.enabled_only {
        clauses.push(format!("{var}.enabled = true"));
    }
    if filter.visible_only {
        // Hidden is opt-in: a node written without the flag is visible.
        clauses.push(format!("coalesce({var}.hidden, false) = false"));
    }
    if !filter.allow_prefixes.iter().any(String::is_empty) {
        let alternatives: Vec<String> = filter
            .allow_prefixes
            .iter()
            .enumerate()
            .map(|(i, prefix)| {
                let name = format!("{param_prefix}allow_{i}");
                params.push((name.clone(), json!(prefix)));
                format!("{var}.{path_prop} STARTS WITH ${name}")
            })
            .collect();
        clauses.push(format!("({})", alternatives.join(" OR ")));
    }
    for (i, prefix) in filter.deny_prefixes.iter().enumerate() {
        let name = format!("{param_prefix}deny_{i}");
        params.push((name.clone(), json!(prefix)));
        clauses.push(format!("NOT ({var}.{path_prop} STARTS WITH ${name})"));
    }
    for (i, file_id) in filter.deny_file_ids.iter().enumerate() {
        let name = format!("{param_prefix}deny_file_{i}");
        params.push((name.clone(), json!(file_id)));
        clauses.push(format!("{var}.fileId <> ${name}"));
    }
    let text = if clauses.is_empty() {
        "true".to_owned()
    } else {
        format!("({})", clauses.join(" AND "))
    };
    CypherPredicate { text, params }
}

/// A SQL boolean expression plus its text parameters, numbered from the
/// `first_param` given (`$N` placeholders, accepted by SQLite and PostgreSQL).
#[derive(Debug, Clone, PartialEq)]
pub struct SqlPredicate {
    /// The expression, e.g. `(enabled = 1 AND ...)`.
    pub text: String,
    /// Values for `$first_param`, `$first_param + 1`, ...
    pub params: Vec<String>,
}

/// The columns a SQL access predicate reads (flags are integers 0/1).
#[derive(Debug, Clone, Copy)]
pub struct SqlColumns<'a> {
    /// The file path.
    pub path: &'a str,
    /// The file id.
    pub file_id: &'a str,
    /// The enabled flag.
    pub enabled: &'a str,
    /// The hidden flag.
    pub hidden: &'a str,
}

/// Compiles `filter` into a SQL predicate over `columns`. Prefix tests use
/// `substr(...) = $n`, so `%` and `_` in paths need no escaping.
pub fn sql_predicate(
    filter: &AccessFilter,
    columns: SqlColumns<'_>,
    first_param: usize,
) -> SqlPredicate {
    let SqlColumns {
        path: path_col,
        file_id: file_id_col,
        enabled: enabled_col,
        hidden: hidden_col,
    } = columns;
    if filter.allow_prefixes.is_empty() {
        return SqlPredicate {
            text: "(1 = 0)".to_owned(),
            params: Vec::new(),
        };
    }
    let mut clauses = Vec::new();
    let mut params: Vec<String> = Vec::new();
    let mut next = first_param;
    let mut bind = |value: &str, params: &mut Vec<String>| {
        params.push(value.to_owned());
        let n = next;
        next += 1;
        n
    };
    if filter.enabled_only {
        clauses.push(format!("{enabled_col} = 1"));
    }
    if filter.visible_only {
        clauses.push(format!("{hidden_col} = 0"));
    }
    if !filter.allow_prefixes.iter().any(String::is_empty) {
        let alternatives: Vec<String> = filter
            .allow_prefixes
            .iter()
            .map(|p| {
                let n = bind(p, &mut params);
                format!("substr({path_col}, 1, length(${n})) = ${n}")
            })
            .collect();
        clauses.push(format!("({})", alternatives.join(" OR ")));
    }
    for p in &filter.deny_prefixes {
        let n = bind(p, &mut params);
        clauses.push(format!("substr({path_col}, 1, length(${n})) <> ${n}"));
    }
    for f in &filter.deny_file_ids {
        let n = bind(f, &mut params);
        clauses.push(format!("{file_id_col} <> ${n}"));
    }
    let text = if clauses.is_empty() {
        "(1 = 1)".to_owned()
    } else {
        format!("({})", clauses.join(" AND "))
    };
    SqlPredicate { text, params }
}

/// Why a name or path was refused; the message says what to change.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum NameError {
    /// Bad namespace name.
    #[error(
        "invalid namespace `{0}`: use 1-63 characters a-z, 0-9, `-` or `_`, starting with a letter or digit"
    )]
    Namespace(String),
    /// Bad file path.
    #[error("invalid path `{path}`: {reason}")]
    Path {
        /// The path as given (truncated).
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl crate::error::ErrorExt for NameError {
    fn code(&self) -> crate::error::ErrorCode {
        crate::error::ErrorCode::InvalidArgument
    }
}
crate::impl_status_from!(NameError);

/// Checks a namespace name.
pub fn validate_namespace(name: &str) -> Result<(), NameError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(NameError::Namespace(name.chars().take(80).collect()))
    }
}

/// Normalises a file path inside a namespace: `/`-separated, relative, no `.`
/// or `..` segments, no empty segments, no control characters.
pub fn normalize_path(path: &str) -> Result<String, NameError> {
    let refuse = |reason| NameError::Path {
        path: path.chars().take(120).collect(),
        reason,
    };
    let trimmed = path.trim().trim_start_matches('/');
    if trimmed.is_empty() {
        return Err(refuse("the path is empty"));
    }
    if trimmed.len() > MAX_PATH_LEN {
        return Err(refuse("longer than 1024 bytes"));
    }
    if trimmed.contains('\\') {
        return Err(refuse("use `/` as the separator"));
    }
    if trimmed.chars().any(char::is_control) {
        return Err(refuse("contains control characters"));
    }
    let mut segments = Vec::new();
    for segment in trimmed.split('/') {
        match segment {
            "" => return Err(refuse("contains an empty segment (`//` or a trailing `/`)")),
            "." | ".." => return Err(refuse("`.` and `..` segments are not allowed")),
            s => segments.push(s),
        }
    }
    Ok(segments.join("/"))
}

/// Normalises a folder prefix: "" for the whole namespace, else `a/b/`.
pub fn normalize_folder_prefix(prefix: &str) -> Result<String, NameError> {
    let trimmed = prefix.trim().trim_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    Ok(format!("{}/", normalize_path(trimmed)?))
}

/// The folder part of a normalised path ("" at the root, else ending in `/`).
pub fn folder_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(i) => &path[..=i],
        None => "",
    }
}

/// Whether a file passes `filter`; the in-memory twin of the store
/// predicates, used where a single known row is checked.
pub fn allows(
    filter: &AccessFilter,
    path: &str,
    file_id: &str,
    enabled: bool,
    hidden: bool,
) -> bool {
    (!filter.enabled_only || enabled)
        && (!filter.visible_only || !hidden)
        && filter
            .allow_prefixes
            .iter()
            .any(|p| path.starts_with(p.as_str()))
        && !filter
            .deny_prefixes
            .iter()
            .any(|p| path.starts_with(p.as_str()))
        && !filter.deny_file_ids.iter().any(|f| f == file_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_grants_match_nothing() {
        let p = cypher_predicate(&AccessFilter::default(), "c", "path", "acl_");
        assert_eq!(p.text, "false");
        assert!(!allows(&AccessFilter::default(), "a.md", "f", true, false));
    }

    #[test]
    fn whole_namespace_grant_only_checks_enabled() {
        let filter = AccessFilter {
            allow_prefixes: vec![String::new()],
            enabled_only: true,
            ..Default::default()
        };
        let p = cypher_predicate(&filter, "c", "path", "acl_");
        assert_eq!(p.text, "(c.enabled = true)");
        assert!(p.params.is_empty());
        assert!(allows(&filter, "x/y.md", "f", true, true));
        assert!(!allows(&filter, "x/y.md", "f", false, false));
    }

    #[test]
    fn prefixes_and_denies_become_parameters() {
        let filter = AccessFilter {
            allow_prefixes: vec!["guides/".into()],
            deny_prefixes: vec!["guides/secret/".into()],
            deny_file_ids: vec!["f9".into()],
            enabled_only: true,
            ..Default::default()
        };
        let p = cypher_predicate(&filter, "f", "vfsPath", "a_");
        assert_eq!(
            p.text,
            "(f.enabled = true AND (f.vfsPath STARTS WITH $a_allow_0) AND NOT (f.vfsPath STARTS WITH $a_deny_0) AND f.fileId <> $a_deny_file_0)"
        );
        assert_eq!(p.params.len(), 3);
        assert!(allows(&filter, "guides/a.md", "f1", true, false));
        assert!(!allows(&filter, "guides/secret/a.md", "f1", true, false));
        assert!(!allows(&filter, "guides/a.md", "f9", true, false));
        assert!(!allows(&filter, "other/a.md", "f1", true, false));
        let readers = AccessFilter {
            visible_only: true,
            ..filter.clone()
        };
        assert!(!allows(&readers, "guides/a.md", "f1", true, true));
        let p = cypher_predicate(&readers, "c", "path", "r_");
        assert!(p.text.contains("coalesce(c.hidden, false) = false"));
    }

    #[test]
    fn sql_predicate_numbers_its_parameters() {
        let filter = AccessFilter {
            allow_prefixes: vec!["a/".into(), "b/".into()],
            deny_prefixes: vec!["a/x/".into()],
            deny_file_ids: vec!["f1".into()],
            enabled_only: true,
            ..Default::default()
        };
        let columns = SqlColumns {
            path: "path",
            file_id: "file_id",
            enabled: "enabled",
            hidden: "hidden",
        };
        let p = sql_predicate(&filter, columns, 3);
        assert_eq!(
            p.text,
            "(enabled = 1 AND (substr(path, 1, length($3)) = $3 OR substr(path, 1, length($4)) = $4) AND substr(path, 1, length($5)) <> $5 AND file_id <> $6)"
        );
        assert_eq!(p.params, vec!["a/", "b/", "a/x/", "f1"]);
        assert_eq!(
            sql_predicate(&AccessFilter::default(), columns, 1).text,
            "(1 = 0)"
        );
        let readers = AccessFilter {
            visible_only: true,
            ..filter
        };
        assert!(
            sql_predicate(&readers, columns, 1)
                .text
                .contains("hidden = 0")
        );
    }

    #[test]
    fn names_and_paths() {
        assert!(validate_namespace("demo").is_ok());
        assert!(validate_namespace("team_a-1").is_ok());
        for bad in ["", "Demo", "-x", "a b", "a/b", &"x".repeat(64)] {
            assert!(validate_namespace(bad).is_err(), "{bad}");
        }
        assert_eq!(
            normalize_path("/guides/intro.md").ok(),
            Some("guides/intro.md".into())
        );
        for bad in ["", "/", "a//b", "a/../b", "./a", "a\\b", "a/\u{7}b", "a/"] {
            assert!(normalize_path(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            normalize_folder_prefix("/guides/").ok(),
            Some("guides/".into())
        );
        assert_eq!(normalize_folder_prefix("").ok(), Some(String::new()));
        assert_eq!(folder_of("a/b/c.md"), "a/b/");
        assert_eq!(folder_of("c.md"), "");
    }
}
