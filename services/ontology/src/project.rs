//! The project directory model: `ontology.yaml` declares objects mapped to
//! warehouse tables, their states, relations and actions. The JSON Schema of
//! the file is generated from these types ([`project_schema`]).

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{OntologyError, Result};

/// The project file inside a project directory.
pub const PROJECT_FILE: &str = "ontology.yaml";

/// One ontology project.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Project {
    /// Project name, shown in tool descriptions.
    pub name: String,
    /// What the project is about.
    #[serde(default)]
    pub description: String,
    /// Where the warehouse is.
    #[serde(default)]
    pub warehouse: WarehouseConfig,
    /// Every role an action's `policy.roles` may name.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Objects by name (lowercase snake_case): each becomes get_/list_/traverse_/propose_ tools.
    pub objects: IndexMap<String, ObjectDef>,
}

impl Project {
    /// The environment variables the effects' secret headers name, each with the first
    /// action (`object.action`) that needs it: the approval service reads them when it runs
    /// an effect, so one it lacks ends that proposal `effect_misconfigured`.
    pub fn effect_secret_variables(&self) -> Vec<(String, String)> {
        let mut seen = std::collections::BTreeMap::new();
        for (object, def) in &self.objects {
            for (action, action_def) in &def.actions {
                for variable in action_def.effect.secret_headers.values() {
                    seen.entry(variable.clone())
                        .or_insert_with(|| format!("{object}.{action}"));
                }
            }
        }
        seen.into_iter().collect()
    }

    /// [`Project::effect_secret_variables`] that this process's environment does not set.
    pub fn unset_effect_secrets(&self) -> Vec<(String, String)> {
        self.effect_secret_variables()
            .into_iter()
            .filter(|(variable, _)| std::env::var_os(variable).is_none_or(|v| v.is_empty()))
            .collect()
    }
}

/// Warehouse connection: a URL, or the name of an environment variable holding it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WarehouseConfig {
    /// `sqlite://file.db` (relative to the project directory) or `postgres://…`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Environment variable holding the URL; wins over `url` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_env: Option<String>,
}

/// An object mapped to one warehouse table.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ObjectDef {
    /// The table (`name` or `schema.name`).
    pub table: String,
    /// What one record is.
    #[serde(default)]
    pub description: String,
    /// Identity columns: declared, non-sensitive properties.
    pub identity: Vec<String>,
    /// Properties by column name.
    pub properties: IndexMap<String, PropertyDef>,
    /// Computed states: name -> SQL boolean expression over the row, e.g.
    /// `active: "cancelled_at IS NULL"`. The first that holds is the record's state.
    #[serde(default)]
    pub states: IndexMap<String, String>,
    /// Relations to other objects by key.
    #[serde(default)]
    pub relations: IndexMap<String, RelationDef>,
    /// Actions agents may propose.
    #[serde(default)]
    pub actions: IndexMap<String, ActionDef>,
}

/// A value type of a property or parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ValueType {
    /// Text.
    String,
    /// A whole number (64-bit).
    Integer,
    /// A floating-point number.
    Number,
    /// true or false.
    Boolean,
}

impl ValueType {
    /// The JSON type as a message names it: "an integer", "a string".
    pub fn json_type_with_article(self) -> &'static str {
        match self {
            ValueType::String => "a string",
            ValueType::Integer => "an integer",
            ValueType::Number => "a number",
            ValueType::Boolean => "a boolean",
        }
    }

    /// The JSON Schema type name.
    pub fn json_type(self) -> &'static str {
        match self {
            ValueType::String => "string",
            ValueType::Integer => "integer",
            ValueType::Number => "number",
            ValueType::Boolean => "boolean",
        }
    }
}

/// One property (a column).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PropertyDef {
    /// Value type.
    #[serde(rename = "type")]
    pub value_type: ValueType,
    /// Never selected, never returned; named in `redacted_properties`.
    #[serde(default)]
    pub sensitive: bool,
    /// What the property means.
    #[serde(default)]
    pub description: String,
}

/// A relation: from a column of this object's table to a key of the target object.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RelationDef {
    /// Target object name.
    pub target: String,
    /// Column of this object's table holding the key.
    pub from: String,
    /// Column of the target's table the key matches (default: the target's single identity column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// What the relation means.
    #[serde(default)]
    pub description: String,
}

/// An action agents may propose (never execute).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionDef {
    /// What the action does.
    #[serde(default)]
    pub description: String,
    /// Declared parameters.
    #[serde(default)]
    pub parameters: IndexMap<String, ParameterDef>,
    /// A state the record must be in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires: Option<String>,
    /// Who may propose it.
    pub policy: PolicyDef,
    /// Whether a human must approve it.
    pub approval: ApprovalDef,
    /// What approval runs.
    pub effect: EffectDef,
}

/// One action parameter.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParameterDef {
    /// Value type.
    #[serde(rename = "type")]
    pub value_type: ValueType,
    /// Whether a call must supply it (default true).
    #[serde(default = "yes")]
    pub required: bool,
    /// What the parameter means.
    #[serde(default)]
    pub description: String,
    /// Longest accepted string, 1-16384 characters (default 2000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::compile::MAX_PARAM_CHARS))]
    pub max_length: Option<usize>,
}

fn yes() -> bool {
    true
}

/// Allowed roles.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyDef {
    /// Roles allowed to propose the action (each declared in the project's `roles`).
    pub roles: Vec<String>,
}

