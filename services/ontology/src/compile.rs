//! Validation (static, then against the live warehouse schema) and
//! compilation of a project into its generated tool set.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};

use crate::effect;
use crate::expr::{self, Expr};
use crate::project::{ActionDef, ApprovalDef, ApprovalMode, ObjectDef, Project, ValueType};
use crate::warehouse::{self, Comparison, Warehouse, quote_table};

/// Default rows of list_/traverse_.
pub const DEFAULT_LIMIT: i64 = 100;
/// Server-side ceiling of list_/traverse_ limits.
pub const MAX_LIMIT: i64 = 1000;
/// Longest MCP tool name.
const MAX_TOOL_NAME: usize = 64;
/// Default cap of string parameters.
pub const DEFAULT_PARAM_CHARS: usize = 2000;
/// Largest `max_length` of a string parameter: a quarter of what a proposal's arguments
/// hold, so one value always fits; the whole call is checked when it is made.
pub const MAX_PARAM_CHARS: usize = kg_proto::limits::PROPOSAL_ARGUMENTS_BYTES / 4;

/// The note attached to every read result.
pub const REDACTION_NOTE: &str = "Properties marked sensitive in the ontology are not returned. They were never read from the database.";

/// What a generated tool does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolTarget {
    /// `get_<object>`.
    Get {
        /// Object name.
        object: String,
    },
    /// `list_<object>`.
    List {
        /// Object name.
        object: String,
    },
    /// `traverse_<object>_<relation>`.
    Traverse {
        /// Source object.
        object: String,
        /// Relation name.
        relation: String,
    },
    /// `propose_<object>_<action>`.
    Propose {
        /// Object name.
        object: String,
        /// Action name.
        action: String,
    },
}

/// One generated tool.
#[derive(Debug, Clone)]
pub struct GeneratedToolDef {
    /// Tool name.
    pub name: String,
    /// Description stating precondition, roles and approval.
    pub description: String,
    /// Input JSON Schema.
    pub input_schema: Value,
    /// Output JSON Schema.
    pub output_schema: Value,
    /// false only for propose_.
    pub read_only: bool,
    /// What it runs.
    pub target: ToolTarget,
    /// Roles allowed (propose_ only; empty for read tools).
    pub roles: Vec<String>,
}

/// A compiled project.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The project.
    pub project: Project,
    /// Tools in a stable order.
    pub tools: Vec<GeneratedToolDef>,
    /// Hash of the whole project (positive): the compiled version the gateway
    /// follows for `tools/list_changed`. Proposals carry [`Compiled::action_version`].
    pub policy_version: i64,
    /// Parsed `approval.when` per (object, action).
    pub(crate) when: BTreeMap<(String, String), Expr>,
    /// [`action_policy_version`] per (object, action).
    pub(crate) action_versions: BTreeMap<(String, String), i64>,
}

