//! Sending one webhook effect: preparing the request from a rendered
//! [`WebhookEffect`], one attempt at a time, and the retry rule.
//!
//! Retried: 5xx, timeouts and lost connections (the idempotency key makes a
//! resend safe for the receiver), and failed connects (nothing was sent).
//! Never retried: 2xx, 3xx (redirects are not followed), 4xx. A request that
//! may have reached the receiver without an answer makes the outcome UNKNOWN
//! unless a later attempt got a 2xx.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use kg_proto::v1::WebhookEffect;

use crate::signature::{IDEMPOTENCY_HEADER, PROPOSAL_HEADER, SIGNATURE_HEADER, sign};

/// Attempts when the effect does not say.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Hard cap on attempts (the ontology refuses an effect asking for more).
pub const MAX_ATTEMPTS_CAP: u32 = kg_proto::limits::EFFECT_MAX_ATTEMPTS;
/// Per-attempt timeout when the effect does not say.
pub const DEFAULT_TIMEOUT_MS: u32 = 10_000;
/// Hard cap on the per-attempt timeout (the ontology refuses an effect asking for more).
pub const TIMEOUT_CAP_MS: u32 = kg_proto::limits::EFFECT_TIMEOUT_MS.1;
/// Longest wait between two attempts.
const BACKOFF_CAP: Duration = Duration::from_secs(10);

/// Where secret header values come from, by name.
#[derive(Clone, Debug)]
pub enum SecretSource {
    /// The approval service's own process environment.
    Env,
    /// A fixed table (embedding programs that hold secrets elsewhere; tests).
    Fixed(Arc<HashMap<String, String>>),
}

impl SecretSource {
    fn get(&self, name: &str) -> Option<String> {
        let value = match self {
            SecretSource::Env => std::env::var(name).ok(),
            SecretSource::Fixed(map) => map.get(name).cloned(),
        };
        value.filter(|v| !v.is_empty())
    }
}

/// Headers an effect may not set: the transport's and the ones we sign with.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    PROPOSAL_HEADER,
];

/// A request ready to send, built once per run. Its URL never leaves this module's callers
/// except as the host.
pub(crate) struct Prepared {
    method: reqwest::Method,
    url: reqwest::Url,
    body: String,
    headers: HeaderMap,
    pub(crate) timeout: Duration,
    pub(crate) max_attempts: u32,
    /// The host (for model-safe messages).
    pub(crate) host: String,
}

fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

fn host_matches(url: &reqwest::Url, declared: &str) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let declared = declared.trim().to_ascii_lowercase();
    let host = host.to_ascii_lowercase();
    if declared == host {
        return true;
    }
    url.port_or_known_default()
        .is_some_and(|port| declared == format!("{host}:{port}"))
}

/// Builds the request. `Err` is a model-safe reason the effect is
/// misconfigured; nothing is sent then. `protected_env` names variables no
/// secret header may read (the signing secret's).
pub(crate) fn prepare(
    effect: &WebhookEffect,
    secrets: &SecretSource,
    protected_env: &[String],
) -> Result<Prepared, String> {
    let method = reqwest::Method::from_bytes(effect.method.trim().to_ascii_uppercase().as_bytes())
        .map_err(|_| {
            format!(
                "the effect method `{}` is not an HTTP method",
                effect.method
            )
        })?;
    if effect.host.trim().is_empty() {
        return Err("the effect declares no host".to_owned());
    }
    // Parse errors are described without the URL: its path may be a secret.
    let url = reqwest::Url::parse(&effect.url).map_err(|_| {
        format!(
            "the rendered effect URL for host `{}` is not a valid URL",
            effect.host
        )
    })?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err("the effect URL must be http:// or https://".to_owned());
    }
    if !host_matches(&url, &effect.host) {
        return Err(format!(
            "the rendered effect URL does not point at the declared host `{}`",
            effect.host
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("the effect URL must not carry credentials; use secret headers".to_owned());
    }

    let mut headers = HeaderMap::new();
    let header_name = |name: &str| -> Result<HeaderName, String> {
        let parsed = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| format!("`{name}` is not a valid header name"))?;
        if RESERVED_HEADERS.contains(&parsed.as_str()) {
            return Err(format!("the effect may not set the `{name}` header"));
        }
        Ok(parsed)
    };
    for (name, value) in &effect.headers {
        let name = header_name(name)?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("the value of header `{name}` is not a valid header value"))?;
        headers.insert(name, value);
    }
    for (name, secret_name) in &effect.secret_headers {
        let header = header_name(name)?;
        if !is_env_name(secret_name)
            || kg_common::config::is_kgmesh_variable(secret_name)
            || protected_env.iter().any(|p| p == secret_name)
        {
            return Err(format!(
                "header `{header}` names the secret `{secret_name}`, which is not a usable secret name"
            ));
        }
        let Some(secret) = secrets.get(secret_name) else {
            return Err(format!(
                "the secret `{secret_name}` for header `{header}` is not set in the approval service's environment"
            ));
        };
        let mut value = HeaderValue::from_str(&secret).map_err(|_| {
            format!("the secret `{secret_name}` is not a valid value for header `{header}`")
        })?;
        value.set_sensitive(true);
        headers.insert(header, value);
    }
    if !headers.contains_key(http::header::CONTENT_TYPE) && !effect.body.is_empty() {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    let timeout_ms = match effect.timeout_ms {
        0 => DEFAULT_TIMEOUT_MS,
        t => t.clamp(kg_proto::limits::EFFECT_TIMEOUT_MS.0, TIMEOUT_CAP_MS),
    };
    let max_attempts = match effect.max_attempts {
        0 => DEFAULT_MAX_ATTEMPTS,
        n => n.min(MAX_ATTEMPTS_CAP),
    };
    Ok(Prepared {
        method,
        url,
        body: effect.body.clone(),
        headers,
        timeout: Duration::from_millis(u64::from(timeout_ms)),
        max_attempts,
        host: effect.host.clone(),
    })
}

