//! The one gRPC server stack every service runs: standard health service,
//! caller-context verification, request metrics, a per-request timeout, and mutual TLS
//! when the process has it; and the client channels services call each other over.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};
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

/// Answers whether the store a service cannot serve without is reachable (see
/// [`serve_probed`]). It must not log the store's error: the watcher logs the transition.
pub type StoreProbe =
    std::sync::Arc<dyn Fn() -> futures::future::BoxFuture<'static, bool> + Send + Sync>;

/// How often a store probe runs.
const STORE_PROBE_EVERY: Duration = Duration::from_secs(5);
/// How long one probe may take before the store counts as unreachable.
const STORE_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Serves `routes` (one or more tonic services) on `listener` until `shutdown`
/// fires, with the health service reporting SERVING for `service_names`.
pub async fn serve(
    listener: TcpListener,
    caller_layer: CallerContextLayer,
    routes: Routes,
    service_names: &[&str],
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    serve_probed(
        listener,
        caller_layer,
        routes,
        service_names,
        None,
        shutdown,
    )
    .await
}

/// [`serve`], with `service_names` NOT_SERVING while `probe` says the service's store is
/// unreachable, so whoever routes by health (the gateway's `/ready` for auth, a load
/// balancer) sends no calls that can only fail. The server as a whole (`""`) stays
/// SERVING: the process is alive, and restarting it would not bring the store back.
pub async fn serve_probed(
    listener: TcpListener,
    caller_layer: CallerContextLayer,
    routes: Routes,
    service_names: &[&str],
    probe: Option<StoreProbe>,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    for name in service_names {
        reporter
            .set_service_status(*name, ServingStatus::Serving)
            .await;
    }
    if let Some(probe) = probe {
        let names = service_names.iter().map(|n| (*n).to_owned()).collect();
        tokio::spawn(watch_store(
            reporter,
            names,
            probe,
            STORE_PROBE_EVERY,
            shutdown.clone(),
        ));
    }
    let routes = routes.add_service(health_service);
    let service_label = service_names
        .first()
        .copied()
        .unwrap_or("unknown")
        .to_owned();
    let connections = incoming(listener, &shutdown);
    tonic::transport::Server::builder()
        .timeout(REQUEST_TIMEOUT)
        .layer(GrpcMetricsLayer::new(service_label))
        .layer(caller_layer)
        .add_routes(routes)
        .serve_with_incoming_shutdown(connections, shutdown.cancelled_owned())
        .await?;
    Ok(())
}

/// Runs `probe` every `every` and sets `names` SERVING or NOT_SERVING when the answer
/// changes, logging each change once.
async fn watch_store(
    reporter: tonic_health::server::HealthReporter,
    names: Vec<String>,
    probe: StoreProbe,
    every: Duration,
    shutdown: CancellationToken,
) {
    let service = names.first().cloned().unwrap_or_default();
    let mut serving = true;
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let reachable = tokio::time::timeout(STORE_PROBE_TIMEOUT, probe())
            .await
            .unwrap_or(false);
        if reachable == serving {
            continue;
        }
        serving = reachable;
        let status = if reachable {
            tracing::info!(%service, "store reachable again: health answers SERVING");
            ServingStatus::Serving
        } else {
            tracing::warn!(
                %service,
                "store unreachable: health answers NOT_SERVING until it answers again"
            );
            ServingStatus::NotServing
        };
        for name in &names {
            reporter.set_service_status(name, status).await;
        }
    }
}

/// The connections a gRPC server accepts on `listener`: TLS-handshaken with the process's
/// mutual TLS when it has one ([`crate::tls::install`]), plain otherwise; TCP_NODELAY either
/// way. Every gRPC server a service runs is served from here, so none can skip the TLS the
/// process was given. Needs a tokio runtime; accepting stops with `shutdown`.
pub fn incoming(listener: TcpListener, shutdown: &CancellationToken) -> Incoming {
    incoming_for(listener, crate::tls::installed(), shutdown)
}

