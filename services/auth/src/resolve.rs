//! Turning grants into per-namespace access filters, and intersecting an
//! agent's access with its user's. Pure functions: the store loads the rows.

use std::collections::BTreeMap;

use kg_proto::v1::{AccessFilter, Permission};

/// One grant row as the resolver needs it.
#[derive(Debug, Clone)]
pub(crate) struct GrantRow {
    pub namespace: String,
    pub permission: Permission,
    pub path_prefix: String,
}

/// Access filters per namespace from a principal's grants. Narrower prefixes
/// covered by a wider one of the same namespace are dropped.
pub(crate) fn filters_from_grants(grants: &[GrantRow]) -> BTreeMap<String, AccessFilter> {
    let mut by_namespace: BTreeMap<String, AccessFilter> = BTreeMap::new();
    for grant in grants {
        if grant.permission == Permission::Unspecified {
            continue;
        }
        let filter = by_namespace
            .entry(grant.namespace.clone())
            .or_insert_with(|| AccessFilter {
                namespace: grant.namespace.clone(),
                enabled_only: true,
                ..Default::default()
            });
        filter.allow_prefixes.push(grant.path_prefix.clone());
        if grant.permission as i32 > filter.permission {
            filter.permission = grant.permission as i32;
        }
    }
    for filter in by_namespace.values_mut() {
        filter.allow_prefixes = minimal_prefixes(std::mem::take(&mut filter.allow_prefixes));
    }
    by_namespace
}

/// Every namespace with full admin access.
pub(crate) fn admin_filters(namespaces: &[String]) -> BTreeMap<String, AccessFilter> {
    namespaces
        .iter()
        .map(|ns| {
            (
                ns.clone(),
                AccessFilter {
                    namespace: ns.clone(),
                    allow_prefixes: vec![String::new()],
                    enabled_only: true,
                    permission: Permission::Admin as i32,
                    ..Default::default()
                },
            )
        })
        .collect()
}

/// What both may read: namespaces in both, prefixes in both, the lower permission.
pub(crate) fn intersect(
    agent: &BTreeMap<String, AccessFilter>,
    user: &BTreeMap<String, AccessFilter>,
) -> BTreeMap<String, AccessFilter> {
    let mut out = BTreeMap::new();
    for (namespace, a) in agent {
        let Some(u) = user.get(namespace) else {
            continue;
        };
        let mut prefixes = Vec::new();
        for p in &a.allow_prefixes {
            for q in &u.allow_prefixes {
                // Two folder prefixes overlap only when one contains the other;
                // the overlap is the narrower one.
                if p.starts_with(q.as_str()) {
                    prefixes.push(p.clone());
                } else if q.starts_with(p.as_str()) {
                    prefixes.push(q.clone());
                }
            }
        }
        let prefixes = minimal_prefixes(prefixes);
        if prefixes.is_empty() {
            continue;
        }
        let mut deny_prefixes: Vec<String> = a
            .deny_prefixes
            .iter()
            .chain(&u.deny_prefixes)
            .cloned()
            .collect();
        deny_prefixes.sort();
        deny_prefixes.dedup();
        let mut deny_file_ids: Vec<String> = a
            .deny_file_ids
            .iter()
            .chain(&u.deny_file_ids)
            .cloned()
            .collect();
        deny_file_ids.sort();
        deny_file_ids.dedup();
        out.insert(
            namespace.clone(),
            AccessFilter {
                namespace: namespace.clone(),
                allow_prefixes: prefixes,
                deny_prefixes,
                deny_file_ids,
                enabled_only: a.enabled_only || u.enabled_only,
                permission: a.permission.min(u.permission),
            },
        );
    }
    out
}

/// Sorted, deduplicated, without prefixes already covered by a shorter one.
fn minimal_prefixes(mut prefixes: Vec<String>) -> Vec<String> {
    prefixes.sort();
    prefixes.dedup();
    let mut kept: Vec<String> = Vec::new();
    for p in prefixes {
        if !kept.iter().any(|k| p.starts_with(k.as_str())) {
            kept.push(p);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(ns: &str, perm: Permission, prefix: &str) -> GrantRow {
        GrantRow {
            namespace: ns.into(),
            permission: perm,
            path_prefix: prefix.into(),
        }
    }

    #[test]
    fn grants_merge_per_namespace() {
        let f = filters_from_grants(&[
            grant("a", Permission::Read, "docs/"),
            grant("a", Permission::Write, "docs/team/"),
            grant("a", Permission::Read, "notes/"),
            grant("b", Permission::Read, ""),
        ]);
        assert_eq!(
            f["a"].allow_prefixes,
            vec!["docs/".to_owned(), "notes/".to_owned()]
        );
        assert_eq!(f["a"].permission, Permission::Write as i32);
        assert_eq!(f["b"].allow_prefixes, vec![String::new()]);
        assert!(f["a"].enabled_only);
    }

    #[test]
    fn agent_reads_only_what_both_read() {
        let agent = filters_from_grants(&[
            grant("a", Permission::Admin, ""),
            grant("b", Permission::Read, "x/"),
            grant("c", Permission::Read, "p/"),
        ]);
        let user = filters_from_grants(&[
            grant("a", Permission::Read, "docs/"),
            grant("b", Permission::Read, "y/"),
            grant("c", Permission::Read, ""),
            grant("d", Permission::Read, ""),
        ]);
        let both = intersect(&agent, &user);
        assert_eq!(both.keys().collect::<Vec<_>>(), vec!["a", "c"]);
        assert_eq!(both["a"].allow_prefixes, vec!["docs/".to_owned()]);
        assert_eq!(both["a"].permission, Permission::Read as i32);
        assert_eq!(both["c"].allow_prefixes, vec!["p/".to_owned()]);
        assert!(intersect(&agent, &BTreeMap::new()).is_empty());
    }
}
