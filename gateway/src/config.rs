//! Gateway configuration: backend addresses and the HTTP edge policy.

use serde::{Deserialize, Serialize};

use crate::error::GatewayError;

/// Largest accepted upload body unless configured otherwise (32 MiB).
pub const DEFAULT_MAX_UPLOAD_BYTES: usize = 32 * 1024 * 1024;

/// gRPC addresses of the services the gateway calls, e.g. `http://127.0.0.1:7101`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendAddrs {
    /// The auth service (Authorize and the admin RPCs).
    pub auth: String,
    /// The files service (uploads, file registry).
    pub files: String,
    /// The retrieval service (search lanes).
    pub retrieval: String,
    /// The graph service (chunk packages, outlines).
    pub graph: String,
}

/// Everything the gateway needs; the same type in `kgmesh up` and on Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// Where the backend services listen.
    pub backends: BackendAddrs,
    /// `Host` values accepted on `/mcp` and `/api/v1` (`name` or `name:port`).
    /// Defaults to the loopback names; an empty list accepts any host, which
    /// only makes sense behind a proxy that checks it.
    #[serde(default = "default_allowed_hosts")]
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed to call `/mcp` and `/api/v1` (`https://app.example:443`,
    /// `http://localhost:*`, `null`). A request carrying any other `Origin` gets 403;
    /// requests without `Origin` (non-browser clients) are unaffected.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// External base URL (`https://kg.example.com`), used in the protected-resource
    /// metadata and `WWW-Authenticate`. When unset it is derived from `Host`.
    #[serde(default)]
    pub public_base_url: Option<String>,
    /// Largest file accepted by the upload endpoint, in bytes.
    #[serde(default = "default_max_upload_bytes")]
    pub max_upload_bytes: usize,
    /// gRPC address of the approval service, for the admin REST
    /// `/api/v1/approvals` (503 without it). Never used by MCP.
    #[serde(default)]
    pub approval_addr: Option<String>,
    /// gRPC address of the ontology service: generated tools (get_/list_/
    /// traverse_/propose_) are served only when set.
    #[serde(default)]
    pub ontology_addr: Option<String>,
    /// Serve HTTPS with this certificate instead of plain HTTP (`[http_tls]`): bearer tokens
    /// must not cross a network in clear. Unset behind a proxy or ingress that terminates TLS,
    /// and on loopback.
    #[serde(default)]
    pub https: Option<kg_common::tls::HttpsFiles>,
}

fn default_allowed_hosts() -> Vec<String> {
    vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ]
}

fn default_max_upload_bytes() -> usize {
    DEFAULT_MAX_UPLOAD_BYTES
}

impl GatewayConfig {
    /// A config with the given backends and every other field at its default.
    pub fn new(backends: BackendAddrs) -> Self {
        Self {
            backends,
            allowed_hosts: default_allowed_hosts(),
            allowed_origins: Vec::new(),
            public_base_url: None,
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            approval_addr: None,
            ontology_addr: None,
            https: None,
        }
    }

    /// Checks every field and reports all problems at once.
    pub fn validate(&self) -> Result<(), GatewayError> {
        let mut problems = Vec::new();
        for (name, addr) in [
            ("backends.auth", &self.backends.auth),
            ("backends.files", &self.backends.files),
            ("backends.retrieval", &self.backends.retrieval),
            ("backends.graph", &self.backends.graph),
        ] {
            let ok = (addr.starts_with("http://") || addr.starts_with("https://"))
                && addr
                    .parse::<http::Uri>()
                    .is_ok_and(|u| u.authority().is_some());
            if !ok {
                problems.push(format!("{name}: expected `http://host:port`, got `{addr}`"));
            }
        }
        if let Some(addr) = &self.ontology_addr
            && !((addr.starts_with("http://") || addr.starts_with("https://"))
                && addr
                    .parse::<http::Uri>()
                    .is_ok_and(|u| u.authority().is_some()))
        {
            problems.push(format!(
                "ontology_addr: expected `http://host:port`, got `{addr}`"
            ));
        }
        if let Some(addr) = &self.approval_addr
            && !((addr.starts_with("http://") || addr.starts_with("https://"))
                && addr
                    .parse::<http::Uri>()
                    .is_ok_and(|u| u.authority().is_some()))
        {
            problems.push(format!(
                "approval_addr: expected `http://host:port`, got `{addr}`"
            ));
        }
        if let Some(files) = &self.https
            && let Err(problem) = kg_common::tls::https_server_config(files)
        {
            problems.push(problem.to_string());
        }
        for host in &self.allowed_hosts {
            if crate::http::guard::parse_host_entry(host).is_none() {
                problems.push(format!(
                    "allowed_hosts: `{host}` is not a host name or `host:port`"
                ));
            }
        }
        for origin in &self.allowed_origins {
            if crate::http::guard::parse_allowed_origin(origin).is_none() {
                problems.push(format!(
                    "allowed_origins: `{origin}` is not an origin like `https://app.example:443`, `http://localhost:*` or `null`"
                ));
            }
        }
        if let Some(base) = &self.public_base_url {
            let ok = (base.starts_with("http://") || base.starts_with("https://"))
                && base
                    .parse::<http::Uri>()
                    .is_ok_and(|u| u.authority().is_some() && u.query().is_none());
            if !ok {
                problems.push(format!(
                    "public_base_url: expected `https://host[:port][/prefix]`, got `{base}`"
                ));
            }
        }
        if self.max_upload_bytes == 0 || self.max_upload_bytes > kg_common::grpc::MAX_MESSAGE_BYTES
        {
            problems.push(format!(
                "max_upload_bytes: must be between 1 and {} (the gRPC message limit), got {}",
                kg_common::grpc::MAX_MESSAGE_BYTES,
                self.max_upload_bytes
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(GatewayError::Config(problems.join("; ")))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn backends() -> BackendAddrs {
        BackendAddrs {
            auth: "http://127.0.0.1:1".into(),
            files: "http://127.0.0.1:2".into(),
            retrieval: "http://127.0.0.1:3".into(),
            graph: "http://127.0.0.1:4".into(),
        }
    }

    #[test]
    fn defaults_are_loopback_and_valid() {
        let config = GatewayConfig::new(backends());
        assert_eq!(config.allowed_hosts, ["localhost", "127.0.0.1", "::1"]);
        config.validate().unwrap();
        let parsed: GatewayConfig = serde_json::from_value(serde_json::json!({
            "backends": {"auth": "http://127.0.0.1:1", "files": "http://127.0.0.1:2",
                         "retrieval": "http://127.0.0.1:3", "graph": "http://127.0.0.1:4"}
        }))
        .unwrap();
        assert_eq!(parsed, config);
    }

    #[test]
    fn every_problem_is_reported() {
        let mut config = GatewayConfig::new(backends());
        config.backends.graph = "127.0.0.1:4".into();
        config.allowed_origins = vec!["app.example".into()];
        config.public_base_url = Some("kg.example.com".into());
        config.max_upload_bytes = 0;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("backends.graph"), "{err}");
        assert!(err.contains("allowed_origins"), "{err}");
        assert!(err.contains("public_base_url"), "{err}");
        assert!(err.contains("max_upload_bytes"), "{err}");
    }
}
