//! Search filters: validation of `SearchFilters` and the Cypher each graph lane splices in.
//!
//! Every clause is a plain comparison over the chunk `c`, its FileRef `f` or, for the
//! relation filter, a REL edge inside a pattern comprehension; all values travel as
//! parameters prefixed `flt_`. Semantics:
//! - `collections`: the file is in any of them (`FileRef.collections`).
//! - `folder_prefix`: the chunk's path starts with the normalised prefix.
//! - `date_from` / `date_to`: `FileRef.documentDate` within the inclusive range; a file
//!   without a document date never matches a date filter.
//! - `effective_at`: `effectiveFrom <= d <= effectiveTo`, either end may be open, but a file
//!   with no effective window at all does not match (it never said when it applies).
//! - `relation_type_ids`: the chunk mentions an entity taking part in a REL of one of the
//!   types, stated by a file the caller may read (access predicate on the edge).
//!
//! Errors name a field as the JSON of kg_search and of the proto spell it (`filters.dateFrom`),
//! the name a caller wrote, not the Rust one.

use kg_common::access::{cypher_predicate, normalize_folder_prefix};
use kg_proto::v1::{AccessFilter, SearchFilters};
use kg_stores::graph::Params;
use serde_json::Value;

use crate::error::{Result, RetrievalError};

/// Most values accepted in one list filter.
const MAX_LIST: usize = 64;
/// Longest collection name or relation type id accepted.
const MAX_VALUE_CHARS: usize = 256;

/// Validated filters of one search.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LaneFilters {
    /// Normalised folder prefix ("" for the whole namespace, else `a/b/`).
    pub(crate) folder_prefix: String,
    pub(crate) collections: Vec<String>,
    pub(crate) date_from: Option<String>,
    pub(crate) date_to: Option<String>,
    pub(crate) effective_at: Option<String>,
    pub(crate) relation_type_ids: Vec<String>,
}

impl LaneFilters {
    /// Validates the wire filters; errors name the field and the expected form.
    pub(crate) fn parse(filters: Option<&SearchFilters>) -> Result<Self> {
        let Some(filters) = filters else {
            return Ok(Self::default());
        };
        let date_from = date("dateFrom", filters.date_from.as_deref())?;
        let date_to = date("dateTo", filters.date_to.as_deref())?;
        if let (Some(from), Some(to)) = (&date_from, &date_to)
            && from > to
        {
            return Err(RetrievalError::invalid(format!(
                "filters.dateFrom {from} is after filters.dateTo {to}"
            )));
        }
        Ok(Self {
            folder_prefix: normalize_folder_prefix(&filters.folder_prefix)
                .map_err(|err| RetrievalError::invalid(format!("filters.folderPrefix: {err}")))?,
            collections: list("collections", &filters.collections)?,
            date_from,
            date_to,
            effective_at: date("effectiveAt", filters.effective_at.as_deref())?,
            relation_type_ids: list("relationTypeIds", &filters.relation_type_ids)?,
        })
    }

    /// Whether any clause tests the FileRef (collections, dates), so a lane must match it
    /// for every candidate rather than only for the ones it keeps.
    pub(crate) fn needs_file(&self) -> bool {
        !self.collections.is_empty()
            || self.date_from.is_some()
            || self.date_to.is_some()
            || self.effective_at.is_some()
    }

    /// `AND ...` clauses over chunk `c` and its FileRef `f` (empty when nothing applies).
    /// The relation filter is not among them: see [`LaneFilters::relation_stage`].
    pub(crate) fn where_clauses(&self, c: &str, f: &str, params: &mut Params) -> String {
        let mut out = String::new();
        if !self.folder_prefix.is_empty() {
            params.insert(
                "flt_folder".into(),
                Value::from(self.folder_prefix.as_str()),
            );
            out.push_str(&format!(" AND {c}.path STARTS WITH $flt_folder"));
        }
        if !self.collections.is_empty() {
            // One `IN` per value instead of a list predicate over `f` (see kg_common::access).
            let alternatives: Vec<String> = self
                .collections
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let param = format!("flt_col_{i}");
                    params.insert(param.clone(), Value::from(name.as_str()));
                    format!("${param} IN coalesce({f}.collections, [])")
                })
                .collect();
            out.push_str(&format!(" AND ({})", alternatives.join(" OR ")));
        }
        if let Some(from) = &self.date_from {
            params.insert("flt_from".into(), Value::from(from.as_str()));
            out.push_str(&format!(
                " AND {f}.documentDate IS NOT NULL AND {f}.documentDate >= $flt_from"
            ));
        }
        if let Some(to) = &self.date_to {
            params.insert("flt_to".into(), Value::from(to.as_str()));
            out.push_str(&format!(
                " AND {f}.documentDate IS NOT NULL AND {f}.documentDate <= $flt_to"
            ));
        }
        if let Some(at) = &self.effective_at {
            params.insert("flt_at".into(), Value::from(at.as_str()));
            out.push_str(&format!(
                " AND ({f}.effectiveFrom IS NOT NULL OR {f}.effectiveTo IS NOT NULL) \
                 AND ({f}.effectiveFrom IS NULL OR {f}.effectiveFrom <= $flt_at) \
                 AND ({f}.effectiveTo IS NULL OR {f}.effectiveTo >= $flt_at)"
            ));
        }
        out
    }

    /// A `WITH ... WHERE` stage keeping rows whose chunk `c` mentions an entity in a REL of
    /// one of the filter's types stated by a readable file; `carried` lists the variables the
    /// query still needs. Empty when no relation filter is set. FalkorDB rejects a pattern
    /// comprehension inside WHERE, hence the projection.
    pub(crate) fn relation_stage(
        &self,
        c: &str,
        carried: &str,
        access: &AccessFilter,
        params: &mut Params,
    ) -> String {
        if self.relation_type_ids.is_empty() {
            return String::new();
        }
        let edge = cypher_predicate(access, "flt_r", "path", "flt_aclr_");
        params.extend(edge.params);
        params.insert(
            "flt_rel_types".into(),
            Value::Array(
                self.relation_type_ids
                    .iter()
                    .map(|t| Value::from(t.as_str()))
                    .collect(),
            ),
        );
        format!(
            " WITH {carried}, size([({c})-[:MENTIONS]->(:Entity)-[flt_r:REL]-(:Entity) \
             WHERE flt_r.relationTypeId IN $flt_rel_types AND {edge} | 1]) AS flt_rel_n \
             WHERE flt_rel_n > 0 ",
            edge = edge.text
        )
    }
}

