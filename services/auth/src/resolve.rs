//! Turning grants and denies into per-namespace access filters, and
//! intersecting an agent's access with its user's. Pure functions: the store
//! loads the rows (a principal's own and its groups' grants, and the denies
//! that name it, its groups or everyone).
//!
//! Rules: grants union; a deny wins over every grant; a namespace left with
//! no readable prefix is absent (so asking for it is an explicit error).
//! Hidden files are readable only where the caller may write: `visible_only`
//! is false only when every readable prefix is covered by a write or admin
//! grant, so a mixed reader/writer never sees hidden files it only reads.
//! `permission` is the highest level held anywhere in the namespace; the
//! prefixes that level may write are `write_prefixes` (write and admin grants).

use std::collections::BTreeMap;

use kg_proto::v1::{AccessFilter, Permission};

/// One grant row as the resolver needs it.
#[derive(Debug, Clone)]
pub(crate) struct GrantRow {
    pub namespace: String,
    pub permission: Permission,
    pub path_prefix: String,
}

/// One deny row as the resolver needs it: exactly one of `path_prefix` and
/// `file_id` is non-empty.
#[derive(Debug, Clone)]
pub(crate) struct DenyRow {
    pub namespace: String,
    pub path_prefix: String,
    pub file_id: String,
}

/// Access filters per namespace from a principal's effective grants and the
/// denies that apply to it.
pub(crate) fn resolve(grants: &[GrantRow], denies: &[DenyRow]) -> BTreeMap<String, AccessFilter> {
    let mut deny_prefixes: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut deny_files: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for deny in denies {
        if !deny.path_prefix.is_empty() {
            deny_prefixes
                .entry(deny.namespace.as_str())
                .or_default()
                .push(deny.path_prefix.clone());
        } else if !deny.file_id.is_empty() {
            deny_files
                .entry(deny.namespace.as_str())
                .or_default()
                .push(deny.file_id.clone());
        }
    }

    let mut by_namespace: BTreeMap<String, AccessFilter> = BTreeMap::new();
    let mut writable: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut administered: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for grant in grants {
        if grant.permission == Permission::Unspecified {
            continue;
        }
        // A grant wholly inside a denied folder contributes nothing, not even
        // its permission level.
        let denied = deny_prefixes
            .get(grant.namespace.as_str())
            .is_some_and(|d| covered(&grant.path_prefix, d));
        if denied {
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
        if grant.permission >= Permission::Write {
            writable
                .entry(grant.namespace.clone())
                .or_default()
                .push(grant.path_prefix.clone());
        }
        if grant.permission == Permission::Admin {
            administered
                .entry(grant.namespace.clone())
                .or_default()
                .push(grant.path_prefix.clone());
        }
    }
    for (namespace, filter) in &mut by_namespace {
        filter.allow_prefixes = minimal_prefixes(std::mem::take(&mut filter.allow_prefixes));
        let writable = writable.get(namespace).map(Vec::as_slice).unwrap_or(&[]);
        filter.visible_only = !filter.allow_prefixes.iter().all(|p| covered(p, writable));
        filter.write_prefixes = writable.to_vec();
        filter.admin_prefixes = administered.get(namespace).cloned().unwrap_or_default();
        filter.deny_prefixes = deny_prefixes
            .get(namespace.as_str())
            .cloned()
            .unwrap_or_default();
        filter.deny_file_ids = deny_files
            .get(namespace.as_str())
            .cloned()
            .unwrap_or_default();
    }
    finish(by_namespace)
}

/// Every namespace with full admin access. Admins are exempt from denies:
/// they administer the whole deployment, hidden and denied files included.
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
                    visible_only: false,
                    write_prefixes: vec![String::new()],
                    admin_prefixes: vec![String::new()],
                    ..Default::default()
                },
            )
        })
        .collect()
}

