//! The one gRPC server stack every service runs: standard health service,
//! caller-context verification, request metrics, a per-request timeout, and mutual TLS
//! when the process has it; and the client channels services call each other over.

use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

use crate::caller::CallerContextLayer;
use crate::metrics::GrpcMetricsLayer;
use crate::tls::ClusterTls;

/// Upper bound on one RPC; tool-level limits (e.g. Cypher's 2 s) are tighter.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest gRPC message accepted or sent (uploads travel as one message).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Why a gRPC server stopped with an error.
#[derive(Debug, thiserror::Error)]
#[error("grpc server failed: {0}")]
pub struct ServeError(#[from] tonic::transport::Error);

/// Serves `routes` (one or more tonic services) on `listener` until `shutdown`
/// fires, with the health service reporting SERVING for `service_names`.
pub async fn serve(
    listener: TcpListener,
    caller_layer: CallerContextLayer,
    routes: Routes,
    service_names: &[&str],
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    for name in service_names {
        reporter
            .set_service_status(*name, ServingStatus::Serving)
            .await;
    }
    let routes = routes.add_service(health_service);
    let service_label = service_names
        .first()
        .copied()
        .unwrap_or("unknown")
        .to_owned();
    server()?
        .timeout(REQUEST_TIMEOUT)
        .layer(GrpcMetricsLayer::new(service_label))
        .layer(caller_layer)
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming(listener), shutdown.cancelled_owned())
        .await?;
    Ok(())
}

/// A gRPC server builder, requiring the process's mutual TLS when it has one
/// ([`crate::tls::install`]). Every gRPC server a service runs starts from here.
pub fn server() -> Result<tonic::transport::Server, ServeError> {
    server_for(crate::tls::installed())
}

/// [`server`] with `tls` instead of the process's (tests and benches).
pub fn server_for(tls: Option<&ClusterTls>) -> Result<tonic::transport::Server, ServeError> {
    let builder = tonic::transport::Server::builder();
    Ok(match tls {
        Some(tls) => builder.tls_config(tls.server.clone())?,
        None => builder,
    })
}

/// How long the server lets a request run from now: the caller's `grpc-timeout` when it
/// sent one, never more than [`REQUEST_TIMEOUT`], which the server enforces on every call.
/// Work that can be cut short and still answer (a search's lanes) plans within this.
pub fn time_allowed<T>(request: &tonic::Request<T>) -> Duration {
    request
        .metadata()
        .get("grpc-timeout")
        .and_then(|value| value.to_str().ok())
        .and_then(parse_grpc_timeout)
        .map_or(REQUEST_TIMEOUT, |sent| sent.min(REQUEST_TIMEOUT))
}

/// How long work for a call allowed `allowed` may run: a tenth is kept back, within 50 ms
/// and 1 s, for answering (and for whoever waits on the answer).
pub fn work_budget(allowed: Duration) -> Duration {
    let reserve = (allowed / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
    allowed.saturating_sub(reserve)
}

/// When work for a call allowed `allowed` from now must be done ([`work_budget`]).
pub fn work_deadline(allowed: Duration) -> tokio::time::Instant {
    tokio::time::Instant::now() + work_budget(allowed)
}

/// A `grpc-timeout` value: one to eight digits and a unit (H, M, S, m, u, n), as the gRPC
/// over HTTP/2 specification writes it; `None` for anything else.
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let unit = value.chars().last()?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(amount.checked_mul(3600)?),
        'M' => Duration::from_secs(amount.checked_mul(60)?),
        'S' => Duration::from_secs(amount),
        'm' => Duration::from_millis(amount),
        'u' => Duration::from_micros(amount),
        'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// Accepted connections with TCP_NODELAY: a reply written in more than one piece (headers,
/// then body) otherwise waits for the client's delayed ACK, ~40 ms per call on Linux.
/// tonic's own `tcp_nodelay` setting does not apply to `serve_with_incoming`.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// How long a client waits for a TCP connection to a service.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A lazily connecting channel to `addr` (`http://host:port`, or `https://host:port` with the
/// process's mutual TLS, [`crate::tls`]). A host given by name is looked up again every few
/// seconds and calls spread over every address it lists, so the replicas of a lane behind a
/// headless Kubernetes Service share its calls ([`crate::balance`]); an IP address (every
/// `kgmesh up` address) is one plain connection.
pub fn channel(addr: &str) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    channel_for(addr, crate::tls::installed())
}

