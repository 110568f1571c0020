//! JSON values as Cypher parameter literals.
//!
//! FalkorDB has no server-side parameter binding: the client sends `CYPHER name=<literal> …`
//! before the query and the server parses each literal. Scalars are encoded by the falkordb
//! crate's own encoder (its string escaping is verified against the server: only
//! `\\ \' \n \r \t \b \f` are escapes, a NUL byte cannot be encoded); this module adds the
//! recursion over JSON arrays and objects.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::StoreError;

/// Query parameters by name (`$name` in the query).
pub type Params = BTreeMap<String, Value>;

/// Encodes one JSON value as a Cypher literal.
pub fn cypher_literal(value: &Value) -> Result<String, StoreError> {
    let mut out = String::new();
    encode(value, &mut out, 0)?;
    Ok(out)
}

/// Checks a parameter name: `$name` must be a Cypher identifier.
pub(crate) fn validate_param_name(name: &str) -> Result<(), StoreError> {
    if is_identifier(name) {
        Ok(())
    } else {
        Err(invalid(format!(
            "parameter name {name:?} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)"
        )))
    }
}

// Deep nesting only comes from hostile input; the server would refuse it anyway.
const MAX_DEPTH: usize = 64;

fn encode(value: &Value, out: &mut String, depth: usize) -> Result<(), StoreError> {
    if depth > MAX_DEPTH {
        return Err(invalid(format!("nested deeper than {MAX_DEPTH} levels")));
    }
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let literal = if let Some(i) = n.as_i64() {
                falkordb::to_cypher_param(&i)
            } else if n.is_u64() {
                return Err(invalid(format!("integer {n} is outside the i64 range")));
            } else if let Some(f) = n.as_f64() {
                falkordb::to_cypher_param(&f)
            } else {
                return Err(invalid(format!("number {n} has no Cypher literal")));
            };
            out.push_str(&literal.map_err(|err| invalid(err.to_string()))?);
        }
        Value::String(s) => {
            let literal =
                falkordb::to_cypher_param(s.as_str()).map_err(|err| invalid(err.to_string()))?;
            out.push_str(&literal);
        }
        Value::Array(items) => {
            out.push('[');
            for (idx, item) in items.iter().enumerate() {
                if idx > 0 {
                    out.push_str(", ");
                }
                encode(item, out, depth + 1)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            // Sorted: the literal must not depend on whether serde_json
            // preserves insertion order (a feature other crates may turn on).
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            for (idx, (key, item)) in entries.into_iter().enumerate() {
                if idx > 0 {
                    out.push_str(", ");
                }
                encode_key(key, out)?;
                out.push_str(": ");
                encode(item, out, depth + 1)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// A map key: bare when it is an identifier, else in backticks, inside which FalkorDB reads
/// every character literally. Backticks and NUL cannot be encoded at all.
fn encode_key(key: &str, out: &mut String) -> Result<(), StoreError> {
    if key.is_empty() || key.contains('`') || key.contains('\0') {
        return Err(invalid(format!(
            "map key {key:?} is empty or contains a backtick or NUL"
        )));
    }
    if is_identifier(key) {
        out.push_str(key);
    } else {
        out.push('`');
        out.push_str(key);
        out.push('`');
    }
    Ok(())
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn invalid(reason: String) -> StoreError {
    StoreError::InvalidInput {
        what: "graph query parameter",
        reason,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scalars() {
        assert_eq!(cypher_literal(&json!(null)).unwrap(), "null");
        assert_eq!(cypher_literal(&json!(true)).unwrap(), "true");
        assert_eq!(cypher_literal(&json!(-42)).unwrap(), "-42");
        assert_eq!(cypher_literal(&json!(1.0)).unwrap(), "1.0");
        assert_eq!(cypher_literal(&json!(0.25)).unwrap(), "0.25");
        assert!(cypher_literal(&json!(u64::MAX)).is_err());
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(cypher_literal(&json!("it's")).unwrap(), r"'it\'s'");
        assert_eq!(cypher_literal(&json!(r"a\b")).unwrap(), r"'a\\b'");
        assert_eq!(cypher_literal(&json!("l1\nl2")).unwrap(), r"'l1\nl2'");
        assert_eq!(
            cypher_literal(&json!(r#"' RETURN 1 //"#)).unwrap(),
            r#"'\' RETURN 1 //'"#
        );
        assert!(cypher_literal(&json!("nul\0byte")).is_err());
    }

    #[test]
    fn nested_values() {
        let value = json!({"b": [1, "x", null], "a key": {"z": false}});
        assert_eq!(
            cypher_literal(&value).unwrap(),
            "{`a key`: {z: false}, b: [1, 'x', null]}"
        );
        assert!(cypher_literal(&json!({"bad`key": 1})).is_err());
        assert!(cypher_literal(&json!({"": 1})).is_err());
        let mut deep = json!(1);
        for _ in 0..100 {
            deep = json!([deep]);
        }
        assert!(cypher_literal(&deep).is_err());
    }

    #[test]
    fn parameter_names() {
        assert!(validate_param_name("allow_1").is_ok());
        assert!(validate_param_name("_x").is_ok());
        for bad in ["", "1a", "a b", "a=1", "a-b", "ä"] {
            assert!(validate_param_name(bad).is_err(), "{bad}");
        }
    }
}
