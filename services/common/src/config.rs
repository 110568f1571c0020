//! Layered configuration: defaults < TOML file < `KGMESH_*` environment.
//! Every problem is reported at once, before any port is bound.

use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format as _, Toml};
use serde::de::DeserializeOwned;

/// Prefix of every environment variable kgmesh reads as config.
pub const ENV_PREFIX: &str = "KGMESH_";

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
    figment.extract::<T>().map_err(|err| ConfigError {
        problems: err.into_iter().map(|e| e.to_string()).collect(),
    })
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
        assert!(!err.problems.is_empty());
        assert!(load::<Demo>(Some(&dir.join("missing.toml"))).is_err());
    }
}
