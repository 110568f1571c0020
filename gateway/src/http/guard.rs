//! The edge checks in front of `/mcp` and `/api/v1`: allowed `Host`, allowed
//! `Origin`, then the bearer PAT, authorized with auth on every request.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kg_common::ErrorCode;

use crate::config::GatewayConfig;
use crate::error::ClientError;
use crate::state::{Caller, GatewayState, SpeculativeCaller};

/// Prefix every kgmesh PAT carries.
pub(crate) const PAT_PREFIX: &str = "kg_pat_";

/// State of one bearer middleware: the gateway and the tool name sent to auth.
#[derive(Clone)]
pub(crate) struct BearerGuard {
    pub(crate) state: GatewayState,
    pub(crate) tool: &'static str,
    /// Whether requests may run ahead of auth's answer on the caller auth returned for the
    /// same token last time ([`SpeculativeCaller`]); only `/mcp`, whose handlers know how.
    pub(crate) run_ahead: bool,
}

/// Rejects disallowed hosts and origins, then authorizes the bearer token and
/// puts the resulting [`crate::state::Caller`] into the request extensions.
pub(crate) async fn require_bearer(
    State(guard): State<BearerGuard>,
    mut request: Request,
    next: Next,
) -> Response {
    let config = &guard.state.config;
    if let Err(err) = check_host_and_origin(config, request.uri(), request.headers()) {
        return error_response(&err);
    }
    let Some(token) = bearer_token(request.headers()) else {
        count_refused("missing");
        return unauthorized(
            config,
            request.uri(),
            request.headers(),
            false,
            "missing bearer token: send `Authorization: Bearer kg_pat_...`",
        );
    };
    if !token.starts_with(PAT_PREFIX) {
        count_refused("malformed");
        return unauthorized(
            config,
            request.uri(),
            request.headers(),
            true,
            "invalid token: expected a kgmesh personal access token (`kg_pat_...`)",
        );
    }
    let token = token.to_owned();
    // The token goes to auth only: nothing downstream (rmcp, handlers, logs) sees it.
    request.headers_mut().remove(header::AUTHORIZATION);
    let recent = &guard.state.recent_callers;
    if guard.run_ahead
        && let Some(ahead) = recent.get(&token)
    {
        return run_ahead(&guard, token, ahead, request, next).await;
    }
    match guard.state.authorize(&token, guard.tool, None).await {
        Ok(caller) => {
            tracing::debug!(
                principal = caller.principal_id(),
                request_id = caller.request_id(),
                "authorized"
            );
            if guard.run_ahead {
                recent.remember(&token, &caller);
            }
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(err) => refused(&guard, &token, request.uri(), request.headers(), &err),
    }
}

/// Serves `request` while auth resolves `token` again: the handlers get a
/// [`SpeculativeCaller`] and auth's answer as soon as it arrives, and no response leaves
/// before that answer allows it.
async fn run_ahead(
    guard: &BearerGuard,
    token: String,
    ahead: Caller,
    mut request: Request,
    next: Next,
) -> Response {
    let (uri, headers) = (request.uri().clone(), request.headers().clone());
    let (speculative, verdict) = SpeculativeCaller::new(ahead);
    request.extensions_mut().insert(speculative);
    let authorize = async {
        let answer = guard.state.authorize(&token, guard.tool, None).await;
        verdict.send(answer.clone());
        answer
    };
    // Handlers that need the caller wait for the answer, so on a refusal they finish at
    // once and their response is dropped here.
    let (answer, response) = tokio::join!(authorize, next.run(request));
    match answer {
        Ok(caller) => {
            tracing::debug!(
                principal = caller.principal_id(),
                request_id = caller.request_id(),
                "authorized"
            );
            guard.state.recent_callers.remember(&token, &caller);
            response
        }
        Err(err) => refused(guard, &token, &uri, &headers, &err),
    }
}

/// The response when auth did not authorize `token`; a token it rejected is forgotten.
fn refused(
    guard: &BearerGuard,
    token: &str,
    uri: &http::Uri,
    headers: &HeaderMap,
    err: &ClientError,
) -> Response {
    if err.code == ErrorCode::Unauthenticated {
        count_refused("refused");
        guard.state.recent_callers.forget(token);
        unauthorized(&guard.state.config, uri, headers, true, &err.message)
    } else {
        error_response(err)
    }
}

fn count_refused(reason: &'static str) {
    crate::metrics::gateway_metrics()
        .bearer_refused
        .get_or_create(&crate::metrics::RefusedLabels { reason })
        .inc();
}

/// The `{code, message, retryable}` response with the code's HTTP status.
/// Largest JSON body an admin route reads: axum's own limit for its `Json` extractor.
const MAX_JSON_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Refuses an admin request whose URI or JSON body holds a NUL character (U+0000): no field
/// takes one, and PostgreSQL refuses it in text, so one that got through would fail deep in
/// a service as an internal error instead of here, saying where. Other bodies (file
/// uploads) pass untouched.
pub(crate) async fn refuse_nul_characters(request: Request, next: Next) -> Response {
    let uri = request.uri();
    if uri.path().contains("%00") || uri.query().is_some_and(|q| q.contains("%00")) {
        return error_response(&ClientError::invalid(
            "the address holds a NUL character (%00), which no parameter accepts; remove it",
        ));
    }
    let is_json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    if !is_json {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_JSON_BODY_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return error_response(&ClientError::new(
                ErrorCode::PayloadTooLarge,
                format!("a JSON body is at most {MAX_JSON_BODY_BYTES} bytes"),
            ));
        }
    };
    // A body that is not JSON is left for the route to refuse in its own words.
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(&bytes)
        && let Err(err) = crate::mcp::args::no_nul_characters(&fields)
    {
        return error_response(&err);
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

pub(crate) fn error_response(err: &ClientError) -> Response {
    let status =
        StatusCode::from_u16(err.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, axum::Json(err.to_json())).into_response();
    // The stable code, for the audit record of an admin change (see `admin_audit`).
    response.extensions_mut().insert(err.code);
    response
}

fn unauthorized(
    config: &GatewayConfig,
    uri: &http::Uri,
    headers: &HeaderMap,
    token_given: bool,
    message: &str,
) -> Response {
    let metadata = format!(
        "{}/.well-known/oauth-protected-resource",
        base_url(config, uri, headers)
    );
    let challenge = if token_given {
        format!("Bearer resource_metadata=\"{metadata}\", error=\"invalid_token\"")
    } else {
        format!("Bearer resource_metadata=\"{metadata}\"")
    };
    let mut response = error_response(&ClientError::new(ErrorCode::Unauthenticated, message));
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The external base URL: configured, else `<scheme>://<host>` when the host is allowed
/// (never reflect an arbitrary Host), else `<scheme>://localhost`. The host is the `Host`
/// header, or the request's authority (HTTP/2 sends `:authority` instead); the scheme is
/// `https` when the gateway serves HTTPS (`[http_tls]`).
pub(crate) fn base_url(config: &GatewayConfig, uri: &http::Uri, headers: &HeaderMap) -> String {
    if let Some(base) = &config.public_base_url {
        return base.trim_end_matches('/').to_owned();
    }
    let scheme = if config.https.is_some() {
        "https"
    } else {
        "http"
    };
    let host = request_host(headers).or_else(|| {
        let authority = uri.authority()?;
        let host = HostPort {
            name: normalize_host(authority.host()),
            port: authority.port_u16(),
        };
        Some((authority.as_str().to_owned(), host))
    });
    match host {
        Some((authority, host)) if host_is_allowed(&host, &config.allowed_hosts) => {
            format!("{scheme}://{authority}")
        }
        _ => format!("{scheme}://localhost"),
    }
}

/// A request's host: the raw authority and its normalised (name, port) form.
fn request_host(headers: &HeaderMap) -> Option<(String, HostPort)> {
    let raw = headers.get(header::HOST)?.to_str().ok()?;
    let authority: http::uri::Authority = raw.parse().ok()?;
    let host = HostPort {
        name: normalize_host(authority.host()),
        port: authority.port_u16(),
    };
    Some((authority.as_str().to_owned(), host))
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HostPort {
    name: String,
    port: Option<u16>,
}

fn normalize_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

/// Same rule as rmcp's check: `name` matches any port, `name:port` that port only;
/// an empty list allows every host.
fn host_is_allowed(host: &HostPort, allowed: &[String]) -> bool {
    if allowed.is_empty() {
        return true;
    }
    allowed
        .iter()
        .filter_map(|entry| parse_host_entry(entry))
        .any(|entry| entry.name == host.name && entry.port.is_none_or(|p| host.port == Some(p)))
}

/// An `allowed_hosts` entry: `name`, `name:port`, `[v6]:port`, or a bare IPv6 address.
pub(crate) fn parse_host_entry(entry: &str) -> Option<HostPort> {
    let entry = entry.trim();
    if entry.is_empty() || entry.contains(['/', ' ', '@']) {
        return None;
    }
    if let Ok(authority) = entry.parse::<http::uri::Authority>() {
        return Some(HostPort {
            name: normalize_host(authority.host()),
            port: authority.port_u16(),
        });
    }
    // rmcp accepts a bare IPv6 literal such as `::1` as a host without a port.
    entry.parse::<std::net::Ipv6Addr>().ok().map(|_| HostPort {
        name: normalize_host(entry),
        port: None,
    })
}

fn forbidden(message: &str) -> ClientError {
    ClientError::new(ErrorCode::PermissionDenied, message)
}

/// 403 for a disallowed `Host` (DNS rebinding) or a disallowed `Origin`.
pub(crate) fn check_host_and_origin(
    config: &GatewayConfig,
    uri: &http::Uri,
    headers: &HeaderMap,
) -> Result<(), ClientError> {
    if !config.allowed_hosts.is_empty() {
        let host = request_host(headers).map(|(_, h)| h).or_else(|| {
            uri.authority().map(|a| HostPort {
                name: normalize_host(a.host()),
                port: a.port_u16(),
            })
        });
        match host {
            Some(host) if host_is_allowed(&host, &config.allowed_hosts) => {}
            Some(host) => {
                tracing::warn!(host = %host.name, "rejected request with a disallowed Host header");
                return Err(forbidden(
                    "the Host header is not allowed: add it to the gateway's allowed_hosts",
                ));
            }
            None => return Err(forbidden("the request has no Host header")),
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN)
        && !origin_header_is_allowed(origin, &config.allowed_origins)
    {
        tracing::warn!(origin = ?origin, "rejected request with a disallowed Origin header");
        return Err(forbidden(
            "the Origin header is not allowed: add it to the gateway's allowed_origins",
        ));
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    Null,
    Tuple {
        scheme: String,
        host: String,
        port: Option<u16>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllowedPort {
    Any,
    Exact(u16),
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

fn parse_origin(value: &str) -> Option<Origin> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("null") {
        return Some(Origin::Null);
    }
    let uri: http::Uri = value.parse().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = uri.authority()?;
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return None;
    }
    Some(Origin::Tuple {
        port: authority.port_u16().or_else(|| default_port(&scheme)),
        scheme,
        host: normalize_host(authority.host()),
    })
}

/// An `allowed_origins` entry: `null`, `scheme://host[:port]`, or `scheme://host:*`.
/// Without a port the scheme's default port is meant.
pub(crate) fn parse_allowed_origin(value: &str) -> Option<(Origin, AllowedPort)> {
    let value = value.trim();
    let (base, any_port) = match value.strip_suffix(":*") {
        Some(base) => (base, true),
        None => (value, false),
    };
    match parse_origin(base)? {
        Origin::Null if !any_port => Some((Origin::Null, AllowedPort::Any)),
        Origin::Null => None,
        Origin::Tuple { scheme, host, port } => {
            let port = if any_port {
                // `host:443:*` is not meaningful.
                if base
                    .rsplit_once(':')
                    .is_some_and(|(_, p)| p.chars().all(|c| c.is_ascii_digit()))
                {
                    return None;
                }
                AllowedPort::Any
            } else {
                AllowedPort::Exact(port?)
            };
            Some((
                Origin::Tuple {
                    scheme,
                    host,
                    port: None,
                },
                port,
            ))
        }
    }
}

/// Whether an `Origin` header names an origin `allowed` lists (the CORS layer asks too).
pub(crate) fn origin_header_is_allowed(origin: &HeaderValue, allowed: &[String]) -> bool {
    origin
        .to_str()
        .ok()
        .and_then(parse_origin)
        .is_some_and(|o| origin_is_allowed(&o, allowed))
}

fn origin_is_allowed(origin: &Origin, allowed: &[String]) -> bool {
    allowed
        .iter()
        .filter_map(|entry| parse_allowed_origin(entry))
        .any(|(entry, port)| match (&entry, origin) {
            (Origin::Null, Origin::Null) => true,
            (
                Origin::Tuple {
                    scheme: a_scheme,
                    host: a_host,
                    ..
                },
                Origin::Tuple {
                    scheme,
                    host,
                    port: origin_port,
                },
            ) => {
                a_scheme == scheme
                    && a_host == host
                    && match port {
                        AllowedPort::Any => true,
                        AllowedPort::Exact(p) => *origin_port == Some(p),
                    }
            }
            _ => false,
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        map
    }

    fn config(hosts: &[&str], origins: &[&str]) -> GatewayConfig {
        let mut c = GatewayConfig::new(crate::config::BackendAddrs {
            auth: "http://127.0.0.1:1".into(),
            files: "http://127.0.0.1:1".into(),
            retrieval: "http://127.0.0.1:1".into(),
            graph: "http://127.0.0.1:1".into(),
        });
        c.allowed_hosts = hosts.iter().map(|s| (*s).to_owned()).collect();
        c.allowed_origins = origins.iter().map(|s| (*s).to_owned()).collect();
        c
    }

    #[test]
    fn bearer_tokens_are_read_case_insensitively() {
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Bearer kg_pat_x")])),
            Some("kg_pat_x")
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", "bearer   kg_pat_y ")])),
            Some("kg_pat_y")
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Basic abc")])),
            None
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Bearer ")])),
            None
        );
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn hosts_match_by_name_and_optional_port() {
        let c = config(&["localhost", "kg.example.com:8443", "::1"], &[]);
        let uri = http::Uri::from_static("/mcp");
        assert!(check_host_and_origin(&c, &uri, &headers(&[("host", "localhost:7000")])).is_ok());
        assert!(check_host_and_origin(&c, &uri, &headers(&[("host", "[::1]:7000")])).is_ok());
        assert!(
            check_host_and_origin(&c, &uri, &headers(&[("host", "kg.example.com:8443")])).is_ok()
        );
        assert!(check_host_and_origin(&c, &uri, &headers(&[("host", "kg.example.com")])).is_err());
        assert!(check_host_and_origin(&c, &uri, &headers(&[("host", "evil.example")])).is_err());
        assert!(check_host_and_origin(&c, &uri, &HeaderMap::new()).is_err());
        let open = config(&[], &[]);
        assert!(check_host_and_origin(&open, &uri, &headers(&[("host", "evil.example")])).is_ok());
    }

    #[test]
    fn origins_need_an_entry_and_default_ports_apply() {
        let c = config(&[], &["https://app.example", "http://localhost:*", "null"]);
        let uri = http::Uri::from_static("/mcp");
        let ok = |o: &str| check_host_and_origin(&c, &uri, &headers(&[("origin", o)])).is_ok();
        assert!(ok("https://app.example"));
        assert!(ok("https://app.example:443"));
        assert!(!ok("https://app.example:8443"));
        assert!(!ok("http://app.example"));
        assert!(ok("http://localhost:6274"));
        assert!(ok("null"));
        assert!(!ok("https://evil.example"));
        assert!(!ok("not an origin"));
        // No allowed origins: any Origin header is refused, none at all is fine.
        let none = config(&[], &[]);
        assert!(
            check_host_and_origin(&none, &uri, &headers(&[("origin", "http://localhost:1")]))
                .is_err()
        );
        assert!(check_host_and_origin(&none, &uri, &HeaderMap::new()).is_ok());
        assert!(parse_allowed_origin("https://a.example:443:*").is_none());
        assert!(parse_allowed_origin("app.example").is_none());
    }

    #[test]
    fn base_url_never_reflects_a_disallowed_host() {
        let mut c = config(&["localhost"], &[]);
        let no_authority = http::Uri::from_static("/mcp");
        assert_eq!(
            base_url(&c, &no_authority, &headers(&[("host", "localhost:7000")])),
            "http://localhost:7000"
        );
        assert_eq!(
            base_url(&c, &no_authority, &headers(&[("host", "evil.example")])),
            "http://localhost"
        );
        // HTTP/2 names the host in the request's authority, not in a Host header.
        let h2 = http::Uri::from_static("https://localhost:7443/mcp");
        let h2_evil = http::Uri::from_static("https://evil.example/mcp");
        c.https = Some(kg_common::tls::HttpsFiles {
            cert_file: "cert.pem".into(),
            key_file: "key.pem".into(),
        });
        assert_eq!(
            base_url(&c, &h2, &HeaderMap::new()),
            "https://localhost:7443"
        );
        assert_eq!(
            base_url(&c, &h2_evil, &HeaderMap::new()),
            "https://localhost"
        );
        c.public_base_url = Some("https://kg.example.com/".into());
        assert_eq!(
            base_url(&c, &no_authority, &HeaderMap::new()),
            "https://kg.example.com"
        );
    }
}