/// [`channel`] with `tls` instead of the process's (tests and benches).
pub fn channel_for(
    addr: &str,
    tls: Option<&ClusterTls>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(addr.to_owned())?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    // Without the process's TLS an https:// channel fails every call, as it should: the
    // services check their addresses against `[cluster.tls]` before they start.
    let client_tls = match (endpoint.uri().scheme_str(), tls) {
        (Some("https"), Some(tls)) => Some(tls.client.clone()),
        _ => None,
    };
    if let Some(client_tls) = &client_tls {
        endpoint = endpoint.tls_config(client_tls.clone())?;
    }
    if let (Some((host, port)), Ok(_)) = (
        crate::balance::dns_host(&endpoint),
        tokio::runtime::Handle::try_current(),
    ) {
        // Each pod is dialled by address; its certificate is still checked against the name.
        let client_tls = client_tls.map(|config| config.domain_name(host.clone()));
        let resolve = move || crate::balance::lookup(host.clone(), port);
        return Ok(crate::balance::balanced(
            endpoint,
            client_tls,
            resolve,
            crate::balance::RESOLVE_EVERY,
        ));
    }
    Ok(endpoint.connect_lazy())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use futures::StreamExt as _;

    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_specification_writes_them() {
        assert_eq!(
            parse_grpc_timeout("20000000u"),
            Some(Duration::from_secs(20))
        );
        assert_eq!(
            parse_grpc_timeout("1500m"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        for bad in ["", "m", "123456789m", "12x", "-1S", "1.5S", "١S", "1١"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_time_allowed_is_the_callers_deadline_within_the_servers() {
        let mut request = tonic::Request::new(());
        assert_eq!(time_allowed(&request), REQUEST_TIMEOUT, "no deadline sent");
        request.set_timeout(Duration::from_secs(2));
        assert_eq!(time_allowed(&request), Duration::from_secs(2));
        request.set_timeout(Duration::from_secs(600));
        assert_eq!(
            time_allowed(&request),
            REQUEST_TIMEOUT,
            "the server's bound wins"
        );
        request
            .metadata_mut()
            .insert("grpc-timeout", "soon".parse().unwrap());
        assert_eq!(
            time_allowed(&request),
            REQUEST_TIMEOUT,
            "unparsable: ignored"
        );
    }

    /// A health server on 127.0.0.1 behind `tls`.
    async fn health_server(tls: &ClusterTls, shutdown: CancellationToken) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (_reporter, health) = tonic_health::server::health_reporter();
        let server = server_for(Some(tls)).unwrap().add_service(health);
        tokio::spawn(
            server.serve_with_incoming_shutdown(incoming(listener), shutdown.cancelled_owned()),
        );
        port
    }

    async fn health(addr: &str, tls: Option<&ClusterTls>) -> Result<(), tonic::Status> {
        use tonic_health::pb::HealthCheckRequest;
        use tonic_health::pb::health_client::HealthClient;
        let mut client = HealthClient::new(channel_for(addr, tls).unwrap());
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        request.set_timeout(Duration::from_secs(5));
        client.check(request).await.map(drop)
    }

    #[tokio::test]
    async fn services_with_tls_talk_only_to_peers_holding_a_certificate_from_their_ca() {
        use crate::tls::testing::{Authority, write};
        use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::new("kgmesh services");
        let load = |files| ClusterTls::load(&files).unwrap();
        // Named for `localhost` only: a peer dialling 127.0.0.1 by name is checked against it.
        let (cert, key) = ca.leaf(&["localhost"], &[ServerAuth, ClientAuth]);
        let service = load(write(dir.path(), "service", &ca.pem, &cert, &key));
        let shutdown = CancellationToken::new();
        let port = health_server(&service, shutdown.clone()).await;

        // A peer with its own certificate from the CA, dialling a name the certificate holds
        // (looked up and balanced, so each address is dialled under that name).
        let peer = load(ca.service_files(dir.path(), "peer"));
        health(&format!("https://localhost:{port}"), Some(&peer))
            .await
            .unwrap();

        // Plaintext, no client certificate, a certificate from another CA, or a name the
        // server's certificate does not hold: every call fails.
        let plain = health(&format!("http://127.0.0.1:{port}"), None).await;
        assert!(plain.is_err(), "plaintext call answered");
        let anonymous = ClusterTls {
            server: peer.server.clone(),
            client: tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem)),
        };
        let refused = health(&format!("https://localhost:{port}"), Some(&anonymous)).await;
        assert!(
            refused.is_err(),
            "a client without a certificate was served"
        );
        let other = Authority::new("someone else");
        let (foreign_cert, foreign_key) = other.leaf(&["localhost"], &[ServerAuth, ClientAuth]);
        let stranger = ClusterTls {
            server: peer.server.clone(),
            client: tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem))
                .identity(tonic::transport::Identity::from_pem(
                    foreign_cert,
                    foreign_key,
                )),
        };
        let refused = health(&format!("https://localhost:{port}"), Some(&stranger)).await;
        assert!(refused.is_err(), "a client from another CA was served");
        let by_address = health(&format!("https://127.0.0.1:{port}"), Some(&peer)).await;
        assert!(
            by_address.is_err(),
            "the server's certificate does not name 127.0.0.1"
        );
        shutdown.cancel();
    }

    #[tokio::test]
    async fn accepted_connections_have_tcp_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut accepted = incoming(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let stream = accepted.next().await.unwrap().unwrap();
        assert!(stream.nodelay().unwrap());
    }
}