impl Compiled {
    /// The tool named `name`.
    pub fn tool(&self, name: &str) -> Option<&GeneratedToolDef> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The policy version of one action (0 for an unknown action): what a
    /// proposal records and what the approval service compares at decision time.
    pub fn action_version(&self, object: &str, action: &str) -> i64 {
        self.action_versions
            .get(&(object.to_owned(), action.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// Tools visible to `roles`: read tools always; propose_ when a role is allowed.
    pub fn tools_for(&self, roles: &[String]) -> Vec<&GeneratedToolDef> {
        self.tools
            .iter()
            .filter(|t| t.read_only || t.roles.iter().any(|r| roles.contains(r)))
            .collect()
    }
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
}

/// Does `expr` mention `column` as a whole word (case-insensitive)?
fn mentions(expr: &str, column: &str) -> bool {
    let lower = expr.to_ascii_lowercase();
    let col = column.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    lower.match_indices(&col).any(|(i, _)| {
        let before = i.checked_sub(1).map(|j| bytes[j]);
        let after = bytes.get(i + col.len()).copied();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}

/// The name a state would write for `table`: its last dotted part, unquoted.
fn table_word(table: &str) -> &str {
    let last = table.rsplit('.').next().unwrap_or(table).trim();
    last.trim_matches(|c| matches!(c, '"' | '`' | '[' | ']'))
}

/// Does `expr` mention `name` as a whole word not followed by `.` (a column qualified by
/// its table, `orders.total`, is fine; `orders` alone is the whole row)?
fn mentions_unqualified(expr: &str, name: &str) -> bool {
    if name.is_empty() {
        return false;
    }
    let lower = expr.to_ascii_lowercase();
    let name = name.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    lower.match_indices(&name).any(|(i, _)| {
        let end = i + name.len();
        let before = i.checked_sub(1).map(|j| bytes[j]);
        // A quoted name (`"orders".total`) is qualified too: skip one closing quote.
        let mut next = end;
        if matches!(bytes.get(next), Some(b'"' | b'`' | b']')) {
            next += 1;
        }
        let rest = lower[next..].trim_start();
        // `orders.*` is the whole row too.
        let qualified = rest
            .strip_prefix('.')
            .is_some_and(|column| !column.trim_start().starts_with('*'));
        !before.is_some_and(is_word) && !bytes.get(end).copied().is_some_and(is_word) && !qualified
    })
}

fn sample(ty: ValueType) -> Value {
    match ty {
        ValueType::String => json!("x"),
        ValueType::Integer => json!(1),
        ValueType::Number => json!(1.5),
        ValueType::Boolean => json!(true),
    }
}

/// Every tool name a project generates, with what generates it.
fn tool_names(project: &Project) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (o, obj) in &project.objects {
        out.push((format!("get_{o}"), format!("object `{o}`")));
        out.push((format!("list_{o}"), format!("object `{o}`")));
        for r in obj.relations.keys() {
            out.push((format!("traverse_{o}_{r}"), format!("relation `{o}.{r}`")));
        }
        for a in obj.actions.keys() {
            out.push((format!("propose_{o}_{a}"), format!("action `{o}.{a}`")));
        }
    }
    out
}

/// Static checks: everything that needs no database. Every problem at once.
pub fn check_static(project: &Project) -> Vec<String> {
    let mut p = Vec::new();
    for role in &project.roles {
        if !is_name(role) {
            p.push(format!(
                "roles: `{role}` is not a valid role name (lowercase letters, digits, _)"
            ));
        }
    }
    if project.objects.is_empty() {
        p.push("objects: declare at least one object".into());
    }
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (name, source) in tool_names(project) {
        if name.len() > MAX_TOOL_NAME {
            p.push(format!("{source}: generated tool name `{name}` is longer than {MAX_TOOL_NAME} characters; shorten the names"));
        }
        if kg_common::tool_names::is_reserved(&name) {
            p.push(format!(
                "{source} generates the tool `{name}`, which is a built-in kgmesh tool's name \
                 (MCP clients see one list of names); rename it"
            ));
        }
        if let Some(first) = seen.get(&name) {
            p.push(format!(
                "{source} and {first} both generate the tool `{name}`; rename one of them"
            ));
        } else {
            seen.insert(name, source);
        }
    }
    for (o, obj) in &project.objects {
        check_object(project, o, obj, &mut p);
    }
    p
}

fn check_object(project: &Project, o: &str, obj: &ObjectDef, p: &mut Vec<String>) {
    let at = format!("objects.{o}");
    if !is_name(o) {
        p.push(format!(
            "{at}: object names are lowercase snake_case (letters, digits, _)"
        ));
    }
    if obj.table.trim().is_empty() {
        p.push(format!("{at}.table: name the warehouse table"));
    }
    if obj.properties.is_empty() {
        p.push(format!(
            "{at}.properties: declare at least the identity columns"
        ));
    }
    if obj.identity.is_empty() {
        p.push(format!("{at}.identity: list the identity column(s)"));
    }
    for id in &obj.identity {
        match obj.properties.get(id) {
            None => p.push(format!("{at}.identity: `{id}` is not a declared property; add it under properties")),
            Some(prop) if prop.sensitive => p.push(format!(
                "{at}.identity: `{id}` is sensitive; identity columns are returned, so it cannot be sensitive"
            )),
            Some(_) => {}
        }
        if id == "limit" || id == "dry_run" || id == "state" {
            p.push(format!(
                "{at}.identity: `{id}` collides with a generated tool input; rename the property"
            ));
        }
    }
    for name in obj.properties.keys() {
        if name.is_empty() || name.contains('"') {
            p.push(format!(
                "{at}.properties: `{name}` is not a usable column name"
            ));
        }
        if name == "state" && !obj.states.is_empty() {
            p.push(format!(
                "{at}.properties.state: collides with the computed `state` of the row; drop the property or the states"
            ));
        }
    }
    let sensitive: Vec<&String> = obj
        .properties
        .iter()
        .filter(|(_, d)| d.sensitive)
        .map(|(n, _)| n)
        .collect();
    for (s, expr) in &obj.states {
        if !is_name(s) {
            p.push(format!(
                "{at}.states.{s}: state names are lowercase snake_case"
            ));
        }
        if expr.trim().is_empty() {
            p.push(format!(
                "{at}.states.{s}: give a SQL boolean expression over the row"
            ));
        }
        if expr.contains(';') || expr.contains("--") || expr.contains("/*") {
            p.push(format!(
                "{at}.states.{s}: one expression only (no `;` or comments)"
            ));
        }
        for col in &sensitive {
            if mentions(expr, col) {
                p.push(format!(
                    "{at}.states.{s}: reads the sensitive property `{col}`; states must not depend on sensitive columns"
                ));
            }
        }
        // A state is an expression over its own row. A subquery, another table or the whole
        // row (the bare table name, as in `customers::text`) can reach any column, the
        // sensitive ones of this or another object included, past the check above.
        // `U&"\0065mail"` spells a name no word check can read.
        let squeezed = expr.to_ascii_lowercase().replace(' ', "");
        if squeezed.contains("u&\"") || squeezed.contains("u&'") {
            p.push(format!(
                "{at}.states.{s}: holds a Unicode-escaped name or string (U&...); write names plainly"
            ));
        }
        if mentions(expr, "select") {
            p.push(format!(
                "{at}.states.{s}: holds a subquery; a state reads only its own row's columns (no SELECT)"
            ));
        }
        let own = table_word(&obj.table);
        if mentions_unqualified(expr, own) {
            p.push(format!(
                "{at}.states.{s}: names the table `{own}` as a whole row; name its columns instead"
            ));
        }
        let others: BTreeSet<&str> = project
            .objects
            .values()
            .map(|other| table_word(&other.table))
            .filter(|table| *table != own)
            .collect();
        for table in others {
            if mentions(expr, table) {
                p.push(format!(
                    "{at}.states.{s}: reads the table `{table}`; a state reads only its own row's columns"
                ));
            }
        }
    }
    for (r, rel) in &obj.relations {
        let rat = format!("{at}.relations.{r}");
        if !is_name(r) {
            p.push(format!("{rat}: relation names are lowercase snake_case"));
        }
        match obj.properties.get(&rel.from) {
            None => p.push(format!(
                "{rat}.from: `{}` is not a declared property of `{o}`",
                rel.from
            )),
            Some(d) if d.sensitive => p.push(format!(
                "{rat}.from: `{}` is sensitive; a join key is read, so it cannot be sensitive",
                rel.from
            )),
            Some(_) => {}
        }
        let Some(target) = project.objects.get(&rel.target) else {
            p.push(format!(
                "{rat}.target: no object `{}`; declare it or use one of {:?}",
                rel.target,
                project.objects.keys().collect::<Vec<_>>()
            ));
            continue;
        };
        let to = match (&rel.to, target.identity.as_slice()) {
            (Some(to), _) => Some(to.clone()),
            (None, [one]) => Some(one.clone()),
            (None, _) => {
                p.push(format!(
                    "{rat}.to: `{}` has a composite identity; name the target column with `to`",
                    rel.target
                ));
                None
            }
        };
        if let Some(to) = to {
            match target.properties.get(&to) {
                None => p.push(format!(
                    "{rat}.to: `{to}` is not a declared property of `{}`",
                    rel.target
                )),
                Some(d) if d.sensitive => p.push(format!(
                    "{rat}.to: `{to}` is sensitive; pick a non-sensitive key"
                )),
                Some(_) => {}
            }
        }
    }
    for (a, act) in &obj.actions {
        check_action(project, o, obj, a, act, p);
    }
}

fn check_action(
    project: &Project,
    o: &str,
    obj: &ObjectDef,
    a: &str,
    act: &ActionDef,
    p: &mut Vec<String>,
) {
    let at = format!("objects.{o}.actions.{a}");
    if !is_name(a) {
        p.push(format!("{at}: action names are lowercase snake_case"));
    }
    for (name, def) in &act.parameters {
        if !is_name(name) {
            p.push(format!(
                "{at}.parameters.{name}: parameter names are lowercase snake_case"
            ));
        }
        if def
            .max_length
            .is_some_and(|n| n == 0 || n > MAX_PARAM_CHARS)
        {
            p.push(format!(
                "{at}.parameters.{name}.max_length: between 1 and {MAX_PARAM_CHARS} (a \
                 proposal's arguments hold at most {} bytes of JSON)",
                kg_proto::limits::PROPOSAL_ARGUMENTS_BYTES
            ));
        }
        if name == "dry_run" || obj.identity.contains(name) {
            p.push(format!(
                "{at}.parameters.{name}: collides with the identity or dry_run input of propose_{o}_{a}; rename it"
            ));
        }
    }
    if let Some(req) = &act.requires
        && !obj.states.contains_key(req)
    {
        p.push(format!(
            "{at}.requires: `{req}` is not a state of `{o}`; use one of {:?}",
            obj.states.keys().collect::<Vec<_>>()
        ));
    }
    if act.policy.roles.is_empty() {
        p.push(format!(
            "{at}.policy.roles: list the roles that may propose it"
        ));
    }
    for role in &act.policy.roles {
        if !project.roles.contains(role) {
            p.push(format!(
                "{at}.policy.roles: unknown role `{role}`; declare it in the project's roles (now {:?})",
                project.roles
            ));
        }
    }
    if let ApprovalDef::When { when } = &act.approval {
        match expr::parse(when) {
            Err(err) => p.push(format!("{at}.approval.when: cannot parse `{when}`: {err}")),
            Ok(e) => {
                for v in e.variables() {
                    if !act.parameters.contains_key(&v) {
                        p.push(format!(
                            "{at}.approval.when: `{v}` is not a declared parameter of the action; declare it under parameters"
                        ));
                    }
                }
            }
        }
    }
    let eff = &act.effect;
    if eff.kind != "webhook" {
        p.push(format!("{at}.effect.type: only `webhook` exists"));
    }
    if !effect::METHODS.contains(&eff.method.to_ascii_uppercase().as_str()) {
        p.push(format!(
            "{at}.effect.method: use one of {:?}",
            effect::METHODS
        ));
    }
    // The approval service's bounds: an effect outside them would run otherwise than written.
    let (least_ms, most_ms) = kg_proto::limits::EFFECT_TIMEOUT_MS;
    if !(least_ms..=most_ms).contains(&eff.timeout_ms) {
        p.push(format!(
            "{at}.effect.timeout_ms: between {least_ms} and {most_ms} (per attempt)"
        ));
    }
    let most_attempts = kg_proto::limits::EFFECT_MAX_ATTEMPTS;
    if !(1..=most_attempts).contains(&eff.max_attempts) {
        p.push(format!(
            "{at}.effect.max_attempts: between 1 and {most_attempts}"
        ));
    }
    for (h, v) in &eff.headers {
        if !is_header_name(h) {
            p.push(format!("{at}.effect.headers: `{h}` is not a header name"));
        }
        if v.contains('\n') || v.contains('\r') {
            p.push(format!(
                "{at}.effect.headers.{h}: no line breaks in header values"
            ));
        }
    }
    for (h, env) in &eff.secret_headers {
        if !is_header_name(h) {
            p.push(format!(
                "{at}.effect.secret_headers: `{h}` is not a header name"
            ));
        }
        if !is_env_name(env) {
            p.push(format!(
                "{at}.effect.secret_headers.{h}: `{env}` is not an environment variable name (A-Z, 0-9, _)"
            ));
        }
        // The approval service's environment holds kgmesh's own settings (the database URL
        // with its password, on Kubernetes) and the warehouse's: a header naming one would
        // send it to the webhook's host, unseen by the person approving.
        if kg_common::config::is_kgmesh_variable(env) {
            p.push(format!(
                "{at}.effect.secret_headers.{h}: `{env}` is one of kgmesh's own settings; name a variable that holds only this webhook's secret"
            ));
        }
        if project.warehouse.url_env.as_deref() == Some(env.as_str()) {
            p.push(format!(
                "{at}.effect.secret_headers.{h}: `{env}` holds the warehouse URL; name a variable that holds only this webhook's secret"
            ));
        }
    }
    let known: Vec<String> = obj
        .identity
        .iter()
        .chain(act.parameters.keys())
        .cloned()
        .collect();
    let mut templates_ok = true;
    for (field, tmpl) in [("url", Some(&eff.url)), ("body", eff.body.as_ref())] {
        let Some(tmpl) = tmpl else { continue };
        match effect::unknown_variables(tmpl, &known) {
            Err(err) => {
                templates_ok = false;
                p.push(format!("{at}.effect.{field}: template syntax error: {err}"));
            }
            Ok(unknown) if !unknown.is_empty() => {
                templates_ok = false;
                p.push(format!(
                    "{at}.effect.{field}: uses {unknown:?}, which are neither identity columns nor parameters ({known:?})"
                ));
            }
            Ok(_) => {}
        }
    }
    if templates_ok {
        let mut vars = Map::new();
        for id in &obj.identity {
            if let Some(d) = obj.properties.get(id) {
                vars.insert(id.clone(), sample(d.value_type));
            }
        }
        for (n, d) in &act.parameters {
            vars.insert(n.clone(), sample(d.value_type));
        }
        if let Err(err) = effect::render(eff, &vars) {
            p.push(format!("{at}.effect: {err}"));
        }
    }
}

/// Checks against the live warehouse: tables and columns exist, state
/// expressions and the generated SELECTs compile (`LIMIT 0`, no row read).
pub async fn check_live(project: &Project, wh: &mut Warehouse) -> Vec<String> {
    let mut p = Vec::new();
    let mut comparable = true;
    for (o, obj) in &project.objects {
        let at = format!("objects.{o}");
        let columns = match wh.columns(&obj.table).await {
            Ok(c) => c,
            Err(err) => {
                tracing::warn!(error = %err, table = %obj.table, "cannot introspect table");
                p.push(format!(
                    "{at}.table: cannot read the columns of `{}` (see the server log)",
                    obj.table
                ));
                continue;
            }
        };
        if columns.is_empty() {
            p.push(format!(
                "{at}.table: table `{}` does not exist in the warehouse",
                obj.table
            ));
            continue;
        }
        let mut missing = false;
        for name in obj.properties.keys() {
            if !columns.iter().any(|c| c == name) {
                missing = true;
                comparable = false;
                p.push(format!(
                    "{at}.properties.{name}: table `{}` has no column `{name}` (it has {columns:?})",
                    obj.table
                ));
            }
        }
        let table = quote_table(&obj.table);
        let mut states_ok = true;
        for (s, e) in &obj.states {
            if let Err(err) = wh
                .compiles(format!(
                    "SELECT CASE WHEN ({e}) THEN 1 ELSE 0 END FROM {table} LIMIT 0"
                ))
                .await
            {
                states_ok = false;
                p.push(format!(
                    "{at}.states.{s}: `{e}` does not compile against `{}`: {err}",
                    obj.table
                ));
            }
        }
        if !missing
            && states_ok
            && let Err(err) = wh
                .compiles(format!(
                    "SELECT {} FROM {table} LIMIT 0",
                    warehouse::select_list(obj)
                ))
                .await
        {
            p.push(format!(
                "{at}: the generated SELECT does not compile (check the property types): {err}"
            ));
        }
    }
    if comparable && p.is_empty() {
        let (planned, problems) = plan_comparisons(project, wh).await;
        p.extend(problems);
        wh.set_comparisons(planned);
    }
    p
}

/// How each column a tool looks values up by (identities, relation keys) is compared with
/// a value of its declared type; a column no form can compare is a problem.
async fn plan_comparisons(
    project: &Project,
    wh: &Warehouse,
) -> (HashMap<(String, String), Comparison>, Vec<String>) {
    let mut keys: BTreeSet<(&str, &str)> = BTreeSet::new();
    for (o, obj) in &project.objects {
        keys.extend(obj.identity.iter().map(|c| (o.as_str(), c.as_str())));
        for rel in obj.relations.values() {
            if let Some(target) = project.objects.get(&rel.target)
                && let Some(to) = rel.to.as_ref().or_else(|| target.identity.first())
            {
                keys.insert((rel.target.as_str(), to.as_str()));
            }
        }
    }
    let mut planned = HashMap::new();
    let mut problems = Vec::new();
    for (o, column) in keys {
        let Some(obj) = project.objects.get(o) else {
            continue;
        };
        let Some(ty) = obj.properties.get(column).map(|d| d.value_type) else {
            continue;
        };
        match wh.plan_comparison(&obj.table, column, ty).await {
            Ok(how) => {
                planned.insert((obj.table.clone(), column.to_owned()), how);
            }
            Err(err) => problems.push(format!(
                "objects.{o}.properties.{column}: tools look records up by this column, and \
                 `{}` cannot compare it with a {} value: {err}; declare the type that matches \
                 the column",
                obj.table,
                ty.json_type()
            )),
        }
    }
    (planned, problems)
}

/// The first 63 bits of the SHA-256 of a value's JSON (positive).
fn hash63(value: &impl serde::Serialize) -> i64 {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first) & i64::MAX
}

/// A project's policy version: the hash of its canonical JSON.
pub fn policy_version(project: &Project) -> i64 {
    hash63(project)
}

/// One action's policy version: the hash of exactly what governs it, so a
/// recompile that changes another action leaves its pending proposals
/// approvable. Covered: the record it acts on (table, identity columns and
/// their types, the ordered state expressions its precondition is judged
/// by), `requires`, parameter types/required/max_length, allowed roles, the
/// approval rule and the whole effect. Descriptions are not: they govern nothing.
pub fn action_policy_version(project: &Project, object: &str, action: &str) -> Option<i64> {
    let obj = project.objects.get(object)?;
    let act = obj.actions.get(action)?;
    let identity: Vec<(&String, Option<ValueType>)> = obj
        .identity
        .iter()
        .map(|c| (c, obj.properties.get(c).map(|p| p.value_type)))
        .collect();
    // Name order of parameters and roles is not policy; state order is (first that holds).
    let parameters: BTreeMap<&String, Value> = act
        .parameters
        .iter()
        .map(|(n, p)| {
            (
                n,
                json!({"type": p.value_type, "required": p.required, "max_length": p.max_length}),
            )
        })
        .collect();
    let mut roles: Vec<&String> = act.policy.roles.iter().collect();
    roles.sort();
    roles.dedup();
    let states: Vec<(&String, &String)> = obj.states.iter().collect();
    Some(hash63(&json!({
        "object": object,
        "action": action,
        "table": obj.table,
        "identity": identity,
        "states": states,
        "requires": act.requires,
        "parameters": parameters,
        "roles": roles,
        "approval": act.approval,
        "effect": act.effect,
    })))
}

/// Compiles a statically valid project (call [`check_static`] first).
pub fn compile(project: &Project) -> Result<Compiled, Vec<String>> {
    let problems = check_static(project);
    if !problems.is_empty() {
        return Err(problems);
    }
    let mut tools = Vec::new();
    let mut when = BTreeMap::new();
    let mut action_versions = BTreeMap::new();
    for (o, obj) in &project.objects {
        tools.push(get_tool(o, obj));
        tools.push(list_tool(o, obj));
        for (r, rel) in &obj.relations {
            if let Some(target) = project.objects.get(&rel.target) {
                tools.push(traverse_tool(
                    o,
                    obj,
                    r,
                    &rel.target,
                    target,
                    &rel.description,
                ));
            }
        }
        for (a, act) in &obj.actions {
            tools.push(propose_tool(o, obj, a, act));
            if let Some(v) = action_policy_version(project, o, a) {
                action_versions.insert((o.clone(), a.clone()), v);
            }
            if let ApprovalDef::When { when: text } = &act.approval
                && let Ok(e) = expr::parse(text)
            {
                when.insert((o.clone(), a.clone()), e);
            }
        }
    }
    Ok(Compiled {
        project: project.clone(),
        tools,
        policy_version: policy_version(project),
        when,
        action_versions,
    })
}

fn identity_props(obj: &ObjectDef) -> Map<String, Value> {
    obj.identity
        .iter()
        .filter_map(|id| obj.properties.get(id).map(|d| (id, d)))
        .map(|(id, d)| {
            (
                id.clone(),
                json!({"type": d.value_type.json_type(), "description": format!("Identity column `{id}`. {}", d.description).trim_end()}),
            )
        })
        .collect()
}

fn redaction_text(obj: &ObjectDef) -> String {
    let s: Vec<&str> = obj
        .properties
        .iter()
        .filter(|(_, d)| d.sensitive)
        .map(|(n, _)| n.as_str())
        .collect();
    if s.is_empty() {
        String::new()
    } else {
        format!(
            " Sensitive properties ({}) are never read or returned.",
            s.join(", ")
        )
    }
}

fn states_text(obj: &ObjectDef) -> String {
    if obj.states.is_empty() {
        String::new()
    } else {
        format!(
            " States: {}.",
            obj.states.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    }
}

/// `schema` or null, as anyOf branches: a `type` array is legal JSON Schema, but clients that
/// map tool schemas onto a single-type dialect (Gemini's OpenAPI subset) reject or mangle it.
fn nullable(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

fn row_schema(obj: &ObjectDef) -> Value {
    let mut props = Map::new();
    for (n, t) in warehouse::readable(obj) {
        props.insert(n.clone(), nullable(json!({"type": t.json_type()})));
    }
    if !obj.states.is_empty() {
        let states: Vec<&String> = obj.states.keys().collect();
        props.insert(
            "state".into(),
            nullable(json!({"type": "string", "enum": states})),
        );
    }
    json!({"type": "object", "properties": props})
}

fn rows_output(obj: &ObjectDef, with_truncated: bool) -> Value {
    let mut props = json!({
        "rows": {"type": "array", "items": row_schema(obj)},
        "count": {"type": "integer"},
        "redacted_properties": {"type": "array", "items": {"type": "string"}},
        "note": {"type": "string"}
    });
    let mut required = vec!["rows", "count", "redacted_properties", "note"];
    if with_truncated && let Some(m) = props.as_object_mut() {
        m.insert("truncated".into(), json!({"type": "boolean"}));
        m.insert("object".into(), json!({"type": "string"}));
        required.push("truncated");
    }
    json!({"type": "object", "properties": props, "required": required})
}

fn limit_schema() -> Value {
    json!({"type": "integer", "description": format!("Rows to return (default {DEFAULT_LIMIT}); clamped to 1..{MAX_LIMIT} by the server.")})
}

fn get_tool(o: &str, obj: &ObjectDef) -> GeneratedToolDef {
    let description = format!(
        "Get one {o} record by identity ({}). Fails with ambiguous_identity if more than one row matches and not_found if none.{}{} {}",
        obj.identity.join(", "),
        states_text(obj),
        redaction_text(obj),
        obj.description
    );
    GeneratedToolDef {
        name: format!("get_{o}"),
        description: description.trim_end().to_owned(),
        input_schema: json!({"type": "object", "properties": identity_props(obj), "required": obj.identity, "additionalProperties": false}),
        output_schema: rows_output(obj, false),
        read_only: true,
        target: ToolTarget::Get {
            object: o.to_owned(),
        },
        roles: Vec::new(),
    }
}

fn list_tool(o: &str, obj: &ObjectDef) -> GeneratedToolDef {
    let mut props = Map::new();
    if !obj.states.is_empty() {
        props.insert(
            "state".into(),
            json!({"type": "string", "enum": obj.states.keys().collect::<Vec<_>>(), "description": "Only records in this computed state."}),
        );
    }
    props.insert("limit".into(), limit_schema());
    let description = format!(
        "List {o} records ordered by identity ({}), optionally filtered by computed state. `truncated` is true when more records exist than were returned: never assume the count is the total.{}{} {}",
        obj.identity.join(", "),
        states_text(obj),
        redaction_text(obj),
        obj.description
    );
    GeneratedToolDef {
        name: format!("list_{o}"),
        description: description.trim_end().to_owned(),
        input_schema: json!({"type": "object", "properties": props, "additionalProperties": false}),
        output_schema: rows_output(obj, true),
        read_only: true,
        target: ToolTarget::List {
            object: o.to_owned(),
        },
        roles: Vec::new(),
    }
}

fn traverse_tool(
    o: &str,
    obj: &ObjectDef,
    r: &str,
    t: &str,
    target: &ObjectDef,
    about: &str,
) -> GeneratedToolDef {
    let mut props = identity_props(obj);
    props.insert("limit".into(), limit_schema());
    let description = format!(
        "From one {o} (by {}) to its related {t} records (relation `{r}`), ordered by the {t} identity. Only {t} columns are returned; the {o} record's properties are not read. `truncated` reports more rows.{} {}",
        obj.identity.join(", "),
        redaction_text(target),
        about
    );
    GeneratedToolDef {
        name: format!("traverse_{o}_{r}"),
        description: description.trim_end().to_owned(),
        input_schema: json!({"type": "object", "properties": props, "required": obj.identity, "additionalProperties": false}),
        output_schema: rows_output(target, true),
        read_only: true,
        target: ToolTarget::Traverse {
            object: o.to_owned(),
            relation: r.to_owned(),
        },
        roles: Vec::new(),
    }
}

/// The approval requirement in words.
pub fn approval_text(approval: &ApprovalDef) -> String {
    match approval {
        ApprovalDef::Mode(ApprovalMode::Always) => "always required: a human approves or rejects the proposal elsewhere".into(),
        ApprovalDef::Mode(ApprovalMode::Never) => "none declared: the effect runs only if the server allows automatic effects, otherwise the call is refused with auto_effects_disabled".into(),
        ApprovalDef::When { when } => format!("required when `{when}` (otherwise as for no approval: runs only if the server allows automatic effects)"),
    }
}

fn propose_tool(o: &str, obj: &ObjectDef, a: &str, act: &ActionDef) -> GeneratedToolDef {
    let mut props = identity_props(obj);
    let mut required: Vec<String> = obj.identity.clone();
    for (n, d) in &act.parameters {
        let mut schema = json!({"type": d.value_type.json_type(), "description": d.description});
        if d.value_type == ValueType::String
            && let Some(m) = schema.as_object_mut()
        {
            m.insert(
                "maxLength".into(),
                json!(d.max_length.unwrap_or(DEFAULT_PARAM_CHARS)),
            );
        }
        props.insert(n.clone(), schema);
        if d.required {
            required.push(n.clone());
        }
    }
    props.insert(
        "dry_run".into(),
        json!({"type": "boolean", "description": "Report what would happen against live data; nothing is stored or run."}),
    );
    let precondition = match &act.requires {
        Some(s) => format!("the {o} must be in state `{s}`"),
        None => "none".into(),
    };
    let params: Vec<String> = act
        .parameters
        .iter()
        .map(|(n, d)| {
            format!(
                "{n} ({}{})",
                d.value_type.json_type(),
                if d.required { "" } else { ", optional" }
            )
        })
        .collect();
    let description = format!(
        "Propose the action `{a}` on one {o}; this tool never executes it. {} Precondition: {precondition}. Allowed roles: {}. Approval: {}. Parameters: {}. Pass dry_run: true to see what would happen without proposing. Outcomes: dry_run, pending_approval, executed, unknown (do not retry), effect_failed.",
        act.description,
        act.policy.roles.join(", "),
        approval_text(&act.approval),
        if params.is_empty() {
            "none".to_owned()
        } else {
            params.join(", ")
        },
    );
    GeneratedToolDef {
        name: format!("propose_{o}_{a}"),
        description: description.replace("  ", " "),
        input_schema: json!({"type": "object", "properties": props, "required": required, "additionalProperties": false}),
        output_schema: json!({
            "type": "object",
            "properties": {
                "outcome": {"type": "string", "enum": ["dry_run", "pending_approval", "executed", "unknown", "effect_failed"]},
                "object": {"type": "string"}, "action": {"type": "string"},
                "identity": {"type": "object"},
                "state": nullable(json!({"type": "string"})),
                "approval_required": {"type": "boolean"},
                "proposal_id": {"type": "string"},
                "would": {"type": "string"},
                "detail": {"type": "string"},
                "effect": {"type": "object", "properties": {
                    "method": {"type": "string"}, "url_template": {"type": "string"}, "host": {"type": "string"}
                }},
                "policy_version": {"type": "integer"}
            },
            "required": ["outcome", "object", "action"]
        }),
        read_only: false,
        target: ToolTarget::Propose {
            object: o.to_owned(),
            action: a.to_owned(),
        },
        roles: act.policy.roles.clone(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn word_mentions() {
        assert!(mentions("lower(Email) LIKE '%x'", "email"));
        assert!(!mentions("email_verified = 1", "email"));
        assert!(!mentions("my_email IS NULL", "email"));
    }

    /// One change to a project.
    type Edit = dyn Fn(&mut Project);

    fn shop() -> Project {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/shop/ontology.yaml");
        crate::project::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn versions(p: &Project) -> (i64, i64) {
        let c = compile(p).unwrap();
        (
            c.action_version("order", "cancel"),
            c.action_version("order", "refund"),
        )
    }

    #[test]
    fn effect_secret_variables_are_listed_once_with_the_first_action_needing_them() {
        let mut p = shop();
        assert_eq!(
            p.effect_secret_variables(),
            [("SHOP_WEBHOOK_TOKEN".to_owned(), "order.cancel".to_owned())]
        );
        p.objects["order"].actions["refund"]
            .effect
            .secret_headers
            .insert("X-Other".into(), "KGMESH_TEST_SURELY_UNSET_VARIABLE".into());
        assert_eq!(
            p.effect_secret_variables(),
            [
                (
                    "KGMESH_TEST_SURELY_UNSET_VARIABLE".to_owned(),
                    "order.refund".to_owned()
                ),
                ("SHOP_WEBHOOK_TOKEN".to_owned(), "order.cancel".to_owned()),
            ]
        );
        assert!(p.unset_effect_secrets().contains(&(
            "KGMESH_TEST_SURELY_UNSET_VARIABLE".to_owned(),
            "order.refund".to_owned()
        )));
        // PATH is set in any environment a test runs in.
        p.objects["order"].actions["refund"]
            .effect
            .secret_headers
            .insert("X-Path".into(), "PATH".into());
        assert!(!p.unset_effect_secrets().iter().any(|(v, _)| v == "PATH"));
    }

    #[test]
    fn effect_bounds_are_the_ones_the_approval_service_runs_within() {
        let with = |timeout_ms: u32, max_attempts: u32| {
            let mut p = shop();
            let effect = &mut p.objects["order"].actions["cancel"].effect;
            effect.timeout_ms = timeout_ms;
            effect.max_attempts = max_attempts;
            compile(&p).err().map(|problems| problems.join("; "))
        };
        assert_eq!(with(100, 1), None);
        assert_eq!(with(60_000, 10), None);
        for (timeout_ms, max_attempts, problem) in [
            (99, 3, "timeout_ms: between 100 and 60000"),
            // Accepted before, then cut to 60 s by the approval service without a word.
            (90_000, 3, "timeout_ms: between 100 and 60000"),
            (5_000, 11, "max_attempts: between 1 and 10"),
        ] {
            let err = with(timeout_ms, max_attempts).expect("refused");
            assert!(err.contains(problem), "{err}");
        }
    }

    #[test]
    fn a_state_reads_only_its_own_rows_columns() {
        let with_state = |expr: &str| {
            let mut p = shop();
            p.objects["order"]
                .states
                .insert("probe".into(), expr.to_owned());
            check_static(&p).join("; ")
        };
        for fine in [
            "total > 100",
            "orders.total > 100 AND \"orders\".cancelled_at IS NULL",
            "customer_id IN (1, 2)",
        ] {
            assert_eq!(with_state(fine), "", "{fine}");
        }
        for (expr, problem) in [
            // Another object's sensitive column through a subquery.
            (
                "(SELECT c.email FROM customers c WHERE c.customer_id = orders.customer_id) LIKE 'a%'",
                "holds a subquery",
            ),
            (
                "EXISTS (select 1 from customers)",
                "reads the table `customers`",
            ),
            ("customers.email LIKE 'a%'", "reads the table `customers`"),
            (
                "orders::text LIKE '%@%'",
                "names the table `orders` as a whole row",
            ),
            ("row_to_json(orders) IS NOT NULL", "as a whole row"),
            ("to_jsonb(orders.*)::text LIKE '%@%'", "as a whole row"),
            ("U&\"\\0074otal\" > 1", "Unicode-escaped"),
        ] {
            let problems = with_state(expr);
            assert!(problems.contains(problem), "{expr}: {problems}");
        }
    }

    #[test]
    fn an_effect_may_not_send_kgmeshs_own_settings_or_the_warehouse_url() {
        let mut p = shop();
        p.warehouse.url_env = Some("SHOP_WAREHOUSE_URL".into());
        let headers = &mut p.objects["order"].actions["refund"].effect.secret_headers;
        headers.insert("X-Audit-Ref".into(), "KGMESH_DATABASE_URL".into());
        headers.insert("X-Wh".into(), "SHOP_WAREHOUSE_URL".into());
        let problems = check_static(&p).join("; ");
        assert!(
            problems.contains("`KGMESH_DATABASE_URL` is one of kgmesh's own settings"),
            "{problems}"
        );
        assert!(
            problems.contains("`SHOP_WAREHOUSE_URL` holds the warehouse URL"),
            "{problems}"
        );
    }

    #[test]
    fn a_project_may_not_generate_a_built_in_tools_name() {
        let mut p = shop();
        let order = p.objects["order"].clone();
        p.objects.insert("knowledge_graph".into(), order);
        let problems = check_static(&p);
        assert!(
            problems.iter().any(
                |x| x.contains("`get_knowledge_graph`, which is a built-in kgmesh tool's name")
            ),
            "{problems:?}"
        );
        assert!(check_static(&shop()).is_empty());
    }

    #[test]
    fn a_string_parameter_fits_in_a_proposal() {
        let with = |max_length: usize| {
            let mut p = shop();
            p.objects["order"].actions["cancel"].parameters["reason"].max_length = Some(max_length);
            compile(&p).err().map(|problems| problems.join("; "))
        };
        assert_eq!(with(MAX_PARAM_CHARS), None);
        for bad in [0, MAX_PARAM_CHARS + 1] {
            let err = with(bad).expect("refused");
            assert!(err.contains("max_length: between 1 and 16384"), "{err}");
        }
    }

    #[test]
    fn action_versions_change_only_with_their_own_policy() {
        let base = shop();
        let (cancel, refund) = versions(&base);
        assert!(cancel > 0 && refund > 0 && cancel != refund);
        assert_eq!(compile(&base).unwrap().action_version("order", "nope"), 0);

        // Another action's policy, an unrelated object, descriptions: cancel keeps its version.
        let unrelated: Vec<Box<Edit>> = vec![
            Box::new(|p: &mut Project| {
                p.objects["order"].actions["refund"]
                    .effect
                    .url
                    .push_str("?v=2")
            }),
            Box::new(|p: &mut Project| {
                p.objects["order"].actions["refund"].policy.roles = vec!["billing".into()]
            }),
            Box::new(|p: &mut Project| {
                p.objects["customer"]
                    .states
                    .insert("vip".into(), "1 = 1".into());
            }),
            Box::new(|p: &mut Project| {
                p.objects["order"].actions["cancel"].description = "reworded".into()
            }),
            Box::new(|p: &mut Project| p.objects["order"].actions["cancel"].policy.roles.reverse()),
            Box::new(|p: &mut Project| p.description = "reworded".into()),
        ];
        for (i, change) in unrelated.iter().enumerate() {
            let mut p = base.clone();
            change(&mut p);
            assert_eq!(
                versions(&p).0,
                cancel,
                "unrelated change {i} moved cancel's version"
            );
        }
        let mut p = base.clone();
        unrelated[0](&mut p);
        assert_ne!(versions(&p).1, refund, "refund's own effect changed");
        assert_ne!(
            policy_version(&p),
            policy_version(&base),
            "the project version still moves"
        );

        // Each part of cancel's own policy moves its version.
        let own: Vec<Box<Edit>> = vec![
            Box::new(|p: &mut Project| {
                p.objects["order"].actions["cancel"].requires = Some("shipped".into())
            }),
            Box::new(|p: &mut Project| {
                p.objects["order"].actions["cancel"]
                    .policy
                    .roles
                    .push("billing".into())
            }),
            Box::new(|p: &mut Project| {
                p.objects["order"].actions["cancel"].approval =
                    ApprovalDef::Mode(ApprovalMode::Never)
            }),
            Box::new(|p: &mut Project| {
                p.objects["order"].actions["cancel"].effect.body = Some("{}".into())
            }),
            Box::new(|p: &mut Project| {
                p.objects["order"].actions["cancel"]
                    .effect
                    .url
                    .push_str("?v=2")
            }),
            Box::new(|p: &mut Project| {
                p.objects["order"].actions["cancel"].parameters["reason"].max_length = Some(10)
            }),
        ];
        for (i, change) in own.iter().enumerate() {
            let mut p = base.clone();
            change(&mut p);
            assert_ne!(
                versions(&p).0,
                cancel,
                "cancel's own change {i} kept its version"
            );
            assert_eq!(
                versions(&p).1,
                refund,
                "cancel's change {i} moved refund's version"
            );
        }
        // The states a precondition is judged by govern every action of the object.
        let mut p = base.clone();
        p.objects["order"].states["pending"] = "shipped_at IS NULL".into();
        let (c, r) = versions(&p);
        assert!(c != cancel && r != refund, "a state expression changed");
    }
}
