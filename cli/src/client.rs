//! A small client of the gateway's admin REST API (`/api/v1`), used by the
//! admin commands and `kgmesh ingest`.

use std::path::Path;

use anyhow::{Context as _, bail};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The gateway answered with an error status (other than 401); its `{code, message}`, or
/// the start of the body. A caller may tell a refusal of one request from an outage by it.
#[derive(Debug, thiserror::Error)]
#[error("{} {path}: {detail}", status.as_u16())]
pub struct Refused {
    /// The HTTP status.
    pub status: StatusCode,
    /// The request's URL path.
    pub path: String,
    /// `CODE: message` from the answer.
    pub detail: String,
}

/// Where and as whom to call the admin API.
#[derive(Clone)]
pub struct AdminClient {
    http: reqwest::Client,
    base: reqwest::Url,
    token: String,
}

impl AdminClient {
    /// A client for `base_url` (e.g. `http://127.0.0.1:8080`) with a PAT; `ca_file` (PEM)
    /// adds CAs to the system's for an `https://` gateway whose certificate a private CA
    /// issued.
    pub fn new(base_url: &str, token: &str, ca_file: Option<&Path>) -> anyhow::Result<Self> {
        if token.trim().is_empty() {
            bail!("no token: pass --token or set KGMESH_TOKEN to an admin PAT (kg_pat_...)");
        }
        let base =
            reqwest::Url::parse(base_url).with_context(|| format!("invalid --url `{base_url}`"))?;
        let mut builder = reqwest::Client::builder().timeout(std::time::Duration::from_secs(120));
        if let Some(path) = ca_file {
            let pem = std::fs::read(path)
                .with_context(|| format!("--ca-file: cannot read {}", path.display()))?;
            let authorities = reqwest::Certificate::from_pem_bundle(&pem)
                .ok()
                .filter(|found| !found.is_empty())
                .with_context(|| {
                    format!("--ca-file: {} holds no PEM certificate", path.display())
                })?;
            builder = builder.tls_certs_merge(authorities);
        }
        let http = builder.build()?;
        Ok(Self {
            http,
            base,
            token: token.trim().to_owned(),
        })
    }

    /// The URL of `/api/v1/<segments...>`, each segment percent-encoded.
    pub fn url(&self, segments: &[&str]) -> anyhow::Result<reqwest::Url> {
        let mut url = self.base.clone();
        {
            let mut path = url
                .path_segments_mut()
                .map_err(|_| anyhow::anyhow!("--url cannot be a base URL"))?;
            path.pop_if_empty().push("api").push("v1");
            for segment in segments {
                // `push` resolves these as the URL standard says, which would send the
                // request to another resource than the one named.
                if matches!(*segment, "." | "..") {
                    anyhow::bail!("`{segment}` cannot be a URL path segment");
                }
                path.push(segment);
            }
        }
        Ok(url)
    }

    /// Sends a request and decodes the JSON answer; API errors become their message.
    pub async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        url: reqwest::Url,
        body: Option<RequestBody>,
    ) -> anyhow::Result<T> {
        let mut request = self
            .http
            .request(method, url.clone())
            .bearer_auth(&self.token);
        match body {
            Some(RequestBody::Json(v)) => request = request.json(&v),
            Some(RequestBody::Bytes(b)) => request = request.body(b),
            None => {}
        }
        let response = request.send().await.map_err(|err| {
            // The chain names the TLS failure (`invalid peer certificate: UnknownIssuer`).
            let chain = format!("{:#}", anyhow::Error::new(err));
            let hint = if chain.contains("certificate") {
                "the gateway's TLS certificate is not trusted here: pass --ca-file (or \
                 KGMESH_CA_FILE) with the CA that issued it"
            } else {
                "is `kgmesh up` running?"
            };
            anyhow::anyhow!("cannot reach kgmesh at {} ({hint}): {chain}", self.base)
        })?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if !status.is_success() {
            let detail = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| {
                    Some(format!(
                        "{}: {}",
                        v.get("code")?.as_str()?,
                        v.get("message")?.as_str()?
                    ))
                })
                .unwrap_or_else(|| text.chars().take(300).collect());
            if status == StatusCode::UNAUTHORIZED {
                // The gateway's answer says why; a proxy's may not.
                if detail.contains("invalid token") {
                    bail!("401 unauthorized: {detail}");
                }
                bail!(
                    "401 unauthorized: the token is missing, revoked, expired or from another deployment, or its principal is disabled ({detail})"
                );
            }
            return Err(Refused {
                status,
                path: url.path().to_owned(),
                detail,
            }
            .into());
        }
        serde_json::from_str(&text)
            .with_context(|| format!("unexpected answer from {}", url.path()))
    }

    /// GET as JSON.
    pub async fn get(&self, segments: &[&str], query: &[(&str, String)]) -> anyhow::Result<Value> {
        let mut url = self.url(segments)?;
        for (k, v) in query {
            if !v.is_empty() {
                url.query_pairs_mut().append_pair(k, v);
            }
        }
        self.send(Method::GET, url, None).await
    }

    /// POST a JSON body.
    pub async fn post(&self, segments: &[&str], body: Value) -> anyhow::Result<Value> {
        let url = self.url(segments)?;
        self.send(Method::POST, url, Some(RequestBody::Json(body)))
            .await
    }

    /// PUT a JSON body.
    pub async fn put(&self, segments: &[&str], body: Value) -> anyhow::Result<Value> {
        let url = self.url(segments)?;
        self.send(Method::PUT, url, Some(RequestBody::Json(body)))
            .await
    }

    /// PATCH a JSON body.
    pub async fn patch(&self, segments: &[&str], body: Value) -> anyhow::Result<Value> {
        let url = self.url(segments)?;
        self.send(Method::PATCH, url, Some(RequestBody::Json(body)))
            .await
    }

    /// DELETE.
    pub async fn delete(&self, segments: &[&str]) -> anyhow::Result<Value> {
        let url = self.url(segments)?;
        self.send(Method::DELETE, url, None).await
    }
}

/// A request body.
pub enum RequestBody {
    /// JSON.
    Json(Value),
    /// Raw bytes (file uploads).
    Bytes(Vec<u8>),
}