/// What both may read: namespaces in both, prefixes in both, the denies of
/// both, the lower permission, hidden files only if both may see them, and
/// writes only where both may write.
pub(crate) fn intersect(
    agent: &BTreeMap<String, AccessFilter>,
    user: &BTreeMap<String, AccessFilter>,
) -> BTreeMap<String, AccessFilter> {
    let mut out = BTreeMap::new();
    for (namespace, a) in agent {
        let Some(u) = user.get(namespace) else {
            continue;
        };
        let permission = a.permission.min(u.permission);
        let write_prefixes = if permission >= Permission::Write as i32 {
            overlap(&a.write_prefixes, &u.write_prefixes)
        } else {
            Vec::new()
        };
        let admin_prefixes = if permission >= Permission::Admin as i32 {
            overlap(&a.admin_prefixes, &u.admin_prefixes)
        } else {
            Vec::new()
        };
        out.insert(
            namespace.clone(),
            AccessFilter {
                namespace: namespace.clone(),
                allow_prefixes: overlap(&a.allow_prefixes, &u.allow_prefixes),
                deny_prefixes: a
                    .deny_prefixes
                    .iter()
                    .chain(&u.deny_prefixes)
                    .cloned()
                    .collect(),
                deny_file_ids: a
                    .deny_file_ids
                    .iter()
                    .chain(&u.deny_file_ids)
                    .cloned()
                    .collect(),
                enabled_only: a.enabled_only || u.enabled_only,
                permission,
                visible_only: a.visible_only || u.visible_only,
                write_prefixes,
                admin_prefixes,
            },
        );
    }
    finish(out)
}

/// The folder prefixes inside both lists: two folder prefixes overlap only
/// when one contains the other, and the overlap is the narrower one.
fn overlap(a: &[String], b: &[String]) -> Vec<String> {
    let mut prefixes = Vec::new();
    for p in a {
        for q in b {
            if p.starts_with(q.as_str()) {
                prefixes.push(p.clone());
            } else if q.starts_with(p.as_str()) {
                prefixes.push(q.clone());
            }
        }
    }
    minimal_prefixes(prefixes)
}

/// Normal form: allow prefixes inside a denied folder are dropped, deny
/// prefixes that cannot match a readable path are dropped, write prefixes
/// are kept only inside a remaining allow prefix and outside every denied
/// folder, lists are sorted and deduplicated, and namespaces with nothing
/// readable are removed.
fn finish(filters: BTreeMap<String, AccessFilter>) -> BTreeMap<String, AccessFilter> {
    filters
        .into_iter()
        .filter_map(|(namespace, mut f)| {
            let deny = minimal_prefixes(std::mem::take(&mut f.deny_prefixes));
            let allow: Vec<String> = minimal_prefixes(std::mem::take(&mut f.allow_prefixes))
                .into_iter()
                .filter(|p| !covered(p, &deny))
                .collect();
            if allow.is_empty() {
                return None;
            }
            f.write_prefixes = minimal_prefixes(std::mem::take(&mut f.write_prefixes))
                .into_iter()
                .filter(|p| !covered(p, &deny) && covered(p, &allow))
                .collect();
            f.admin_prefixes = minimal_prefixes(std::mem::take(&mut f.admin_prefixes))
                .into_iter()
                .filter(|p| covered(p, &f.write_prefixes))
                .collect();
            // A deny outside every remaining allow prefix never matches.
            f.deny_prefixes = deny.into_iter().filter(|d| covered(d, &allow)).collect();
            f.allow_prefixes = allow;
            f.deny_file_ids.sort();
            f.deny_file_ids.dedup();
            Some((namespace, f))
        })
        .collect()
}

/// Whether folder prefix `p` lies inside one of `folders`.
fn covered(p: &str, folders: &[String]) -> bool {
    folders.iter().any(|f| p.starts_with(f.as_str()))
}