/// [`incoming`] with `tls` instead of the process's (tests and benches).
pub fn incoming_for(
    listener: TcpListener,
    tls: Option<&ClusterTls>,
    shutdown: &CancellationToken,
) -> Incoming {
    match tls {
        Some(tls) => {
            let tls = tls.clone();
            Incoming::Tls(crate::tls::accept_tls(
                listener,
                move || tls.acceptor(),
                "cluster",
                shutdown.child_token(),
            ))
        }
        // tonic's own `tcp_nodelay` setting does not apply to `serve_with_incoming`.
        None => Incoming::Plain(TcpIncoming::from(listener).with_nodelay(Some(true))),
    }
}

/// Accepted connections for `Server::serve_with_incoming` ([`incoming`]).
pub enum Incoming {
    /// Plain HTTP/2.
    Plain(TcpIncoming),
    /// Handshaken with the service certificates.
    Tls(crate::tls::HandshakenConnections),
}

impl Stream for Incoming {
    type Item = io::Result<Connection>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp)
                .poll_next(cx)
                .map(|next| next.map(|accepted| accepted.map(Connection::Plain))),
            Self::Tls(handshaken) => Pin::new(handshaken)
                .poll_next(cx)
                .map(|next| next.map(|(stream, _peer)| Ok(Connection::Tls(Box::new(stream))))),
        }
    }
}

/// One accepted connection, in clear or in TLS.
pub enum Connection {
    /// Plain HTTP/2.
    Plain(TcpStream),
    /// Handshaken with the service certificates.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Connected for Connection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            Self::Plain(tcp) => tcp.connect_info(),
            Self::Tls(tls) => tls.get_ref().0.connect_info(),
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(tcp) => tcp.is_write_vectored(),
            Self::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
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

/// How long a client waits for a TCP connection to a service.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A lazily connecting channel to `addr` (`http://host:port`, or `https://host:port` with the
/// process's mutual TLS, [`crate::tls`]). A host given by name is looked up again every few
/// seconds and calls spread over every address it lists, so the replicas of a lane behind a
/// headless Kubernetes Service share its calls ([`crate::balance`]); an IP address (every
/// `kgmesh up` address) is one plain connection. An `https://` channel dials again with the
/// new certificates after each reload.
pub fn channel(addr: &str) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    channel_for(addr, crate::tls::installed())
}