/// What one attempt produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The receiver answered with this status.
    Status(u16),
    /// No connection was made: nothing was sent.
    NotSent,
    /// The request may have been sent and no answer came (timeout, reset).
    NoResponse {
        /// Whether it was the per-attempt timeout.
        timed_out: bool,
    },
}

impl Attempt {
    /// Model-safe description.
    pub(crate) fn describe(&self, host: &str) -> String {
        match self {
            Attempt::Status(status) => format!("{host} answered HTTP {status}"),
            Attempt::NotSent => format!("could not connect to {host}; nothing was sent"),
            Attempt::NoResponse { timed_out: true } => {
                format!("sent to {host}; no response before the timeout")
            }
            Attempt::NoResponse { timed_out: false } => {
                format!("sent to {host}; the connection closed without a response")
            }
        }
    }
}

/// The HTTP client for effects: redirects are never followed, no proxy from
/// the environment (the outcome must describe the receiver, not a proxy).
pub(crate) fn client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .build()
}

/// Sends one attempt. A new signature timestamp each time; same body and key.
pub(crate) async fn send_once(
    client: &reqwest::Client,
    prepared: &Prepared,
    signing_secret: &[u8],
    idempotency_key: &str,
    proposal_id: &str,
) -> Attempt {
    let timestamp = kg_common::caller::now_ms() / 1000;
    let signature = sign(signing_secret, timestamp, prepared.body.as_bytes());
    let request = client
        .request(prepared.method.clone(), prepared.url.clone())
        .headers(prepared.headers.clone())
        .header(IDEMPOTENCY_HEADER, idempotency_key)
        .header(SIGNATURE_HEADER, signature)
        .header(PROPOSAL_HEADER, proposal_id)
        .timeout(prepared.timeout)
        .body(prepared.body.clone());
    match request.send().await {
        Ok(response) => Attempt::Status(response.status().as_u16()),
        // reqwest errors carry the URL: log only their kind.
        Err(err) if err.is_connect() => {
            tracing::warn!(proposal_id, host = %prepared.host, timeout = err.is_timeout(), "effect connect failed");
            Attempt::NotSent
        }
        Err(err) => {
            tracing::warn!(proposal_id, host = %prepared.host, timeout = err.is_timeout(), "effect sent without a response");
            Attempt::NoResponse {
                timed_out: err.is_timeout(),
            }
        }
    }
}

/// How a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Final {
    /// 2xx.
    Executed,
    /// Nothing was applied.
    EffectFailed,
    /// May have been applied.
    Unknown,
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Wait and try again.
    Retry,
    /// Stop with this outcome.
    Stop(Final),
}

/// The retry rule. `maybe_sent` is whether any attempt so far (this one
/// included) may have reached the receiver without an answer.
pub(crate) fn next_step(attempt: &Attempt, number: u32, max: u32, maybe_sent: bool) -> Step {
    let failed = if maybe_sent {
        Final::Unknown
    } else {
        Final::EffectFailed
    };
    let last = number >= max;
    match attempt {
        Attempt::Status(s) if (200..300).contains(s) => Step::Stop(Final::Executed),
        Attempt::Status(s) if (500..600).contains(s) && !last => Step::Retry,
        Attempt::Status(_) => Step::Stop(failed),
        Attempt::NotSent | Attempt::NoResponse { .. } if !last => Step::Retry,
        Attempt::NotSent | Attempt::NoResponse { .. } => Step::Stop(failed),
    }
}