/// `always`, `never`, or `{when: "amount > 100"}` (an expression over parameters).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ApprovalDef {
    /// `always` or `never`.
    Mode(ApprovalMode),
    /// Approval needed when the expression holds.
    When {
        /// Expression over parameters: comparisons (`> >= < <= == !=`), `and`, `or`, `not`,
        /// numbers, 'strings', true/false.
        when: String,
    },
}

/// Fixed approval modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalMode {
    /// Every proposal waits for a human.
    Always,
    /// No approval: runs only when the server allows auto effects.
    Never,
}

/// An HTTP webhook effect. Templates are minijinja: `{{ order_id }}`; values in
/// the URL are percent-encoded; the body template should use `{{ x | tojson }}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EffectDef {
    /// Only `webhook` exists.
    #[serde(rename = "type", default = "webhook")]
    pub kind: String,
    /// HTTP method (POST, PUT, PATCH, DELETE).
    #[serde(default = "post")]
    pub method: String,
    /// URL template (http or https).
    pub url: String,
    /// Body template; must render to JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Fixed headers.
    #[serde(default)]
    pub headers: IndexMap<String, String>,
    /// Header name -> environment variable of the approval service holding its value.
    #[serde(default)]
    pub secret_headers: IndexMap<String, String>,
    /// Per-attempt timeout in milliseconds, 100-60000 (default 5000).
    #[serde(default = "timeout_ms")]
    #[schemars(range(min = kg_proto::limits::EFFECT_TIMEOUT_MS.0, max = kg_proto::limits::EFFECT_TIMEOUT_MS.1))]
    pub timeout_ms: u32,
    /// Attempts for 5xx and timeouts, 1-10 (default 3).
    #[serde(default = "max_attempts")]
    #[schemars(range(min = 1, max = kg_proto::limits::EFFECT_MAX_ATTEMPTS))]
    pub max_attempts: u32,
}

fn webhook() -> String {
    "webhook".to_owned()
}
fn post() -> String {
    "POST".to_owned()
}
fn timeout_ms() -> u32 {
    5000
}
fn max_attempts() -> u32 {
    3
}

/// A loaded project and where it came from.
#[derive(Debug, Clone)]
pub struct LoadedProject {
    /// The project.
    pub project: Project,
    /// Its directory.
    pub dir: PathBuf,
}

impl LoadedProject {
    /// Reads `<dir>/ontology.yaml`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(PROJECT_FILE);
        let text = std::fs::read_to_string(&path).map_err(|err| {
            OntologyError::Project(format!("cannot read {}: {err}", path.display()))
        })?;
        let project = parse(&text)
            .map_err(|err| OntologyError::Project(format!("{}: {err}", path.display())))?;
        Ok(Self {
            project,
            dir: dir.to_path_buf(),
        })
    }

    /// The warehouse URL: `--warehouse-url` override, then `url_env`, then `url`;
    /// a relative SQLite path is resolved against the project directory.
    pub fn warehouse_url(&self, override_url: Option<&str>) -> Result<String> {
        let w = &self.project.warehouse;
        let url = override_url
            .map(str::to_owned)
            .or_else(|| w.url_env.as_ref().and_then(|v| std::env::var(v).ok()))
            .or_else(|| w.url.clone())
            .ok_or_else(|| {
                OntologyError::Project(
                    "warehouse: set warehouse.url or warehouse.url_env (or pass --warehouse-url)"
                        .into(),
                )
            })?;
        if let Some(rest) = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
        {
            let (path, query) = rest
                .split_once('?')
                .map_or((rest, None), |(p, q)| (p, Some(q)));
            if !path.is_empty() && path != ":memory:" && Path::new(path).is_relative() {
                let abs = self.dir.join(path);
                let mut out = format!("sqlite://{}", abs.display());
                if let Some(q) = query {
                    out.push('?');
                    out.push_str(q);
                }
                return Ok(out);
            }
        }
        Ok(url)
    }
}

/// Parses project YAML.
pub fn parse(text: &str) -> std::result::Result<Project, serde_yaml_ng::Error> {
    serde_yaml_ng::from_str(text)
}

/// The JSON Schema of `ontology.yaml`.
pub fn project_schema() -> serde_json::Value {
    let schema = schemars::schema_for!(Project);
    serde_json::to_value(&schema).unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn committed_schema_is_current() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/ontology-project.schema.json");
        let committed: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            committed,
            project_schema(),
            "regenerate with `kgmesh ontology schema > deploy/ontology-project.schema.json`"
        );
    }

    #[test]
    fn approval_forms_parse() {
        let p = parse(
            "name: t\nobjects:\n  o:\n    table: t\n    identity: [id]\n    properties: {id: {type: integer}}\n    actions:\n      a:\n        policy: {roles: [r]}\n        approval: always\n        effect: {url: 'https://x/{{ id }}'}\n      b:\n        policy: {roles: [r]}\n        approval: {when: 'amount > 100'}\n        effect: {url: 'https://x'}\n",
        )
        .unwrap();
        let o = &p.objects["o"];
        assert!(matches!(
            o.actions["a"].approval,
            ApprovalDef::Mode(ApprovalMode::Always)
        ));
        assert!(matches!(o.actions["b"].approval, ApprovalDef::When { .. }));
        assert!(parse("name: t\nobjects: {}\nbogus: 1\n").is_err());
    }
}