/// [`channel`] with `tls` instead of the process's (tests and benches).
pub fn channel_for(
    addr: &str,
    tls: Option<&ClusterTls>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    use crate::balance::{BalancedTls, balanced, dns_host, ip_address, lookup};
    let endpoint = tonic::transport::Endpoint::from_shared(addr.to_owned())?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    // Without the process's TLS an https:// channel fails every call, as it should: the
    // services check their addresses against `[cluster.tls]` before they start.
    let tls = match (endpoint.uri().scheme_str(), tls) {
        (Some("https"), Some(tls)) => Some(tls),
        _ => None,
    };
    if tokio::runtime::Handle::try_current().is_ok() {
        if let Some((host, port)) = dns_host(&endpoint) {
            // Each pod is dialled by address; its certificate is still checked against the name.
            let tls = tls.map(|cluster| BalancedTls {
                cluster: cluster.clone(),
                server_name: Some(host.clone()),
            });
            let resolve = move || lookup(host.clone(), port);
            return Ok(balanced(
                endpoint,
                tls,
                resolve,
                crate::balance::RESOLVE_EVERY,
            ));
        }
        if let (Some(cluster), Some(address)) = (tls, ip_address(&endpoint)) {
            // One address, balanced all the same: the balancer is what re-dials it with
            // renewed certificates.
            let tls = BalancedTls {
                cluster: cluster.clone(),
                server_name: None,
            };
            let resolve = move || std::future::ready(Ok(vec![address]));
            return Ok(balanced(
                endpoint,
                Some(tls),
                resolve,
                crate::balance::RESOLVE_EVERY,
            ));
        }
    }
    match tls {
        Some(cluster) => Ok(endpoint.tls_config(cluster.client())?.connect_lazy()),
        None => Ok(endpoint.connect_lazy()),
    }
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
        serve_health(listener, tls, shutdown);
        port
    }

    fn serve_health(listener: TcpListener, tls: &ClusterTls, shutdown: CancellationToken) {
        let (_reporter, health) = tonic_health::server::health_reporter();
        let connections = incoming_for(listener, Some(tls), &shutdown);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_incoming_shutdown(connections, shutdown.cancelled_owned()),
        );
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
    async fn a_service_is_not_serving_while_its_store_is_unreachable_and_serving_again_after() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        use tonic_health::pb::HealthCheckRequest;
        use tonic_health::pb::health_check_response::ServingStatus as Answer;
        use tonic_health::pb::health_client::HealthClient;

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("kg.v1.Auth", ServingStatus::Serving)
            .await;
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_incoming_shutdown(
                    incoming(listener, &shutdown),
                    shutdown.clone().cancelled_owned(),
                ),
        );
        let store_up = Arc::new(AtomicBool::new(true));
        let probe: StoreProbe = {
            let store_up = store_up.clone();
            Arc::new(move || {
                let up = store_up.load(Ordering::SeqCst);
                Box::pin(async move { up })
            })
        };
        tokio::spawn(watch_store(
            reporter,
            vec!["kg.v1.Auth".to_owned()],
            probe,
            Duration::from_millis(20),
            shutdown.clone(),
        ));
        let mut client = HealthClient::new(channel(&addr).unwrap());
        let mut status_of = async |service: &str| {
            let request = HealthCheckRequest {
                service: service.to_owned(),
            };
            client.check(request).await.unwrap().into_inner().status()
        };
        let mut wait_for = async |want: Answer| {
            for _ in 0..200 {
                if status_of("kg.v1.Auth").await == want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("health never answered {want:?}");
        };
        wait_for(Answer::Serving).await;
        store_up.store(false, Ordering::SeqCst);
        wait_for(Answer::NotServing).await;
        store_up.store(true, Ordering::SeqCst);
        wait_for(Answer::Serving).await;
        // The process stays alive for liveness probes whatever its store does.
        store_up.store(false, Ordering::SeqCst);
        wait_for(Answer::NotServing).await;
        assert_eq!(status_of("").await, Answer::Serving);
        shutdown.cancel();
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
        let anonymous = peer.with_client(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem)),
        );
        let refused = health(&format!("https://localhost:{port}"), Some(&anonymous)).await;
        assert!(
            refused.is_err(),
            "a client without a certificate was served"
        );
        let other = Authority::new("someone else");
        let (foreign_cert, foreign_key) = other.leaf(&["localhost"], &[ServerAuth, ClientAuth]);
        let stranger = peer.with_client(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem))
                .identity(tonic::transport::Identity::from_pem(
                    foreign_cert,
                    foreign_key,
                )),
        );
        let refused = health(&format!("https://localhost:{port}"), Some(&stranger)).await;
        assert!(refused.is_err(), "a client from another CA was served");
        let by_address = health(&format!("https://127.0.0.1:{port}"), Some(&peer)).await;
        assert!(
            by_address.is_err(),
            "the server's certificate does not name 127.0.0.1"
        );
        // The server saw each refusal too: counted (plaintext, no certificate, another CA;
        // the wrong name is refused by the client, after the server's side succeeded).
        let failed = || {
            crate::metrics::metrics()
                .tls_handshakes_failed
                .get_or_create(&crate::metrics::CertificateLabels {
                    certificate: "cluster".to_owned(),
                })
                .get()
        };
        // The server counts on its handshake task, which may finish just after the client
        // saw the connection close.
        for _ in 0..200 {
            if failed() >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(failed() >= 3, "{} failed handshakes counted", failed());
        shutdown.cancel();
    }

    #[tokio::test]
    async fn accepted_connections_have_tcp_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut accepted = incoming_for(listener, None, &CancellationToken::new());
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let Connection::Plain(stream) = accepted.next().await.unwrap().unwrap() else {
            panic!("a plain connection without TLS");
        };
        assert!(stream.nodelay().unwrap());
    }

    /// A health client on one channel, kept across calls.
    struct HealthChecks(tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>);

    impl HealthChecks {
        fn new(addr: &str, tls: &ClusterTls) -> Self {
            Self(tonic_health::pb::health_client::HealthClient::new(
                channel_for(addr, Some(tls)).unwrap(),
            ))
        }

        async fn check(&self) -> Result<(), tonic::Status> {
            let mut request = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            });
            request.set_timeout(Duration::from_secs(5));
            self.0.clone().check(request).await.map(drop)
        }

        /// Calls until an answer comes, for up to 10 s: a reload is checked every 50 ms, and
        /// a loaded machine may run it late.
        async fn answer_within(&self) {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                match self.check().await {
                    Ok(()) => return,
                    Err(status) => assert!(
                        tokio::time::Instant::now() < deadline,
                        "no answer after the renewal: {status:?}"
                    ),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// A health server on 127.0.0.1:`port` (a port a stopped server held) behind `tls`.
    async fn health_server_at(port: u16, tls: &ClusterTls, shutdown: CancellationToken) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", port)).await {
                Ok(listener) => break listener,
                Err(err) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "port {port} not free again: {err}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        serve_health(listener, tls, shutdown);
    }

    #[tokio::test]
    async fn renewed_certificates_from_a_new_ca_are_taken_up_on_both_sides_without_a_restart() {
        use crate::tls::testing::Authority;
        let dir = tempfile::tempdir().unwrap();
        let first_ca = Authority::new("kgmesh services, first CA");
        let server_files = first_ca.service_files(dir.path(), "server");
        let server_tls = ClusterTls::load(&server_files).unwrap();
        let client_tls = ClusterTls::load(&first_ca.service_files(dir.path(), "client")).unwrap();
        let every = Duration::from_millis(50);
        let watching = CancellationToken::new();
        server_tls.spawn_reload(every, watching.clone());
        client_tls.spawn_reload(every, watching.clone());
        let serving = CancellationToken::new();
        let port = health_server(&server_tls, serving.clone()).await;
        // Dialled by name (looked up and balanced) and by address (one connection).
        let by_name = HealthChecks::new(&format!("https://localhost:{port}"), &client_tls);
        let by_address = HealthChecks::new(&format!("https://127.0.0.1:{port}"), &client_tls);
        by_name.check().await.unwrap();
        by_address.check().await.unwrap();

        // The CA is rotated: both processes' files now hold certificates from a new CA, and
        // that CA alone is trusted.
        let second_ca = Authority::new("kgmesh services, second CA");
        second_ca.service_files(dir.path(), "server");
        second_ca.service_files(dir.path(), "client");
        // A peer holding only the new CA's certificate is served once the server reloads.
        let newcomer = ClusterTls::load(&second_ca.service_files(dir.path(), "newcomer")).unwrap();
        HealthChecks::new(&format!("https://localhost:{port}"), &newcomer)
            .answer_within()
            .await;

        // The server stops and starts again on the same port with its reloaded certificates,
        // so no connection made before the rotation survives: the channels made before it
        // answer only if they dial with the client's renewed certificate.
        serving.cancel();
        let serving = CancellationToken::new();
        health_server_at(port, &server_tls, serving.clone()).await;
        by_name.answer_within().await;
        by_address.answer_within().await;

        // A renewal that does not load (a key that is not the certificate's) is not taken:
        // the certificates in use keep serving.
        let stray = Authority::new("stray").service_files(dir.path(), "stray");
        std::fs::copy(&stray.key_file, &server_files.key_file).unwrap();
        tokio::time::sleep(every * 6).await;
        let text = server_tls.reload().unwrap_err().to_string();
        assert!(text.starts_with("cluster.tls.key_file:"), "{text}");
        HealthChecks::new(&format!("https://localhost:{port}"), &newcomer)
            .check()
            .await
            .unwrap();
        serving.cancel();
        watching.cancel();
    }
}