/// A `YYYY-MM-DD` calendar date (checked for month length and leap years).
fn date(field: &str, value: Option<&str>) -> Result<Option<String>> {
    let Some(raw) = value else {
        return Ok(None);
    };
    let text = raw.trim();
    let invalid = || {
        RetrievalError::invalid(format!(
            "filters.{field} `{}` is not a date; expected YYYY-MM-DD",
            text.chars().take(32).collect::<String>()
        ))
    };
    let bytes = text.as_bytes();
    let shape_ok = bytes.len() == 10
        && bytes[4] == b'-'
        && bytes[7] == b'-'
        && bytes
            .iter()
            .enumerate()
            .all(|(i, b)| i == 4 || i == 7 || b.is_ascii_digit());
    if !shape_ok {
        return Err(invalid());
    }
    let number = |range: std::ops::Range<usize>| text[range].parse::<u32>().map_err(|_| invalid());
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return Err(invalid()),
    };
    if day == 0 || day > days {
        return Err(invalid());
    }
    Ok(Some(text.to_owned()))
}

/// Trimmed, de-duplicated, non-empty values within the caps.
fn list(field: &str, values: &[String]) -> Result<Vec<String>> {
    if values.len() > MAX_LIST {
        return Err(RetrievalError::invalid(format!(
            "filters.{field} has {} values; at most {MAX_LIST} are accepted",
            values.len()
        )));
    }
    let mut out: Vec<String> = Vec::new();
    for value in values {
        let value = value.trim();
        if value.is_empty() {
            return Err(RetrievalError::invalid(format!(
                "filters.{field} contains an empty value"
            )));
        }
        if value.chars().count() > MAX_VALUE_CHARS {
            return Err(RetrievalError::invalid(format!(
                "filters.{field} has a value longer than {MAX_VALUE_CHARS} characters"
            )));
        }
        if !out.iter().any(|v| v == value) {
            out.push(value.to_owned());
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn parse(f: SearchFilters) -> Result<LaneFilters> {
        LaneFilters::parse(Some(&f))
    }

    #[test]
    fn dates_are_checked() {
        for bad in [
            "2024",
            "2024-13-01",
            "2023-02-29",
            "2024-04-31",
            "24-01-01x",
            "2024/01/01",
        ] {
            let err = parse(SearchFilters {
                date_from: Some(bad.into()),
                ..Default::default()
            })
            .unwrap_err()
            .to_string();
            assert!(
                err.contains("filters.dateFrom") && err.contains("YYYY-MM-DD"),
                "{bad}: {err}"
            );
        }
        let ok = parse(SearchFilters {
            date_from: Some("2024-02-29".into()),
            date_to: Some(" 2024-03-01 ".into()),
            effective_at: Some("2025-01-31".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(ok.date_to.as_deref(), Some("2024-03-01"));
        let err = parse(SearchFilters {
            date_from: Some("2024-03-02".into()),
            date_to: Some("2024-03-01".into()),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("after filters.dateTo"));
    }

    #[test]
    fn lists_are_checked_and_clauses_use_parameters() {
        assert!(
            parse(SearchFilters {
                collections: vec![" ".into()],
                ..Default::default()
            })
            .unwrap_err()
            .to_string()
            .contains("filters.collections contains an empty value")
        );
        assert!(
            parse(SearchFilters {
                relation_type_ids: vec!["r".into(); 65],
                ..Default::default()
            })
            .unwrap_err()
            .to_string()
            .contains("at most 64")
        );
        let f = parse(SearchFilters {
            collections: vec!["a".into(), "a".into(), "b'); DROP".into()],
            folder_prefix: "/docs".into(),
            relation_type_ids: vec!["owns".into()],
            ..Default::default()
        })
        .unwrap();
        assert_ne!(f, LaneFilters::default());
        assert_eq!(f.collections.len(), 2);
        let mut params = Params::new();
        let clauses = f.where_clauses("c", "f", &mut params);
        assert!(!clauses.contains("DROP"));
        assert!(clauses.contains("$flt_col_1 IN coalesce(f.collections, [])"));
        assert_eq!(params.get("flt_folder"), Some(&Value::from("docs/")));
        let access = AccessFilter {
            allow_prefixes: vec!["docs/".into()],
            ..Default::default()
        };
        let stage = f.relation_stage("c", "c, f", &access, &mut params);
        assert!(stage.contains("flt_r.path STARTS WITH $flt_aclr_allow_0"));
        assert!(params.contains_key("flt_rel_types"));
    }
}
