//! Client-side load balancing for service-to-service gRPC. One HTTP/2 connection carries every
//! call, so behind a plain Kubernetes Service a gateway would stick to whichever retrieval pod
//! it reached first, and the lane's new replicas would idle. A name that resolves to several
//! addresses (a headless Service lists its ready pods) is looked up again every few seconds,
//! and calls spread over what it lists (tower's power-of-two-choices on pending calls).
//! Channels with the service certificates are balanced even to one address: when the
//! certificates are reloaded, the balancer replaces each address's connection with one dialled
//! under the new certificates (the old one finishes the calls already on it).

use std::collections::HashSet;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tonic::transport::channel::Change;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::tls::ClusterTls;

/// How often a balanced name is looked up again (new pods join within this).
pub const RESOLVE_EVERY: Duration = Duration::from_secs(5);

/// Whether `endpoint` names a host by DNS (balanced) rather than an IP literal.
pub(crate) fn dns_host(endpoint: &Endpoint) -> Option<(String, u16)> {
    let uri = endpoint.uri();
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return None;
    }
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    if host.parse::<IpAddr>().is_ok() {
        return None;
    }
    Some((host.to_owned(), uri.port_u16().unwrap_or(80)))
}

/// The address `endpoint` names when its host is an IP literal.
pub(crate) fn ip_address(endpoint: &Endpoint) -> Option<SocketAddr> {
    let uri = endpoint.uri();
    let default_port = match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    };
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let ip = host.parse::<IpAddr>().ok()?;
    Some(SocketAddr::new(ip, uri.port_u16().unwrap_or(default_port)))
}

/// The certificates a balanced channel dials with, followed across reloads.
pub(crate) struct BalancedTls {
    pub(crate) cluster: ClusterTls,
    /// The name each address's certificate is checked against, when the channel was given a
    /// host name rather than an address.
    pub(crate) server_name: Option<String>,
}

impl BalancedTls {
    fn config(&self) -> ClientTlsConfig {
        let config = self.cluster.client();
        match &self.server_name {
            Some(name) => config.domain_name(name.clone()),
            None => config,
        }
    }
}

/// A channel over every address `resolve` lists, refreshed every `every` for as long as the
/// channel lives; with `tls` when the template is `https`, every address re-dialled after each
/// reload of its certificates. Needs a tokio runtime.
pub(crate) fn balanced<R, F>(
    template: Endpoint,
    tls: Option<BalancedTls>,
    resolve: R,
    every: Duration,
) -> Channel
where
    R: Fn() -> F + Send + 'static,
    F: Future<Output = io::Result<Vec<SocketAddr>>> + Send,
{
    let (channel, changes) = Channel::balance_channel::<SocketAddr>(64);
    tokio::spawn(async move {
        let mut reloads = tls.as_ref().map(|tls| tls.cluster.subscribe());
        let mut current: HashSet<SocketAddr> = HashSet::new();
        let mut reloaded = false;
        loop {
            let found = match resolve().await {
                Ok(found) => one_family(found),
                // A failed lookup keeps the addresses already known.
                Err(err) => {
                    tracing::debug!(host = ?template.uri().host(), error = %err, "lookup failed");
                    current.clone()
                }
            };
            for gone in current.difference(&found) {
                if changes.send(Change::Remove(*gone)).await.is_err() {
                    return;
                }
            }
            let config = tls.as_ref().map(BalancedTls::config);
            for addr in &found {
                // An address already known keeps its connection unless the certificates were
                // reloaded: then the new connection replaces it.
                if current.contains(addr) && !reloaded {
                    continue;
                }
                let Ok(endpoint) = endpoint_at(&template, config.as_ref(), *addr) else {
                    continue;
                };
                if changes.send(Change::Insert(*addr, endpoint)).await.is_err() {
                    return;
                }
            }
            current = found;
            reloaded = false;
            tokio::select! {
                _ = changes.closed() => return,
                _ = tokio::time::sleep(every) => {}
                () = reload(&mut reloads) => reloaded = true,
            }
        }
    });
    channel
}