/// Sorted, deduplicated, without prefixes already covered by a shorter one.
fn minimal_prefixes(mut prefixes: Vec<String>) -> Vec<String> {
    prefixes.sort();
    prefixes.dedup();
    let mut kept: Vec<String> = Vec::new();
    for p in prefixes {
        if !covered(&p, &kept) {
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

    fn deny_folder(ns: &str, prefix: &str) -> DenyRow {
        DenyRow {
            namespace: ns.into(),
            path_prefix: prefix.into(),
            file_id: String::new(),
        }
    }

    fn deny_file(ns: &str, file_id: &str) -> DenyRow {
        DenyRow {
            namespace: ns.into(),
            path_prefix: String::new(),
            file_id: file_id.into(),
        }
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn grants_merge_per_namespace() {
        let f = resolve(
            &[
                grant("a", Permission::Read, "docs/"),
                grant("a", Permission::Write, "docs/team/"),
                grant("a", Permission::Read, "notes/"),
                grant("b", Permission::Read, ""),
                grant("c", Permission::Unspecified, ""),
            ],
            &[],
        );
        assert_eq!(f.keys().collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(f["a"].allow_prefixes, strings(&["docs/", "notes/"]));
        assert_eq!(f["a"].permission, Permission::Write as i32);
        assert_eq!(f["b"].allow_prefixes, vec![String::new()]);
        assert!(f["a"].enabled_only);
        assert!(f["a"].deny_prefixes.is_empty() && f["a"].deny_file_ids.is_empty());
    }

    #[test]
    fn hidden_files_are_visible_only_where_every_prefix_is_writable() {
        let f = resolve(
            &[
                grant("read", Permission::Read, ""),
                grant("write", Permission::Write, ""),
                grant("admin", Permission::Admin, "x/"),
                // Write on a subfolder of a read grant: the read part stays visible-only.
                grant("mixed", Permission::Read, ""),
                grant("mixed", Permission::Write, "team/"),
                // Read inside a write grant: covered, hidden files visible.
                grant("covered", Permission::Write, ""),
                grant("covered", Permission::Read, "sub/"),
            ],
            &[],
        );
        assert!(f["read"].visible_only);
        assert!(!f["write"].visible_only);
        assert!(!f["admin"].visible_only);
        assert!(f["mixed"].visible_only);
        assert_eq!(f["mixed"].permission, Permission::Write as i32);
        assert!(!f["covered"].visible_only);
        let admin = admin_filters(&strings(&["a", "b"]));
        assert!(
            admin
                .values()
                .all(|f| !f.visible_only && f.deny_prefixes.is_empty())
        );
    }

    #[test]
    fn write_prefixes_are_where_write_or_admin_is_granted() {
        let f = resolve(
            &[
                // Read on `docs/`, write on `team/`: the highest level is write,
                // but only `team/` may be written.
                grant("mixed", Permission::Read, "docs/"),
                grant("mixed", Permission::Write, "team/"),
                grant("mixed", Permission::Admin, "team/ops/"),
                grant("read", Permission::Read, ""),
                grant("denied", Permission::Write, ""),
                grant("denied", Permission::Write, "drafts/"),
                grant("gone", Permission::Read, ""),
                grant("gone", Permission::Write, "secret/"),
            ],
            &[
                deny_folder("denied", "drafts/"),
                deny_folder("gone", "secret/"),
            ],
        );
        assert_eq!(f["mixed"].allow_prefixes, strings(&["docs/", "team/"]));
        assert_eq!(f["mixed"].write_prefixes, strings(&["team/"]));
        assert_eq!(f["mixed"].permission, Permission::Admin as i32);
        assert!(f["read"].write_prefixes.is_empty());
        // A write grant on the whole namespace stays; one inside a denied folder goes.
        assert_eq!(f["denied"].write_prefixes, vec![String::new()]);
        assert_eq!(f["denied"].deny_prefixes, strings(&["drafts/"]));
        assert!(f["gone"].write_prefixes.is_empty());
        assert_eq!(f["gone"].permission, Permission::Read as i32);
        let admin = admin_filters(&strings(&["a"]));
        assert_eq!(admin["a"].write_prefixes, vec![String::new()]);

        // An agent writes only where both it and its user write.
        let agent = resolve(
            &[
                grant("a", Permission::Write, ""),
                grant("b", Permission::Read, ""),
            ],
            &[],
        );
        let user = resolve(
            &[
                grant("a", Permission::Read, "docs/"),
                grant("a", Permission::Write, "team/"),
                grant("b", Permission::Write, ""),
            ],
            &[],
        );
        let both = intersect(&agent, &user);
        assert_eq!(both["a"].allow_prefixes, strings(&["docs/", "team/"]));
        assert_eq!(both["a"].write_prefixes, strings(&["team/"]));
        assert_eq!(both["a"].permission, Permission::Write as i32);
        assert!(both["b"].write_prefixes.is_empty());
        assert_eq!(both["b"].permission, Permission::Read as i32);
    }

    #[test]
    fn admin_prefixes_are_where_admin_is_granted() {
        let f = resolve(
            &[
                grant("folder", Permission::Write, ""),
                grant("folder", Permission::Admin, "handbook/"),
                grant("whole", Permission::Admin, ""),
                grant("writer", Permission::Write, ""),
            ],
            &[],
        );
        // The highest level is admin in both, but only `whole` administers everything.
        assert_eq!(f["folder"].permission, Permission::Admin as i32);
        assert_eq!(f["folder"].admin_prefixes, strings(&["handbook/"]));
        assert_eq!(f["whole"].admin_prefixes, vec![String::new()]);
        assert!(f["writer"].admin_prefixes.is_empty());
        assert_eq!(
            admin_filters(&strings(&["a"]))["a"].admin_prefixes,
            vec![String::new()]
        );
        // An agent administers only where both it and its user do.
        let agent = resolve(&[grant("whole", Permission::Admin, "")], &[]);
        let user = resolve(&[grant("whole", Permission::Admin, "ops/")], &[]);
        assert_eq!(
            intersect(&agent, &user)["whole"].admin_prefixes,
            strings(&["ops/"])
        );
        let reader = resolve(&[grant("whole", Permission::Read, "")], &[]);
        assert!(
            intersect(&agent, &reader)["whole"]
                .admin_prefixes
                .is_empty()
        );
    }

    #[test]
    fn denies_win_over_grants() {
        let f = resolve(
            &[
                grant("a", Permission::Read, ""),
                grant("b", Permission::Write, "secret/"),
                grant("b", Permission::Read, "public/"),
                grant("c", Permission::Read, "only/"),
                grant("d", Permission::Read, "docs/"),
            ],
            &[
                // Inside an allow prefix: compiled as a deny prefix.
                deny_folder("a", "private/"),
                deny_folder("a", "private/deeper/"),
                deny_file("a", "file-9"),
                deny_file("a", "file-9"),
                // Covers a whole grant: the grant (and its write level) is gone.
                deny_folder("b", "secret/"),
                // Covers everything granted: the namespace disappears.
                deny_folder("c", "only/"),
                // Outside every allow prefix: irrelevant, dropped.
                deny_folder("d", "other/"),
                // A namespace without grants gains nothing from a deny.
                deny_folder("z", "x/"),
            ],
        );
        assert_eq!(f.keys().collect::<Vec<_>>(), vec!["a", "b", "d"]);
        assert_eq!(f["a"].allow_prefixes, vec![String::new()]);
        assert_eq!(f["a"].deny_prefixes, strings(&["private/"]));
        assert_eq!(f["a"].deny_file_ids, strings(&["file-9"]));
        assert_eq!(f["b"].allow_prefixes, strings(&["public/"]));
        assert_eq!(f["b"].permission, Permission::Read as i32);
        assert!(f["b"].visible_only);
        assert!(f["b"].deny_prefixes.is_empty());
        assert!(f["d"].deny_prefixes.is_empty());
    }

    #[test]
    fn agent_reads_only_what_both_read() {
        let agent = resolve(
            &[
                grant("a", Permission::Admin, ""),
                grant("b", Permission::Read, "x/"),
                grant("c", Permission::Read, "p/"),
            ],
            &[],
        );
        let user = resolve(
            &[
                grant("a", Permission::Read, "docs/"),
                grant("b", Permission::Read, "y/"),
                grant("c", Permission::Read, ""),
                grant("d", Permission::Read, ""),
            ],
            &[],
        );
        let both = intersect(&agent, &user);
        assert_eq!(both.keys().collect::<Vec<_>>(), vec!["a", "c"]);
        assert_eq!(both["a"].allow_prefixes, strings(&["docs/"]));
        assert_eq!(both["a"].permission, Permission::Read as i32);
        assert_eq!(both["c"].allow_prefixes, strings(&["p/"]));
        assert!(intersect(&agent, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn agent_and_user_denies_both_apply() {
        // The agent writes everywhere but is denied `drafts/`; the user reads
        // `docs/` (its own and its group's grants, merged by the store) but is
        // denied `docs/hr/` and one file.
        let agent = resolve(
            &[grant("a", Permission::Write, "")],
            &[deny_folder("a", "drafts/"), deny_file("a", "f-agent")],
        );
        let user = resolve(
            &[
                grant("a", Permission::Read, "docs/"),
                grant("a", Permission::Read, "drafts/own/"),
            ],
            &[deny_folder("a", "docs/hr/"), deny_file("a", "f-user")],
        );
        assert!(!agent["a"].visible_only);
        assert!(user["a"].visible_only);
        let both = intersect(&agent, &user);
        let a = &both["a"];
        // `drafts/own/` is readable by the user but inside the agent's denied folder.
        assert_eq!(a.allow_prefixes, strings(&["docs/"]));
        assert_eq!(a.deny_prefixes, strings(&["docs/hr/"]));
        assert_eq!(a.deny_file_ids, strings(&["f-agent", "f-user"]));
        assert_eq!(a.permission, Permission::Read as i32);
        assert!(a.visible_only, "visible_only holds if either side has it");

        // Two writers: hidden files stay visible.
        let writer = resolve(&[grant("a", Permission::Write, "")], &[]);
        assert!(!intersect(&agent, &writer)["a"].visible_only);

        // A deny on one side covering all the other side may read removes the namespace.
        let narrow_user = resolve(&[grant("a", Permission::Read, "drafts/x/")], &[]);
        assert!(intersect(&agent, &narrow_user).is_empty());
    }
}
