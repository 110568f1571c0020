//! Layered configuration: defaults < TOML file < `KGMESH_*` environment.
//! Every problem is reported at once, before any port is bound.

use std::path::Path;

use figment::providers::{Env, Format as _, Serialized, Toml};
use figment::value::{Dict, Value};
use figment::{Figment, Source};
use serde::de::DeserializeOwned;

/// Prefix of every environment variable kgmesh reads as config.
pub const ENV_PREFIX: &str = "KGMESH_";

/// Whether `name` is one of kgmesh's own environment variables (its settings, the database
/// and warehouse URLs, tokens): never a secret an ontology effect may send anywhere.
pub fn is_kgmesh_variable(name: &str) -> bool {
    name.to_ascii_uppercase().starts_with(ENV_PREFIX)
}

/// All problems found in one configuration, one per line.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n{}", .problems.join("\n"))]
pub struct ConfigError {
    /// One message per problem, naming the key and what was expected.
    pub problems: Vec<String>,
}

impl ConfigError {
    /// A single problem.
    pub fn one(problem: impl Into<String>) -> Self {
        Self {
            problems: vec![problem.into()],
        }
    }
}

/// Loads `T` from the optional TOML file, then `KGMESH_<SECTION>__<KEY>`
/// variables (`__` separates nesting levels). Missing fields take `T`'s serde defaults.
pub fn load<T: DeserializeOwned>(file: Option<&Path>) -> Result<T, ConfigError> {
    let mut figment = Figment::new();
    if let Some(path) = file {
        if !path.exists() {
            return Err(ConfigError::one(format!(
                "config file {} does not exist",
                path.display()
            )));
        }
        figment = figment.merge(Toml::file(path));
    }
    figment = figment.merge(
        Env::prefixed(ENV_PREFIX)
            .split("__")
            // Command-line flags' variables, not config keys (kgmesh up/serve/mcp, the tests).
            .ignore(&[
                "CONFIG",
                "TOKEN",
                "URL",
                "CA_FILE",
                "BIN",
                "VENV",
                "ONTOLOGY_PROJECT_DIR",
                "WAREHOUSE_URL",
            ]),
    );
    let first = match figment.extract::<T>() {
        Ok(config) => return Ok(config),
        Err(err) => err,
    };
    let mut problems = vec![describe(&figment, &first)];
    // Deserialising stops at the first problem: take its key out and go again, so one run
    // lists them all. Each later error names its origin through the first figment.
    let Ok(mut values) = figment.extract::<Dict>() else {
        return Err(ConfigError { problems });
    };
    let mut last = first;
    while problems.len() < MAX_PROBLEMS && remove_key(&mut values, &last.path) {
        match Figment::from(Serialized::defaults(&values)).extract::<T>() {
            Ok(_) => break,
            Err(err) => {
                problems.push(describe(&figment, &err));
                last = err;
            }
        }
    }
    Err(ConfigError { problems })
}

/// Most problems listed from one configuration.
const MAX_PROBLEMS: usize = 20;

/// `indexer.concurrency: invalid type: ... (in kgmesh.toml)`, or the variable's name for
/// one set in the environment, without figment's profile prefix.
fn describe(figment: &Figment, err: &figment::Error) -> String {
    let key = err.path.join(".");
    let metadata = figment.find_metadata(&key).or(err.metadata.as_ref());
    let kind = &err.kind;
    match metadata {
        Some(meta) if key.is_empty() => format!("{kind} (in {})", origin(meta)),
        Some(meta) => match &meta.source {
            Some(Source::File(path)) => format!("{key}: {kind} (in {})", path.display()),
            // Our only other provider: the variable, as the operator would set it.
            _ => {
                let keys: Vec<String> = err.path.iter().map(|k| k.to_ascii_uppercase()).collect();
                format!(
                    "{ENV_PREFIX}{}: {kind} (in the environment)",
                    keys.join("__")
                )
            }
        },
        None if key.is_empty() => kind.to_string(),
        None => format!("{key}: {kind}"),
    }
}

fn origin(meta: &figment::Metadata) -> String {
    match &meta.source {
        Some(Source::File(path)) => path.display().to_string(),
        _ => meta.name.to_string(),
    }
}

/// Takes the key at `path` out of `values`; false when there is none to take.
fn remove_key(values: &mut Dict, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut dict = values;
    for key in parents {
        match dict.get_mut(key) {
            Some(Value::Dict(_, inner)) => dict = inner,
            _ => return false,
        }
    }
    dict.remove(last).is_some()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Demo {
        #[serde(default)]
        top_k: u32,
    }

    #[test]
    fn file_values_load_and_problems_are_listed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let good = dir.join("good.toml");
        std::fs::write(&good, "top_k = 5\n").unwrap();
        assert_eq!(load::<Demo>(Some(&good)).unwrap().top_k, 5);
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "top_k = \"ten\"\nunknown = 1\n").unwrap();
        let err = load::<Demo>(Some(&bad)).unwrap_err();
        let problems = err.problems.join("\n");
        assert_eq!(err.problems.len(), 2, "{problems}");
        assert!(
            problems.contains("top_k: invalid type") && problems.contains("unknown"),
            "{problems}"
        );
        assert!(!problems.contains("default."), "{problems}");
        assert!(load::<Demo>(Some(&dir.join("missing.toml"))).is_err());
    }
}