/// Waits for the next reload of the certificates being followed; never finishes without
/// certificates (or once they can reload no more, which `BalancedTls` holding them rules out).
async fn reload<T>(reloads: &mut Option<tokio::sync::watch::Receiver<T>>) {
    if let Some(reloads) = reloads
        && reloads.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// The IPv4 addresses when there are any, else the IPv6 ones: `localhost` lists 127.0.0.1 and
/// ::1, and a service listening on 0.0.0.0 (the default) would fail every call sent to ::1.
fn one_family(found: Vec<SocketAddr>) -> HashSet<SocketAddr> {
    let any_v4 = found.iter().any(SocketAddr::is_ipv4);
    found
        .into_iter()
        .filter(|addr| addr.is_ipv4() == any_v4)
        .collect()
}

/// `template`'s settings aimed at one address; requests still name the original host.
fn endpoint_at(
    template: &Endpoint,
    tls: Option<&ClientTlsConfig>,
    addr: SocketAddr,
) -> Result<Endpoint, tonic::transport::Error> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))?
        .origin(template.uri().clone())
        .connect_timeout(super::grpc::CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    match tls {
        Some(tls) => endpoint.tls_config(tls.clone()),
        None => Ok(endpoint),
    }
}

/// Looks `host:port` up through the system resolver.
pub(crate) async fn lookup(host: String, port: u16) -> io::Result<Vec<SocketAddr>> {
    Ok(tokio::net::lookup_host((host.as_str(), port))
        .await?
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use tokio::net::TcpListener;
    use tokio_util::sync::CancellationToken;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    use super::*;

    /// A health server on `ip:port` that counts the calls it answers.
    async fn counting_server(
        ip: [u8; 4],
        port: u16,
        shutdown: CancellationToken,
    ) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind(SocketAddr::from((ip, port)))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let (_reporter, health) = tonic_health::server::health_reporter();
        let count = tower::layer::layer_fn(move |inner| Counting {
            inner,
            calls: counted.clone(),
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .layer(count)
                .add_service(health)
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener),
                    shutdown.cancelled_owned(),
                ),
        );
        (addr, calls)
    }

    #[derive(Clone)]
    struct Counting<S> {
        inner: S,
        calls: Arc<AtomicUsize>,
    }

    impl<S, B> tower::Service<http::Request<B>> for Counting<S>
    where
        S: tower::Service<http::Request<B>>,
    {
        type Response = S::Response;
        type Error = S::Error;
        type Future = S::Future;

        fn poll_ready(
            &mut self,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, request: http::Request<B>) -> Self::Future {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.inner.call(request)
        }
    }

    async fn check(client: &mut HealthClient<Channel>) {
        client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn calls_spread_over_every_address_and_follow_the_name_as_it_changes() {
        let shutdown = CancellationToken::new();
        // Two replicas on one port, as two pods behind a headless Service.
        let (first, first_calls) = counting_server([127, 0, 0, 1], 0, shutdown.clone()).await;
        let (second, second_calls) =
            counting_server([127, 0, 0, 2], first.port(), shutdown.clone()).await;
        let listed = Arc::new(Mutex::new(vec![first, second]));
        let resolver = listed.clone();
        let template = Endpoint::from_shared(format!("http://lane.test:{}", first.port())).unwrap();
        let channel = balanced(
            template,
            None,
            move || {
                let found = resolver.lock().unwrap().clone();
                async move { Ok(found) }
            },
            Duration::from_millis(50),
        );
        let mut client = HealthClient::new(channel);
        for _ in 0..40 {
            check(&mut client).await;
        }
        let (a, b) = (
            first_calls.load(Ordering::SeqCst),
            second_calls.load(Ordering::SeqCst),
        );
        assert_eq!(a + b, 40);
        assert!(a >= 5 && b >= 5, "calls did not spread: {a} and {b}");

        // The second replica leaves the name: after the next lookup it gets nothing.
        listed.lock().unwrap().retain(|addr| *addr == first);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = second_calls.load(Ordering::SeqCst);
        for _ in 0..20 {
            check(&mut client).await;
        }
        assert_eq!(second_calls.load(Ordering::SeqCst), before);
        shutdown.cancel();
    }

    #[test]
    fn only_names_are_balanced() {
        let at = |addr: &str| dns_host(&Endpoint::from_shared(addr.to_owned()).unwrap());
        assert_eq!(
            at("http://kgmesh-retrieval:7103"),
            Some(("kgmesh-retrieval".to_owned(), 7103))
        );
        assert_eq!(at("http://127.0.0.1:7103"), None);
        assert_eq!(at("http://[::1]:7103"), None);
        assert_eq!(
            at("https://retrieval.example:443"),
            Some(("retrieval.example".to_owned(), 443))
        );
        assert_eq!(at("https://10.0.0.7:7103"), None);
        let mixed: Vec<SocketAddr> = vec![
            "[::1]:1".parse().unwrap(),
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.2:1".parse().unwrap(),
        ];
        assert!(one_family(mixed.clone()).iter().all(SocketAddr::is_ipv4));
        assert_eq!(one_family(mixed).len(), 2);
        assert_eq!(one_family(vec!["[::1]:1".parse().unwrap()]).len(), 1);
    }
}
