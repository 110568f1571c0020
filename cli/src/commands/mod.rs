//! The admin commands: thin clients of the gateway's admin REST API
//! (`/api/v1`), printing its JSON answer (pretty, or compact with `--json`).

pub(crate) mod access;
pub(crate) mod approvals;
pub(crate) mod audit;
pub(crate) mod files;
pub(crate) mod ontology;
pub(crate) mod pats;
pub(crate) mod versions;

use std::path::PathBuf;

use clap::Args;
use kgmesh::client::AdminClient;
use serde_json::Value;

/// Where and as whom an admin command calls.
#[derive(Args, Clone)]
pub(crate) struct Remote {
    /// Gateway base URL.
    #[arg(long, env = "KGMESH_URL", default_value = "http://127.0.0.1:8080")]
    pub(crate) url: String,
    /// An admin PAT.
    #[arg(long, env = "KGMESH_TOKEN", hide_env_values = true, default_value = "")]
    pub(crate) token: String,
    /// PEM file of a CA to trust besides the system's, for an https:// gateway whose
    /// certificate a private CA issued (`[http_tls]`).
    #[arg(long, env = "KGMESH_CA_FILE")]
    pub(crate) ca_file: Option<PathBuf>,
    /// Print compact JSON (for scripts).
    #[arg(long)]
    pub(crate) json: bool,
}

impl Remote {
    pub(crate) fn client(&self) -> anyhow::Result<AdminClient> {
        AdminClient::new(&self.url, &self.token, self.ca_file.as_deref())
    }

    pub(crate) fn print(&self, value: &Value) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string(value)?);
        } else {
            println!("{}", serde_json::to_string_pretty(value)?);
        }
        Ok(())
    }
}