/// Exponential backoff before attempt `number + 1`.
pub(crate) fn backoff(base: Duration, number: u32) -> Duration {
    let factor = 1u32 << number.saturating_sub(1).min(16);
    base.saturating_mul(factor).min(BACKOFF_CAP)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn effect(url: &str, host: &str) -> WebhookEffect {
        WebhookEffect {
            method: "post".into(),
            url: url.into(),
            url_template: "https://hooks.example/{id}".into(),
            host: host.into(),
            body: "{}".into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_retry_rule() {
        use Attempt::*;
        assert_eq!(
            next_step(&Status(204), 1, 3, false),
            Step::Stop(Final::Executed)
        );
        assert_eq!(
            next_step(&Status(204), 3, 3, true),
            Step::Stop(Final::Executed)
        );
        assert_eq!(
            next_step(&Status(302), 1, 3, false),
            Step::Stop(Final::EffectFailed)
        );
        assert_eq!(
            next_step(&Status(404), 1, 3, false),
            Step::Stop(Final::EffectFailed)
        );
        assert_eq!(
            next_step(&Status(409), 2, 3, true),
            Step::Stop(Final::Unknown)
        );
        assert_eq!(next_step(&Status(503), 1, 3, false), Step::Retry);
        assert_eq!(
            next_step(&Status(503), 3, 3, false),
            Step::Stop(Final::EffectFailed)
        );
        assert_eq!(
            next_step(&Status(503), 3, 3, true),
            Step::Stop(Final::Unknown)
        );
        assert_eq!(
            next_step(&NotSent, 3, 3, false),
            Step::Stop(Final::EffectFailed)
        );
        assert_eq!(
            next_step(&NoResponse { timed_out: true }, 1, 2, true),
            Step::Retry
        );
        assert_eq!(
            next_step(&NoResponse { timed_out: false }, 2, 2, true),
            Step::Stop(Final::Unknown)
        );
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let base = Duration::from_millis(100);
        assert_eq!(backoff(base, 1), Duration::from_millis(100));
        assert_eq!(backoff(base, 2), Duration::from_millis(200));
        assert_eq!(backoff(base, 3), Duration::from_millis(400));
        assert_eq!(backoff(base, 40), BACKOFF_CAP);
    }

    #[test]
    fn misconfigured_effects_are_refused_without_naming_the_url() {
        let none = SecretSource::Fixed(Arc::new(HashMap::new()));
        let secret_url = "https://hooks.example/T000/SECRETTOKEN";
        let err = prepare(&effect(secret_url, "evil.example"), &none, &[])
            .err()
            .unwrap();
        assert!(!err.contains("SECRETTOKEN"), "{err}");

        let mut e = effect(secret_url, "hooks.example");
        e.secret_headers
            .insert("Authorization".into(), "SHOP_TOKEN".into());
        let err = prepare(&e, &none, &[]).err().unwrap();
        assert!(
            err.contains("SHOP_TOKEN") && err.contains("not set"),
            "{err}"
        );

        let with = SecretSource::Fixed(Arc::new(HashMap::from([(
            "SHOP_TOKEN".to_owned(),
            "Bearer s3cret".to_owned(),
        )])));
        let ok = prepare(&e, &with, &[]).unwrap();
        assert!(ok.headers.get("authorization").unwrap().is_sensitive());
        let err = prepare(&e, &with, &["SHOP_TOKEN".to_owned()])
            .err()
            .unwrap();
        assert!(err.contains("not a usable secret name"), "{err}");
        // kgmesh's own settings (the database URL, on Kubernetes) are never sent, even set.
        let mut leak = effect(secret_url, "hooks.example");
        leak.secret_headers
            .insert("X-Audit-Ref".into(), "KGMESH_DATABASE_URL".into());
        let set = SecretSource::Fixed(Arc::new(HashMap::from([(
            "KGMESH_DATABASE_URL".to_owned(),
            "postgres://kgmesh:pw@db/kgmesh".to_owned(),
        )])));
        let err = prepare(&leak, &set, &[]).err().unwrap();
        assert!(err.contains("not a usable secret name"), "{err}");

        let mut e = effect("https://hooks.example:8443/x", "hooks.example:8443");
        assert!(prepare(&e, &none, &[]).is_ok());
        e.headers.insert("Idempotency-Key".into(), "mine".into());
        assert!(prepare(&e, &none, &[]).is_err());
        let e = effect("ftp://hooks.example/x", "hooks.example");
        assert!(prepare(&e, &none, &[]).is_err());
        let e = effect("https://u:p@hooks.example/x", "hooks.example");
        assert!(prepare(&e, &none, &[]).is_err());
    }
}
